// Reproduces the Python stand-in's vectors (tests/gen_vectors.py) with the C++ stand-in.
// Usage: check_vectors VECTORS.jsonl   -> prints "<n> cases, <m> mismatches"; exit 1 on any
// mismatch (the first few are printed), 2 on unreadable input.
#include <cstdio>
#include <iostream>

#include "parity/protocol.hpp"
#include "parity/standin.hpp"

using parity::json;
namespace st = parity::standin;

// A case's repetition_detection: {"max_pattern_size", "min_pattern_size", "min_count"}.
st::Repetition repetition(const json& r) {
    return {r.at("max_pattern_size").get<std::int64_t>(), r.at("min_pattern_size").get<std::int64_t>(),
            r.at("min_count").get<std::int64_t>()};
}

// A case's stop conditions: stop_token_ids, and min_tokens, eos_token_id, repetition (each
// optional, null or absent when the request has none).
st::Stops stops(const json& c) {
    st::Stops out;
    out.stop_token_ids = c.at("stop_token_ids").get<std::vector<std::int64_t>>();
    out.min_tokens = c.value("min_tokens", std::int64_t{0});
    if (c.contains("eos_token_id") && !c.at("eos_token_id").is_null())
        out.eos_token_id = c.at("eos_token_id").get<std::int64_t>();
    if (c.contains("repetition") && !c.at("repetition").is_null()) out.repetition = repetition(c.at("repetition"));
    return out;
}

int main(int argc, char** argv) {
    if (argc != 2) {
        std::cerr << "usage: check_vectors VECTORS.jsonl\n";
        return 2;
    }
    std::FILE* in = std::fopen(argv[1], "rb");
    if (!in) {
        std::cerr << "check_vectors: cannot open " << argv[1] << "\n";
        return 2;
    }
    parity::LineReader reader(in, 16u * 1024u * 1024u);
    std::string line;
    std::size_t length = 0, cases = 0, mismatches = 0;
    std::map<std::string, std::size_t> per_fn;
    for (;;) {
        auto status = reader.next(line, length);
        if (status == parity::LineReader::Status::eof) break;
        if (status == parity::LineReader::Status::too_long) {
            std::cerr << "check_vectors: line too long\n";
            return 2;
        }
        json c;
        try {
            c = json::parse(line);
        } catch (const json::exception& exc) {
            std::cerr << "check_vectors: bad line " << cases + 1 << ": " << exc.what() << "\n";
            return 2;
        }
        const std::string fn = c.at("fn").get<std::string>();
        const std::uint64_t seed = c.at("seed").get<std::uint64_t>();
        const std::int64_t vocab = c.at("vocab").get<std::int64_t>();
        json got;
        if (fn == "target_next") {
            got = st::target_next(seed, c.at("tokens").get<st::Tokens>(), vocab);
        } else if (fn == "prompt_tokens") {
            got = st::prompt_tokens(seed, c.at("id").get<std::string>(), c.at("n").get<std::int64_t>(), vocab);
        } else if (fn == "prefix_tokens") {
            got = st::prefix_tokens(seed, c.at("name").get<std::string>(), c.at("n").get<std::int64_t>(), vocab);
        } else if (fn == "expected_output") {
            got = st::expected_output(seed, c.at("tokens").get<st::Tokens>(), c.at("max_tokens").get<std::int64_t>(),
                                      stops(c), c.at("max_model_len").get<std::int64_t>(), vocab);
        } else if (fn == "repeats") {
            const st::Tokens output = c.at("tokens").get<st::Tokens>();
            got = st::repeats(output, 0, repetition(c.at("repetition")));
        } else if (fn == "draft") {
            got = st::draft(seed, c.at("tokens").get<st::Tokens>(), c.at("k").get<std::int64_t>(),
                            c.at("accept").get<std::int64_t>(), vocab);
        } else if (fn == "verify") {
            got = st::verify(seed, c.at("tokens").get<st::Tokens>(), c.at("drafts").get<st::Tokens>(), vocab);
        } else {
            std::cerr << "check_vectors: unknown fn " << fn << "\n";
            return 2;
        }
        ++cases;
        ++per_fn[fn];
        if (got != c.at("expect")) {
            if (++mismatches <= 5)
                std::cout << "MISMATCH line " << cases << " " << fn << ": expected " << c.at("expect").dump()
                          << ", got " << got.dump() << "\n";
        }
    }
    std::fclose(in);
    std::cout << cases << " cases (";
    bool first = true;
    for (const auto& [fn, n] : per_fn) {
        std::cout << (first ? "" : ", ") << fn << " " << n;
        first = false;
    }
    std::cout << "), " << mismatches << " mismatches\n";
    return mismatches == 0 && cases > 0 ? 0 : 1;
}
