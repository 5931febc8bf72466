// A typed reader for the scenario object of a `run` message (see scenarios/README.md "The schema" and
// engines/PROTOCOL.md "The scenario object"). The harness has validated the scenario file
// already; this reader still checks every field it reads (type and range), so a bad `run`
// is answered with a bad_request error naming the field, and no size can make the engine
// allocate without bound. Unknown keys are ignored (the protocol's rule).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "parity/protocol.hpp"
#include "parity/standin.hpp"

namespace parity {

// Limits, as conformance/formats/scenario.py and conformance/formats/workload.py state them.
constexpr std::int64_t kMaxTokensLimit = 1 << 20;  // any size field
constexpr std::int64_t kMaxVocabSize = 151936;
constexpr std::int64_t kMaxSteps = 100000;
constexpr std::size_t kMaxRequests = 4096;
constexpr std::size_t kMaxList = 1024;  // stop_token_ids, acceptance
constexpr std::int64_t kMaxAccept = 1024;
constexpr std::int64_t kMaxPattern = 1024;  // repetition_detection's sizes and count
constexpr std::size_t kMaxPrefixes = 64;
constexpr std::int64_t kMaxLoraId = (std::int64_t{1} << 31) - 1;  // vLLM's lora_int_id: 1 and up
constexpr std::int64_t kMinPriority = -(std::int64_t{1} << 31), kMaxPriority = (std::int64_t{1} << 31) - 1;

struct SpeculativeConfig {
    std::string method;                       // eagle, eagle3, dflash, dspark, mtp, ngram, draft_model, ...
    std::int64_t num_speculative_tokens = 0;  // K (a method_matrix row takes it from `ks`)
    std::optional<std::string> model;         // absolute path of the draft model folder
    std::optional<bool> parallel_drafting;
    std::optional<std::int64_t> prompt_lookup_max, prompt_lookup_min;
};

// engine_args.kv_transfer_config: a KV connector (the stand-in's remote KV store,
// engines/PROTOCOL.md "A KV connector: the remote store and its loads").
struct KvTransferConfig {
    std::string kv_connector, kv_role;
    std::string kv_load_failure_policy = "fail";  // vLLM's default; or "recompute"
};

// engine_args: vLLM's own argument names.
struct EngineArgs {
    std::string model;  // absolute path of a folder with config.json
    std::string load_format;
    std::int64_t max_num_seqs = 0, max_num_batched_tokens = 0, max_model_len = 0, block_size = 0;
    bool enable_prefix_caching = false, enable_chunked_prefill = true;
    std::optional<bool> async_scheduling;  // null: vLLM's default (which differs by release)
    std::optional<std::string> dtype, scheduling_policy;
    std::optional<std::int64_t> seed, max_num_scheduled_tokens, long_prefill_token_threshold,
        num_gpu_blocks_override;
    std::optional<SpeculativeConfig> speculative_config;
    std::optional<KvTransferConfig> kv_transfer_config;
    bool enable_lora = false;  // LoRA: vLLM's LoRAConfig, whose max_loras bounds a step's adapters
    std::int64_t max_loras = 1, max_lora_rank = 16;  // vLLM's defaults
};

// A request's `external`: what the remote KV store holds of its prompt.
struct External {
    std::int64_t tokens = 0;                 // its first `tokens` prompt tokens
    std::optional<std::int64_t> async_steps;  // none: a synchronous load; k: reported k steps after it was issued
    bool fail = false;                       // its first load fails
};

// A request's LoRA adapter (vLLM's LoRARequest): the scheduler counts adapters by id, the block
// hashes tell them apart by name (a workload keeps the two one-to-one).
struct Lora {
    std::int64_t id = 0;
    std::string name;
};

struct RequestSpec {
    std::string id;  // [A-Za-z0-9_-]{1,32}
    std::int64_t arrival_step = 0, prompt_len = 0, max_tokens = 0;
    std::vector<std::int64_t> stop_token_ids;
    std::vector<std::int64_t> acceptance{0};  // drafts accepted at each verify step, cycled
    std::optional<std::string> prefix;     // its prompt starts with that named shared prefix
    std::optional<std::string> continues;  // its prompt starts with that earlier request's prompt and output
    std::optional<std::int64_t> abort_step;  // aborted before the schedule() of that step
    std::int64_t priority = 0;             // the priority policy's key (lower first)
    std::int64_t min_tokens = 0;           // no stop before this many outputs
    std::optional<std::int64_t> eos_token_id;  // it stops there (vLLM's ignore_eos false); none: ignore_eos
    std::optional<standin::Repetition> repetition_detection;  // only when max_pattern_size > 0
    std::optional<External> external;  // with engine_args.kv_transfer_config only
    std::optional<Lora> lora;  // the adapter it runs under (with engine_args.enable_lora)
};

// A request's stop conditions as the stand-in's check_stop takes them.
inline standin::Stops stops_of(const RequestSpec& r) {
    return {r.stop_token_ids, r.min_tokens, r.eos_token_id, r.repetition_detection};
}

struct Prefix {
    std::string name;
    std::int64_t len = 0;
};

struct Workload {
    std::uint64_t seed = 0;
    std::int64_t vocab_size = 0, max_steps = 0;
    std::int64_t max_model_len = 0;  // engine_args.max_model_len: where an expected output ends
    bool kv_connector = false;       // engine_args.kv_transfer_config given: the driver plays its worker side
    std::vector<Prefix> prefixes;
    std::vector<RequestSpec> requests;
};

struct MethodRow {
    std::string name;
    std::optional<std::string> target;  // replaces engine_args.model for this row
    SpeculativeConfig speculative_config;  // num_speculative_tokens left 0: K comes from ks
};

struct MethodMatrix {
    std::vector<std::int64_t> ks;
    std::vector<MethodRow> rows;
};

struct EngineOptions {  // the `engine` block: run the whole engine (engine_* layers)
    std::int64_t logprobs = 5, logprob_decimals = 1;
};

struct Scenario {
    std::string name, sha256;
    EngineArgs engine_args;
    std::optional<Workload> workload;
    std::optional<MethodMatrix> method_matrix;
    std::optional<EngineOptions> engine;
    json raw;  // the object as received
};

// Reads `run.scenario`. Throws RunError(bad_request) naming the field on a wrong type or range.
Scenario read_scenario(const json& scenario);

}  // namespace parity
