// Writers for every layer's records (engines/PROTOCOL.md "Layers and their records").
// Fill the struct, call to_json(), hand it to Session::record(layer, ...). Optional fields
// are written only where PROTOCOL.md says an engine has them; field names are the protocol's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "parity/protocol.hpp"

namespace parity {

// A configuration the engine refused (a *result*, sent as a record, not an error), compared by
// its meaning (PROTOCOL.md, "Refusals"): `type` is the class of the exception vLLM's own code
// raises ("ValueError" for a check in a config validator, not the pydantic "ValidationError"
// vLLM's caller sees around it), `message` vLLM's own words, without pydantic's wrapper (its
// header, the "Value error, " prefix, the "[type=..., input_value=...]" repr, the link).
struct Refusal {
    std::string type, message;
    json to_json() const { return {{"type", type}, {"message", message}}; }
};

// `config` (and `engine_config`): the resolved scheduling budget. One record.
struct ConfigRecord {
    std::optional<Refusal> refused;  // set: only `refused` and `budget_log_lines` are written
    std::int64_t max_num_batched_tokens = 0, max_num_seqs = 0;
    std::optional<std::int64_t> max_num_scheduled_tokens;  // null where vLLM leaves it unset
    std::int64_t num_speculative_tokens = 0;
    std::optional<std::string> speculative_method;  // null without speculation
    bool parallel_drafting = false;
    std::int64_t drafting_slots_per_request = 0;
    std::optional<std::string> drafting_reservation;  // "config", "per_step_input_budget", null
    std::optional<std::int64_t> num_lookahead_tokens;  // null where the engine has none
    std::int64_t block_size = 0;
    bool enable_prefix_caching = false, enable_chunked_prefill = false;
    std::string scheduler_class;
    std::vector<std::string> budget_log_lines;  // verbatim, in order (see BudgetLog)
    // Async scheduling: as vLLM's generic rule resolves it (what a GPU host runs), after the CPU
    // platform's rule (always off), the batch queue's size under the GPU rule, and the log
    // lines the resolution printed about it (kept on a refusal too).
    bool async_scheduling_gpu = false, async_scheduling_cpu = false;
    std::int64_t batch_queue_size = 1;
    std::vector<std::string> async_log_lines;

    json to_json() const {
        if (refused)
            return {{"refused", refused->to_json()},
                    {"budget_log_lines", budget_log_lines},
                    {"async_log_lines", async_log_lines}};
        auto opt = [](const auto& o) { return o ? json(*o) : json(nullptr); };
        return {{"refused", nullptr},
                {"max_num_batched_tokens", max_num_batched_tokens},
                {"max_num_scheduled_tokens", opt(max_num_scheduled_tokens)},
                {"max_num_seqs", max_num_seqs},
                {"num_speculative_tokens", num_speculative_tokens},
                {"speculative_method", opt(speculative_method)},
                {"parallel_drafting", parallel_drafting},
                {"drafting_slots_per_request", drafting_slots_per_request},
                {"drafting_reservation", opt(drafting_reservation)},
                {"num_lookahead_tokens", opt(num_lookahead_tokens)},
                {"block_size", block_size},
                {"enable_prefix_caching", enable_prefix_caching},
                {"enable_chunked_prefill", enable_chunked_prefill},
                {"scheduler_class", scheduler_class},
                {"budget_log_lines", budget_log_lines},
                {"async_scheduling_gpu", async_scheduling_gpu},
                {"async_scheduling_cpu", async_scheduling_cpu},
                {"batch_queue_size", batch_queue_size},
                {"async_log_lines", async_log_lines}};
    }
};

// The budget log lines a port prints, with vLLM's exact text, so a reviewer reads the
// oracle's and the port's side by side. Each helper returns the line; log it to stderr with
// your own logger and push it into ConfigRecord::budget_log_lines.
namespace budget_log {
inline std::string chunked_prefill(std::int64_t max_num_batched_tokens) {  // vLLM SchedulerConfig
    return "Chunked prefill is enabled with max_num_batched_tokens=" + std::to_string(max_num_batched_tokens) + ".";
}
inline std::string scheduled_tokens_reduced(std::int64_t max_num_scheduled_tokens) {  // VllmConfig, <= 0.27
    return "max_num_scheduled_tokens is set to " + std::to_string(max_num_scheduled_tokens) +
           " based on the speculative decoding settings. This may lead to suboptimal performance. Consider "
           "increasing max_num_batched_tokens to accommodate the additional draft token slots, or decrease "
           "num_speculative_tokens or max_num_seqs.";
}
inline std::string scheduled_tokens_refused(std::int64_t max_num_scheduled_tokens) {  // the ValueError's text
    return "max_num_scheduled_tokens is set to " + std::to_string(max_num_scheduled_tokens) +
           " based on the speculative decoding settings, which does not allow any tokens to be scheduled. "
           "Increase max_num_batched_tokens to accommodate the additional draft token slots, or decrease "
           "num_speculative_tokens or max_num_seqs.";
}
}  // namespace budget_log

// `steps` (and `engine_steps`): one record per scheduler step. The state fields are read
// after update_from_output() (engines/PROTOCOL.md "steps").
struct StepRequest {  // a request scheduled this step
    std::int64_t tokens = 0, draft_tokens = 0;  // what schedule() gave it
    std::int64_t accepted_draft_tokens = 0;     // drafts the sampled tokens accepted (sampled - 1)
    std::int64_t computed_tokens = 0;           // after the update (rejected drafts given back)
    std::int64_t output_tokens = 0;             // after the update (cut at a stop token)
    std::int64_t kv_blocks = 0;                 // KV blocks it holds after the update (0 once finished)
    // Its identities (`steps` only, engines/PROTOCOL.md "steps request entry"), from the
    // scheduler's own output and state, never recomputed:
    // one list per KV cache group (one, or one per attention type of a hybrid model);
    // nullopt: null (no new block in any group)
    std::optional<std::vector<std::vector<std::int64_t>>> block_ids;
    std::int64_t cached_tokens = 0;              // the prefix-cache hit of its admission; 0 at a running step
    std::vector<std::int64_t> draft_token_ids;   // the drafts scheduled (-1: a padded admission's placeholder)
    bool resent_token_ids = false;               // the output carries all its token ids (resumed, or skipped before)
    std::vector<std::int64_t> next_draft_token_ids;  // its drafts kept after this step's drafting
    // Async scheduling only (run_workload_async): its output placeholders after the update
    // (0 once finished or preempted) and what the update did with its output: "applied",
    // "stale" (preempted after this step was scheduled) or "dropped" (finished before it).
    std::optional<std::int64_t> output_placeholders;
    std::optional<std::string> delivery;
};

struct StepRecord {
    std::int64_t step = 0, total_num_scheduled_tokens = 0, token_budget = 0;
    // Only where drafting slots are charged per scheduled request (vLLM >= 0.28):
    std::optional<std::int64_t> input_budget, drafting_slots_per_request;
    std::map<std::string, StepRequest> requests;
    std::vector<std::string> new_, resumed, preempted, finished;  // written sorted
    // After the update: the KV cache's free blocks and the blocks requests hold (vLLM's null
    // block in neither), and the queues in their own order (written as given, not sorted).
    std::int64_t kv_free = 0, kv_used = 0, kv_cached = 0;  // kv_cached: blocks holding a hash
    std::vector<std::string> waiting, running;
    // `steps` only: aborted before this step's schedule, given a client output by its update
    // (written sorted), and the common prefix blocks of the one KV cache group.
    std::vector<std::string> aborted, emitted;
    std::vector<std::int64_t> num_common_prefix_blocks{0};  // one per KV cache group
    // Async scheduling only: the driver iteration whose schedule() made this step, and the
    // one whose update_from_output() processed it.
    std::optional<std::int64_t> iteration, update_iteration;
    bool identities = true;  // false for engine_steps: no identities, no aborted/emitted, no cached
    // engine_steps only:
    std::optional<std::vector<std::int64_t>> target_forward_tokens, drafter_forward_tokens;
    std::optional<std::int64_t> max_num_batched_tokens;

    json to_json() const {
        auto sorted = [](std::vector<std::string> v) {
            std::sort(v.begin(), v.end());
            return v;
        };
        json reqs = json::object();
        for (const auto& [id, r] : requests) {
            reqs[id] = {{"tokens", r.tokens},
                        {"draft_tokens", r.draft_tokens},
                        {"accepted_draft_tokens", r.accepted_draft_tokens},
                        {"computed_tokens", r.computed_tokens},
                        {"output_tokens", r.output_tokens},
                        {"kv_blocks", r.kv_blocks}};
            json& e = reqs[id];
            if (r.output_placeholders) e["output_placeholders"] = *r.output_placeholders;
            if (r.delivery) e["delivery"] = *r.delivery;
            if (!identities) continue;
            e["block_ids"] = r.block_ids ? json(*r.block_ids) : json(nullptr);
            e["cached_tokens"] = r.cached_tokens;
            e["draft_token_ids"] = r.draft_token_ids;
            e["resent_token_ids"] = r.resent_token_ids;
            e["next_draft_token_ids"] = r.next_draft_token_ids;
        }
        json out = {{"step", step},
                    {"total_num_scheduled_tokens", total_num_scheduled_tokens},
                    {"token_budget", token_budget},
                    {"requests", reqs},
                    {"new", sorted(new_)},
                    {"resumed", sorted(resumed)},
                    {"preempted", sorted(preempted)},
                    {"finished", sorted(finished)},
                    {"kv_blocks", {{"free", kv_free}, {"used", kv_used}}},
                    {"waiting", waiting},
                    {"running", running}};
        if (identities) {
            out["kv_blocks"]["cached"] = kv_cached;
            out["aborted"] = sorted(aborted);
            out["emitted"] = sorted(emitted);
            out["num_common_prefix_blocks"] = num_common_prefix_blocks;
        }
        if (iteration) out["iteration"] = *iteration;
        if (update_iteration) out["update_iteration"] = *update_iteration;
        if (input_budget) out["input_budget"] = *input_budget;
        if (drafting_slots_per_request) out["drafting_slots_per_request"] = *drafting_slots_per_request;
        if (target_forward_tokens) out["target_forward_tokens"] = *target_forward_tokens;
        if (drafter_forward_tokens) out["drafter_forward_tokens"] = *drafter_forward_tokens;
        if (max_num_batched_tokens) out["max_num_batched_tokens"] = *max_num_batched_tokens;
        return out;
    }
};

// `outputs` (and `engine_outputs`): one record per request, sent sorted by id.
struct OutputRecord {
    std::string id;
    std::vector<std::int64_t> output_token_ids;
    std::optional<std::string> finish_reason;  // "length", "stop", "abort", "repetition" (`outputs`)
    std::optional<std::int64_t> stop_reason;   // the stop token it stopped on (`outputs` only);
                                               // a repetition stop's is vLLM's string (to_json)
    bool with_stop_reason = true;              // false for engine_outputs, which has no such field
    // engine_outputs only: per position [[token id, logprob], ...] best first, rounded.
    std::optional<std::vector<std::vector<std::pair<std::int64_t, double>>>> logprobs;
    std::optional<double> top1_margin_at_least;

    json to_json() const {
        json out = {{"id", id},
                    {"output_token_ids", output_token_ids},
                    {"finish_reason", finish_reason ? json(*finish_reason) : json(nullptr)}};
        if (with_stop_reason) {
            // vLLM sets stop_reason "repetition_detected" where it finishes a request as a repetition
            const bool repetition = finish_reason && *finish_reason == "repetition";
            out["stop_reason"] = stop_reason ? json(*stop_reason)
                                 : repetition ? json("repetition_detected") : json(nullptr);
        }
        if (logprobs) {
            json positions = json::array();
            for (const auto& pos : *logprobs) {
                json entries = json::array();
                for (const auto& [token, lp] : pos) entries.push_back({token, lp});
                positions.push_back(entries);
            }
            out["logprobs"] = positions;
        }
        if (top1_margin_at_least) out["top1_margin_at_least"] = *top1_margin_at_least;
        return out;
    }
};

// `methods`: one record per (row, K), then refusal probes (see PROTOCOL.md). Fields whose
// names end in _text are shown, never compared.
struct MethodRecord {
    std::string row, method;
    std::int64_t k = 0;
    bool constructible = true;
    std::optional<std::string> refusal_kind, refusal_text;
    bool parallel_drafting = false;
    std::int64_t drafting_slots_per_request = 0;
    std::optional<std::int64_t> num_lookahead_tokens, max_num_scheduled_tokens, per_step_input_budget;

    json to_json() const {
        auto opt = [](const auto& o) { return o ? json(*o) : json(nullptr); };
        return {{"row", row},
                {"method", method},
                {"k", k},
                {"constructible", constructible},
                {"refusal_kind", opt(refusal_kind)},
                {"refusal_text", opt(refusal_text)},
                {"parallel_drafting", parallel_drafting},
                {"drafting_slots_per_request", drafting_slots_per_request},
                {"num_lookahead_tokens", opt(num_lookahead_tokens)},
                {"max_num_scheduled_tokens", opt(max_num_scheduled_tokens)},
                {"per_step_input_budget", opt(per_step_input_budget)}};
    }
};

struct ProbeRecord {
    std::string row, probe;  // probe: "below", "at", "above"
    bool refused = false;
    std::optional<std::string> refusal_kind, refused_by, refusal_text;
    std::int64_t reservation = 0;
    json adjusted = json::object();  // what else had to change, e.g. {"max_num_seqs": 3}

    json to_json() const {
        auto opt = [](const auto& o) { return o ? json(*o) : json(nullptr); };
        return {{"row", row},
                {"probe", probe},
                {"refused", refused},
                {"refusal_kind", opt(refusal_kind)},
                {"refused_by", opt(refused_by)},
                {"refusal_text", opt(refusal_text)},
                {"reservation", reservation},
                {"adjusted", adjusted}};
    }
};

}  // namespace parity
