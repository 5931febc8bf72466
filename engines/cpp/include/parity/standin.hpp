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
//                  ending after a stop token, at max_tokens, or at max_model_len).
//   draft:         the target's next min(accept, k) tokens, then wrong ones ((true+1) % vocab).
//   verify:        the longest prefix of drafts the target agrees with, plus a bonus token.
// BLAKE2b is libb2's (Debian: libb2-dev), with its parameter block for the personalization.
// Tests: engines/cpp/tests/gen_vectors.py writes vectors from the Python stand-in;
// engines/cpp/tests/check_vectors.cpp reproduces them (tests/test_cpp_kit.py runs both).
#pragma once

#include <cstdint>
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
// What a request with this prompt outputs: t_k = target_next(prompt + t_0 .. t_(k-1)), ending after
// the first t_k in stop_token_ids (kept), at max_tokens outputs, or when prompt and outputs
// reach max_model_len (0: no such limit).
Tokens expected_output(std::uint64_t seed, const Tokens& prompt, std::int64_t max_tokens,
                       const std::vector<std::int64_t>& stop_token_ids, std::int64_t max_model_len,
                       std::int64_t vocab_size);
// k draft tokens for the request whose tokens so far are `tokens`, `accept` of them right.
Tokens draft(std::uint64_t seed, const Tokens& tokens, std::int64_t k, std::int64_t accept, std::int64_t vocab_size);
// What the target samples given the scheduled drafts: accepted prefix plus one bonus token.
Tokens verify(std::uint64_t seed, const Tokens& tokens, const Tokens& drafts, std::int64_t vocab_size);

// BLAKE2b with an 8-byte digest and a personalization of up to 16 bytes (zero-padded, as
// Python's hashlib pads it), over the concatenation of `parts`; the digest read as a
// little-endian unsigned 64-bit integer. Exposed for the vectors.
std::uint64_t blake2b64(const std::string& person, const std::vector<std::string>& parts);

}  // namespace parity::standin
