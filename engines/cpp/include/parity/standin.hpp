// The deterministic stand-in of conformance/formats/workload.py, bit-exact, in C++.
//
// THE STAND-IN IS NOT A MODEL: a pure function from a request's tokens so far to its next
// token, so a port's scheduler can be driven without weights, identically on every machine.
// Each function's hash recipe is the Python one (see conformance/formats/workload.py):
//   target_next:   blake2b(8-byte digest, person "parity-target") over seed (8 bytes LE),
//                  len(tokens) (8 bytes LE), each of the last <= 16 tokens (8 bytes LE signed);
//                  digest as little-endian uint64, modulo vocab_size.
//   prompt_tokens: token i = blake2b(8-byte digest, person "parity-prompt") over seed (8 LE),
//                  i (8 LE), the id's UTF-8 bytes; little-endian uint64 modulo vocab_size.
//   prefix_tokens: prompt_tokens(seed, "prefix/" + name, n, vocab_size): a shared prefix's tokens.
//   expected_output: what a request outputs under any scheduler (target_next token by token,
//                  ending where check_stop stops it).
//   check_stop:    vLLM 0.27.1's check_stop: no stop before min_tokens outputs; then the eos
//                  token, a stop token, max_tokens or max_model_len, a repeating tail (repeats).
//   repeats:       vLLM's check_sequence_repetition.
//   draft:         the target's next min(accept, k) tokens, then wrong ones ((true+1) % vocab).
//   verify:        the longest prefix of drafts the target agrees with, plus a bonus token.
// BLAKE2b is libb2's (Debian: libb2-dev), with its parameter block for the personalization.
// Tests: engines/cpp/tests/gen_vectors.py writes vectors from the Python stand-in;
// engines/cpp/tests/check_vectors.cpp reproduces them (tests/engines/test_cpp_kit.py runs both).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace parity::standin {

using Token = std::int64_t;
using Tokens = std::vector<Token>;

constexpr std::size_t kContext = 16;  // target_next looks at the last 16 tokens (and the length)

// The target's next token after `tokens`, in [0, vocab_size). vocab_size >= 1.
Token target_next(std::uint64_t seed, const Tokens& tokens, std::int64_t vocab_size);
// The request's n prompt tokens.
Tokens prompt_tokens(std::uint64_t seed, const std::string& req_id, std::int64_t n, std::int64_t vocab_size);
// A named shared prefix's n tokens (a request id cannot hold '/', so never a request's own).
Tokens prefix_tokens(std::uint64_t seed, const std::string& name, std::int64_t n, std::int64_t vocab_size);
// vLLM's RepetitionDetectionParams: a max_pattern_size of 0 turns detection off.
struct Repetition {
    std::int64_t max_pattern_size = 0, min_pattern_size = 0, min_count = 0;
};

// What a request may stop on besides its length caps (vLLM's SamplingParams).
struct Stops {
    std::vector<std::int64_t> stop_token_ids;
    std::int64_t min_tokens = 0;
    std::optional<Token> eos_token_id;       // none: ignore_eos
    std::optional<Repetition> repetition;
};

// Why a request whose tokens (prompt, then outputs from index num_prompt) end in its latest
// output stops: "stop" (its eos or a stop token), "length", "repetition", or none. The order is
// vLLM 0.27.1's check_stop: no stop while fewer than min_tokens outputs, then the eos, the stop
// tokens, max_tokens or max_model_len (0: no such limit), then repetition.
std::optional<std::string> check_stop(const Tokens& tokens, std::size_t num_prompt, std::int64_t max_tokens,
                                      const Stops& stops, std::int64_t max_model_len);
// vLLM's check_sequence_repetition over the outputs tokens[num_prompt..]: whether they end in
// min_count runs of one pattern of max(min_pattern_size, 1) to max_pattern_size tokens.
bool repeats(const Tokens& tokens, std::size_t num_prompt, const Repetition& r);
// What a request with this prompt outputs: t_k = target_next(prompt + t_0 .. t_(k-1)), ending
// after the first t_k that check_stop stops at (kept).
Tokens expected_output(std::uint64_t seed, const Tokens& prompt, std::int64_t max_tokens, const Stops& stops,
                       std::int64_t max_model_len, std::int64_t vocab_size);
// k draft tokens for the request whose tokens so far are `tokens`, `accept` of them right.
Tokens draft(std::uint64_t seed, const Tokens& tokens, std::int64_t k, std::int64_t accept, std::int64_t vocab_size);
// What the target samples given the scheduled drafts: accepted prefix plus one bonus token.
Tokens verify(std::uint64_t seed, const Tokens& tokens, const Tokens& drafts, std::int64_t vocab_size);

// BLAKE2b with an 8-byte digest and a personalization of up to 16 bytes (zero-padded, as
// Python's hashlib pads it), over the concatenation of `parts`; the digest read as a
// little-endian unsigned 64-bit integer. Exposed for the vectors.
std::uint64_t blake2b64(const std::string& person, const std::vector<std::string>& parts);

}  // namespace parity::standin
