// The stand-in: see include/parity/standin.hpp. Bit-exact with conformance/formats/workload.py.
#include "parity/standin.hpp"

#include <blake2.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace parity::standin {

namespace {

// value as 8 bytes little-endian, two's complement (Python: to_bytes(8, "little", signed=True)).
void put_le(std::string& out, std::uint64_t value) {
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

class Hasher {
  public:
    explicit Hasher(const char* person) {
        blake2b_param p;
        std::memset(&p, 0, sizeof p);
        p.digest_length = 8;
        p.fanout = 1;
        p.depth = 1;
        std::size_t n = std::strlen(person);
        if (n > sizeof p.personal) throw std::invalid_argument("personalization longer than 16 bytes");
        std::memcpy(p.personal, person, n);
        if (blake2b_init_param(&state_, &p) != 0) throw std::runtime_error("blake2b_init_param failed");
    }
    void update(const std::string& bytes) {
        blake2b_update(&state_, reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
    }
    void update_le(std::uint64_t value) {
        std::string b;
        put_le(b, value);
        update(b);
    }
    std::uint64_t digest() {
        std::uint8_t out[8];
        if (blake2b_final(&state_, out, sizeof out) != 0) throw std::runtime_error("blake2b_final failed");
        std::uint64_t v = 0;
        for (int i = 7; i >= 0; --i) v = (v << 8) | out[i];
        return v;
    }

  private:
    blake2b_state state_;
};

std::uint64_t modulo(std::uint64_t digest, std::int64_t vocab_size) {
    if (vocab_size < 1) throw std::invalid_argument("vocab_size must be at least 1");
    return digest % static_cast<std::uint64_t>(vocab_size);
}

}  // namespace

std::uint64_t blake2b64(const std::string& person, const std::vector<std::string>& parts) {
    Hasher h(person.c_str());
    for (const auto& part : parts) h.update(part);
    return h.digest();
}

Token target_next(std::uint64_t seed, const Tokens& tokens, std::int64_t vocab_size) {
    Hasher h("parity-target");
    h.update_le(seed);
    h.update_le(static_cast<std::uint64_t>(tokens.size()));
    std::size_t start = tokens.size() > kContext ? tokens.size() - kContext : 0;
    for (std::size_t i = start; i < tokens.size(); ++i) h.update_le(static_cast<std::uint64_t>(tokens[i]));
    return static_cast<Token>(modulo(h.digest(), vocab_size));
}

Tokens prompt_tokens(std::uint64_t seed, const std::string& req_id, std::int64_t n, std::int64_t vocab_size) {
    Tokens out;
    out.reserve(n > 0 ? static_cast<std::size_t>(n) : 0);
    for (std::int64_t i = 0; i < n; ++i) {
        Hasher h("parity-prompt");
        h.update_le(seed);
        h.update_le(static_cast<std::uint64_t>(i));
        h.update(req_id);  // std::string holds the id's UTF-8 bytes as received
        out.push_back(static_cast<Token>(modulo(h.digest(), vocab_size)));
    }
    return out;
}

Tokens prefix_tokens(std::uint64_t seed, const std::string& name, std::int64_t n, std::int64_t vocab_size) {
    return prompt_tokens(seed, "prefix/" + name, n, vocab_size);
}

std::optional<std::string> check_stop(const Tokens& tokens, std::size_t num_prompt, std::int64_t max_tokens,
                                      const Stops& stops, std::int64_t max_model_len) {
    const auto num_output = static_cast<std::int64_t>(tokens.size() - num_prompt);
    if (num_output < stops.min_tokens) return std::nullopt;
    const Token last = tokens.back();
    if (stops.eos_token_id && last == *stops.eos_token_id) return "stop";
    if (std::find(stops.stop_token_ids.begin(), stops.stop_token_ids.end(), last) != stops.stop_token_ids.end())
        return "stop";
    if ((max_model_len > 0 && static_cast<std::int64_t>(tokens.size()) >= max_model_len) || num_output >= max_tokens)
        return "length";
    if (stops.repetition && repeats(tokens, num_prompt, *stops.repetition)) return "repetition";
    return std::nullopt;
}

bool repeats(const Tokens& tokens, std::size_t num_prompt, const Repetition& r) {
    const std::int64_t low = std::max<std::int64_t>(r.min_pattern_size, 1);
    if (r.max_pattern_size <= 0 || r.min_count < 2 || low > r.max_pattern_size) return false;
    const auto num_output = static_cast<std::int64_t>(tokens.size() - num_prompt);
    const auto at = [&](std::int64_t back) { return tokens[tokens.size() - static_cast<std::size_t>(back)]; };
    for (std::int64_t size = low; size <= r.max_pattern_size; ++size) {
        if (size * r.min_count > num_output) return false;
        bool all = true;
        for (std::int64_t n = 1; all && n <= size; ++n)
            for (std::int64_t m = 1; all && m < r.min_count; ++m) all = at(size * m + n) == at(n);
        if (all) return true;
    }
    return false;
}

Tokens expected_output(std::uint64_t seed, const Tokens& prompt, std::int64_t max_tokens, const Stops& stops,
                       std::int64_t max_model_len, std::int64_t vocab_size) {
    Tokens context = prompt;
    for (;;) {
        context.push_back(target_next(seed, context, vocab_size));
        if (check_stop(context, prompt.size(), max_tokens, stops, max_model_len))
            return Tokens(context.begin() + static_cast<std::ptrdiff_t>(prompt.size()), context.end());
    }
}

Tokens draft(std::uint64_t seed, const Tokens& tokens, std::int64_t k, std::int64_t accept, std::int64_t vocab_size) {
    Tokens context = tokens;
    Tokens out;
    for (std::int64_t i = 0; i < k; ++i) {
        Token truth = target_next(seed, context, vocab_size);
        Token token = i < accept ? truth : (truth + 1) % vocab_size;
        out.push_back(token);
        context.push_back(token);
    }
    return out;
}

Tokens verify(std::uint64_t seed, const Tokens& tokens, const Tokens& drafts, std::int64_t vocab_size) {
    Tokens context = tokens;
    Tokens out;
    for (Token proposed : drafts) {
        Token truth = target_next(seed, context, vocab_size);
        out.push_back(truth);
        if (proposed != truth) return out;
        context.push_back(truth);
    }
    out.push_back(target_next(seed, context, vocab_size));
    return out;
}

}  // namespace parity::standin
