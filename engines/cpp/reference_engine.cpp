// The reference engine: a worked example of a C++ engine under the vllm-parity gate.
//
// IT IS NOT AN ORACLE. It is the skeleton a port team copies: the kit (include/parity/) does
// the protocol, the scenario, the records and the stand-in; this file holds the two things a
// port brings itself, here in their simplest form:
//
//   1. resolve_config(): the engine's configuration code, which decides the scheduling budget
//      and prints its budget log lines (the `config` layer). This one computes vLLM 0.27.1's
//      drafting-slot reservation, as VllmConfig._set_max_num_scheduled_tokens does.
//   2. SimpleScheduler: a scheduler behind the kit's PortScheduler interface (the `steps` and
//      `outputs` layers). Chunked prefill under a token budget, a running cap, K drafts per
//      decoding request, FCFS or priority preemption (request priorities), aborts, a KV
//      connector's loads (synchronous, asynchronous, failed), over src/kv_cache_manager.hpp:
//      vLLM 0.27.1's KVCacheManager (its block pool's free-queue order, the null block,
//      eviction, the hash chain and prefix-cache hits; the hybrid groups of a sliding-window
//      model). A port replaces them with an adapter around its own scheduler; nothing else in
//      this file has to change. Where async scheduling resolves on
//      it behaves as vLLM's AsyncScheduler (output placeholders, stale output after a
//      preemption), driven by the kit's batch-queue loop, run_workload_async(). Its hello
//      lists every feature but structured_outputs, reasoning, streaming_input, mamba,
//      kv_cache_events, prefix_cache_resets and encoder_inputs (see kFeatures).
//
// It does not serve `methods` (the per-method drafting table) nor the engine layers
// (engine_config / engine_steps / engine_outputs: they need a real model runner); runs asking
// for them are answered with the protocol's `unsupported` error.
//
// Usage: reference_engine [--no-draft-reservation] [--sync-loop] [--ignore-min-tokens]
//   Speaks protocol v3 on stdin/stdout, logs to stderr.
//   --no-draft-reservation: the seed's bug, on purpose: no drafting-slot reservation, so the
//   scheduler plans the whole max_num_batched_tokens (4096 instead of 4036 on the DFlash gate
//   configuration). A demonstration of what the gate reports for a port that diverges.
//   --sync-loop: a TEST DEVICE, a bug on purpose: where async scheduling resolves on, it runs
//   the async scheduler with a batch queue of 1, so each batch's output is processed before
//   the next is scheduled (the synchronous loop's order, not vLLM's). The gate must report it
//   as diverged on every async scenario (tests/engines/test_cpp_kit.py).
//   --ignore-min-tokens: a TEST DEVICE, a bug on purpose: check_stop has no min_tokens gate, so
//   an eos or stop token before min_tokens outputs stops the request. The gate must report it as
//   diverged on stop_min_tokens (tests/engines/test_cpp_kit.py).
#include <algorithm>
#include <cstdio>
#include <deque>
#include <functional>
#include <iostream>
#include <list>
#include <memory>
#include <set>
#include <tuple>

#include "parity/protocol.hpp"
#include "parity/records.hpp"
#include "parity/scenario.hpp"
#include "parity/scheduler.hpp"
#include "src/kv_cache_manager.hpp"
#include "src/kv_connector.hpp"

namespace {

using parity::ConfigRecord;
using parity::ErrorKind;
using parity::json;
using parity::RunError;
using parity::Token;
using parity::Tokens;

const char* kEngineName = "parity-cpp-reference";
const char* kEngineVersion = "0.1.0";
const std::vector<std::string> kServed = {"config", "steps", "outputs"};
// The features it has (engines/PROTOCOL.md "Features"): the gate sends it no scenario needing
// another, and gives that scenario an `unsupported` verdict naming the feature. A port lists
// only those it has; this engine has every one but `structured_outputs` (a grammar needs a
// grammar engine over the tokenizer, JSON schema and regex compilation and token bitmasks as
// xgrammar's: no such C or C++ library is in Debian's packages, and the kit links nothing but
// nlohmann-json), whose scenarios come back `unsupported`; nor `reasoning` (a reasoning parser
// only defers a request's grammar until its reasoning ends: without a grammar engine there is
// nothing to defer, and every reasoning scenario also needs `structured_outputs`); nor `mamba`:
// a hybrid mamba model's block sizes come from vLLM's page-size unification over the model
// class's mamba state shapes and dtypes (Platform._align_hybrid_block_size,
// MambaStateShapeCalculator), and its KV cache groups run vLLM's MambaManager (state blocks per
// cache mode, block-aligned prefill splits, fine-grained hashes, blocks to zero), none of which
// this engine's KV cache manager has yet, so those scenarios come back `unsupported` too.
// `sliding_window` runs through its KV
// cache manager's hybrid groups (src/kv_cache_manager.hpp), `kv_connector` through the
// stand-in connector (src/kv_connector.hpp) and the kit's worker side of it. `streaming_input`
// (a session's later input chunks, vLLM's resumable requests) is not implemented yet: the kit's
// scenario reader takes no `session` and its add_request knows no request id twice; the steps a
// port must take are engines/PROTOCOL.md's "Streaming input sessions". It lacks
// `kv_cache_events` and `prefix_cache_resets` too, for now: its KV cache manager keeps the
// hash chain but queues no events and has no reset; a port adds both to its own block pool
// (engines/PROTOCOL.md "KV cache events", "Prefix-cache resets").
// It lacks `encoder_inputs` too: vLLM computes the encoder budget and cache size from the
// multimodal model's processor (MultiModalBudget over the model's processing info and its
// processor files), which only the release's own Python code reads; a port states that number
// from its own multimodal stack, and the reference engine has none, so those scenarios come back
// `unsupported`.
const std::vector<std::string> kFeatures = {
    "spec:dflash", "spec:draft_model", "spec:dspark", "spec:eagle", "spec:eagle3", "spec:medusa", "spec:mtp",
    "spec:ngram", "spec:suffix", "parallel_drafting", "priority_policy", "request_priorities", "prefix_caching",
    "prefix_caching_off", "chunked_prefill_off", "long_prefill_threshold", "max_num_scheduled_tokens", "aborts",
    "shared_prefixes", "stop_token_ids", "min_tokens", "eos", "repetition_detection", "lora", "async_scheduling",
    "vllm_log_lines", "sliding_window", "kv_connector"};
bool g_no_draft_reservation = false;  // --no-draft-reservation (see the usage above)
bool g_sync_loop = false;             // --sync-loop: a TEST DEVICE (see the usage above)
bool g_ignore_min_tokens = false;     // --ignore-min-tokens: a TEST DEVICE (see the usage above)

void log_line(const char* level, const std::string& text) {
    std::fprintf(stderr, "%s [reference_engine] %s\n", level, text.c_str());
}

// ---- 1. configuration ----------------------------------------------------------------------

// What the scheduler needs from the resolved configuration.
struct Settings {
    std::int64_t max_num_scheduled_tokens = 0, max_num_seqs = 0, max_model_len = 0, block_size = 16;
    std::int64_t num_speculative_tokens = 0, num_lookahead_tokens = 0, long_prefill_token_threshold = 0;
    std::int64_t num_gpu_blocks = 0;
    bool enable_chunked_prefill = true, enable_prefix_caching = false;
    bool priority_policy = false;  // scheduling_policy "priority" (the default is "fcfs")
    bool eagle_family = false;     // eagle, eagle3, mtp, dflash, dspark: a prefix-cache hit drops its last block
    bool async_scheduling = false;  // async_scheduling_gpu: vLLM's AsyncScheduler over its Scheduler
    std::vector<parity::kv::Group> kv_groups{parity::kv::Group{}};  // the model's KV cache groups
    std::int64_t max_in_flight_tokens = 0;  // VllmConfig.max_in_flight_tokens
    bool kv_connector = false, kv_recompute = false;  // kv_transfer_config; its kv_load_failure_policy recompute
    bool defer_block_free = false;      // a consumer connector under async scheduling
    bool requires_kv_delivery = false;  // a producer connector: a preempted request's output in flight is dropped
    std::int64_t max_loras = 0;     // LoRAConfig.max_loras with enable_lora, else 0: no LoRA config
};

// Resolves engine_args the way vLLM 0.27.1 does for the fields the config layer records.
// Returns the record; `settings` is filled unless the configuration is refused.
ConfigRecord resolve_config(const parity::EngineArgs& args, Settings& settings) {
    ConfigRecord rec;
    auto refuse = [&](const std::string& message) {
        log_line("ERROR", message);
        rec.refused = parity::Refusal{"ValueError", message};
        return rec;
    };
    // SchedulerConfig: its INFO line comes first.
    if (args.enable_chunked_prefill) {
        rec.budget_log_lines.push_back(parity::budget_log::chunked_prefill(args.max_num_batched_tokens));
        log_line("INFO", rec.budget_log_lines.back());
    }
    // SchedulerConfig.verify_max_model_len: its checks in its order, in its words.
    const std::string batched = std::to_string(args.max_num_batched_tokens);
    if (!args.enable_chunked_prefill && args.max_num_batched_tokens < args.max_model_len)
        return refuse("max_num_batched_tokens (" + batched + ") is smaller than max_model_len (" +
                      std::to_string(args.max_model_len) + "). This effectively limits the maximum sequence "
                      "length to max_num_batched_tokens and makes vLLM reject longer sequences. Please increase "
                      "max_num_batched_tokens or decrease max_model_len.");
    if (args.max_num_batched_tokens < args.max_num_seqs)
        return refuse("max_num_batched_tokens (" + batched + ") must be greater than or equal to max_num_seqs (" +
                      std::to_string(args.max_num_seqs) + ").");
    if (args.max_num_batched_tokens > args.max_num_seqs * args.max_model_len) {
        rec.budget_log_lines.push_back("max_num_batched_tokens (" + batched + ") exceeds max_num_seqs * max_model_len (" +
                                       std::to_string(args.max_num_seqs * args.max_model_len) +
                                       "). This may lead to unexpected behavior.");
        log_line("WARNING", rec.budget_log_lines.back());
    }
    const std::int64_t threshold = args.long_prefill_token_threshold.value_or(0);
    if (threshold > args.max_model_len)
        return refuse("long_prefill_token_threshold (" + std::to_string(threshold) +
                      ") cannot be greater than the max_model_len (" + std::to_string(args.max_model_len) + ").");

    const auto& spec = args.speculative_config;
    const std::int64_t k = spec ? spec->num_speculative_tokens : 0;
    // EngineArgs.create_engine_config, after the scheduler config and before VllmConfig: LoRA
    // with speculative decoding needs room for every sequence's drafts in one batch.
    if (args.enable_lora && spec && args.max_num_batched_tokens < args.max_num_seqs * (k + 1))
        return refuse("Consider increasing max_num_batched_tokens or decreasing num_speculative_tokens");
    const std::string method = spec ? spec->method : "";
    // SpeculativeConfig: DFlash and DSpark always draft in parallel.
    const bool parallel = spec && (spec->parallel_drafting.value_or(false) || method == "dflash" || method == "dspark");
    // max_num_new_slots_for_drafting: one slot per masked token when drafting in parallel,
    // plus one for a separate draft model (it does not slice the draft tokens).
    std::int64_t slots = 0;
    if (spec) slots = (parallel ? k - 1 : 0) + (method == "draft_model" ? 1 : 0);
    // The scheduler's lookahead slots per request.
    std::int64_t lookahead = 0;
    if (method == "eagle" || method == "eagle3" || method == "mtp" || method == "draft_model" || method == "dspark")
        lookahead = k;
    if (method == "dflash") lookahead = k + 1;  // a query for the last sampled token, plus K

    // VllmConfig.__post_init__: async scheduling under vLLM's generic rule. An explicit value is
    // taken as is (on with a method it cannot run is refused); left to vLLM (null), it is on
    // without speculation and for EAGLE-family methods, ngram_gpu and dspark, else off, saying so.
    const bool async_methods = !spec || method == "eagle" || method == "eagle3" || method == "mtp" ||
                               method == "dflash" || method == "dspark" || method == "ngram_gpu";
    bool async_gpu = false;
    if (args.async_scheduling) {
        async_gpu = *args.async_scheduling;
        if (async_gpu && !async_methods && method != "draft_model")
            return refuse("Currently, async scheduling is only supported with EAGLE/MTP/Draft Model/NGram GPU/DSpark "
                          "kind of speculative decoding");
    } else if (!async_methods) {
        rec.async_log_lines.push_back("Async scheduling not supported with " + method +
                                      "-based speculative decoding and will be disabled.");
        log_line("WARNING", rec.async_log_lines.back());
    } else {
        async_gpu = true;
    }
    rec.async_scheduling_gpu = async_gpu;
    rec.async_scheduling_cpu = false;  // vllm/platforms/cpu.py forces it off
    rec.batch_queue_size = async_gpu ? 2 : 1;  // max_concurrent_batches (V1 runner, no pipeline parallelism)

    // VllmConfig._set_max_num_scheduled_tokens (0.27.1): the drafting reservation is
    // subtracted once, from the whole budget, for max_num_seqs requests.
    std::int64_t scheduled = args.max_num_scheduled_tokens.value_or(args.max_num_batched_tokens);
    if (spec) {
        const std::int64_t delta = g_no_draft_reservation ? 0 : slots * args.max_num_seqs;
        if (!args.max_num_scheduled_tokens) scheduled = args.max_num_batched_tokens - delta;
        if (scheduled <= 0) return refuse(parity::budget_log::scheduled_tokens_refused(scheduled));
        if (!g_no_draft_reservation && scheduled < 8192) {  // the port without a reservation has no such line
            rec.budget_log_lines.push_back(parity::budget_log::scheduled_tokens_reduced(scheduled));
            log_line("WARNING", rec.budget_log_lines.back());
        }
        if (args.max_num_batched_tokens < scheduled + delta)
            return refuse("VllmConfig received max_num_scheduled_tokens but it does not have enough slots to "
                          "support the speculative decoding settings. It should be greater by at least " +
                          std::to_string(delta) + ", but got max_num_batched_tokens=" +
                          std::to_string(args.max_num_batched_tokens) + " and max_num_scheduled_tokens=" +
                          std::to_string(scheduled) + ".");
    }

    rec.max_num_batched_tokens = args.max_num_batched_tokens;
    // 0.27.1 sets it only for speculation; otherwise it stays as given (null when not given)
    // and the scheduler plans max_num_batched_tokens.
    if (spec || args.max_num_scheduled_tokens) rec.max_num_scheduled_tokens = scheduled;
    rec.max_num_seqs = args.max_num_seqs;
    rec.num_speculative_tokens = k;
    if (spec) rec.speculative_method = method;
    rec.parallel_drafting = parallel;
    rec.drafting_slots_per_request = slots;
    if (spec) rec.drafting_reservation = "config";
    rec.num_lookahead_tokens = lookahead;
    rec.block_size = args.block_size;
    rec.enable_prefix_caching = args.enable_prefix_caching;
    rec.enable_chunked_prefill = args.enable_chunked_prefill;
    // The protocol compares the class name: the one the steps layer drives under the GPU rule.
    rec.scheduler_class = async_gpu ? "AsyncScheduler" : "Scheduler";

    settings.max_num_scheduled_tokens = scheduled;
    settings.max_num_seqs = args.max_num_seqs;
    settings.max_model_len = args.max_model_len;
    settings.block_size = args.block_size;
    settings.num_speculative_tokens = k;
    settings.num_lookahead_tokens = lookahead;
    settings.long_prefill_token_threshold = args.long_prefill_token_threshold.value_or(0);
    settings.enable_chunked_prefill = args.enable_chunked_prefill;
    settings.enable_prefix_caching = args.enable_prefix_caching;
    settings.eagle_family = method == "eagle" || method == "eagle3" || method == "mtp" || method == "dflash" ||
                            method == "dspark";
    settings.priority_policy = args.scheduling_policy.value_or("fcfs") == "priority";
    settings.async_scheduling = async_gpu;
    settings.max_loras = args.enable_lora ? args.max_loras : 0;
    // As the oracle's CPU steps layer sizes its KV cache (engines/vllm/release.py build_scheduler):
    // enough for max_num_seqs whole sequences in every group.
    settings.kv_groups = parity::kv::model_kv_cache_groups(args.model);
    const std::int64_t blocks_per_seq = (args.max_model_len + args.block_size - 1) / args.block_size;
    const auto groups = static_cast<std::int64_t>(settings.kv_groups.size());
    settings.num_gpu_blocks = args.num_gpu_blocks_override.value_or(args.max_num_seqs * blocks_per_seq * groups + 1);
    settings.max_in_flight_tokens = rec.batch_queue_size * args.max_num_batched_tokens;
    settings.kv_connector = args.kv_transfer_config.has_value();
    settings.kv_recompute = settings.kv_connector && args.kv_transfer_config->kv_load_failure_policy == "recompute";
    if (settings.kv_connector) {
        const std::string& role = args.kv_transfer_config->kv_role;
        settings.defer_block_free = rec.batch_queue_size > 1 && (role == "kv_consumer" || role == "kv_both");
        settings.requires_kv_delivery = role == "kv_producer" || role == "kv_both";
    }
    return rec;
}

// ---- 2. the scheduler ----------------------------------------------------------------------
// Replace these classes with an adapter around your own scheduler.

// The KV cache (its block pool, its groups, prefix-cache hits and the sliding window) is
// src/kv_cache_manager.hpp: vLLM 0.27.1's KVCacheManager.

// Block hashes: block i's is a function of block i-1's, its tokens and its extra keys (the
// request's LoRA adapter name: vLLM's generate_block_hash_extra_keys; empty without one).
// Interned exactly (no collisions): equal hashes mean equal tokens from the prompt's start
// under the same adapter.
class BlockHashes {
  public:
    std::int64_t of(std::int64_t parent, const Tokens& tokens, const std::string& extra) {
        return ids_.emplace(std::make_tuple(parent, tokens, extra), static_cast<std::int64_t>(ids_.size()))
            .first->second;
    }

  private:
    std::map<std::tuple<std::int64_t, Tokens, std::string>, std::int64_t> ids_;
};

class SimpleScheduler : public parity::PortScheduler {
  public:
    explicit SimpleScheduler(const Settings& s) : s_(s), kv_(kv_settings(s)) {
        if (s.kv_connector) connector_.emplace(s.block_size);
    }

    void add_request(const parity::RequestSpec& spec, Tokens prompt) override {
        auto r = std::make_unique<Request>();
        r->id = spec.id;
        r->arrival_step = spec.arrival_step;
        r->priority = spec.priority;
        r->num_prompt_tokens = static_cast<std::int64_t>(prompt.size());
        r->tokens = std::move(prompt);
        r->max_tokens = spec.max_tokens;
        r->stop_token_ids = std::set<Token>(spec.stop_token_ids.begin(), spec.stop_token_ids.end());
        r->min_tokens = spec.min_tokens;
        r->eos_token_id = spec.eos_token_id;
        r->repetition = spec.repetition_detection;
        r->external = spec.external;
        r->lora = spec.lora;
        Request* added = r.get();
        requests_[spec.id] = std::move(r);
        enqueue_waiting(*added);
    }

    parity::ScheduledStep schedule() override {
        parity::ScheduledStep out;
        out.token_budget = s_.max_num_scheduled_tokens;
        std::int64_t budget = s_.max_num_scheduled_tokens;
        std::vector<Request*> scheduled;
        bool prefill_scheduled = false;  // a running request scheduled mid-prefill

        auto take = [&](Request* r, std::int64_t n) {
            scheduled.push_back(r);
            out.order.push_back(r->id);
            out.num_scheduled_tokens[r->id] = n;
            budget -= n;
        };

        // First the running requests, in order: each catches up with its tokens plus drafts.
        for (std::size_t i = 0; i < running_.size() && budget > 0;) {
            Request* r = running_[i];
            // Async scheduling: no extra step once the steps in flight surely reach max_tokens,
            // even if all their drafts are rejected: (computed + 1) - (placeholders - 1).
            if (r->placeholders > 0 && r->num_computed + 2 - r->placeholders >= r->num_prompt_tokens + r->max_tokens) {
                ++i;
                continue;
            }
            // Output placeholders count as tokens: the steps in flight will have sampled them.
            std::int64_t n = r->num_tokens() + static_cast<std::int64_t>(r->spec.size()) + r->placeholders - r->num_computed;
            if (0 < s_.long_prefill_token_threshold && s_.long_prefill_token_threshold < n)
                n = s_.long_prefill_token_threshold;
            n = std::min(n, budget);
            n = std::min(n, s_.max_model_len - r->num_computed - 1);  // one sampled token per step
            if (n <= 0) {
                ++i;
                continue;
            }
            parity::kv::Tables added;
            bool ok = allocate(*r, n, &added);
            while (!ok) {  // no room: preempt a running request, maybe this one
                Request* victim = pick_victim();
                const auto at = std::find(running_.begin(), running_.end(), victim);
                if (static_cast<std::size_t>(at - running_.begin()) < i) {
                    // scheduled earlier in this step (priority policy only): unschedule it
                    budget += out.num_scheduled_tokens[victim->id];
                    out.num_scheduled_tokens.erase(victim->id);
                    out.spec_tokens.erase(victim->id);
                    out.order.erase(std::find(out.order.begin(), out.order.end(), victim->id));
                    scheduled.erase(std::find(scheduled.begin(), scheduled.end(), victim));
                    --i;
                }
                running_.erase(at);
                preempt(*victim);
                out.preempted.push_back(victim->id);
                if (victim == r) break;
                ok = allocate(*r, n, &added);
            }
            if (!ok) break;
            if (!all_empty(added)) out.block_ids[r->id] = added;  // at a running step: its new blocks
            take(r, n);
            if (!prev_scheduled_.count(r->id)) out.resent_token_ids.push_back(r->id);  // skipped before
            prefill_scheduled |= r->is_prefill_chunk;
            ++i;
            if (!r->spec.empty()) {  // schedule as many drafts as the budget left room for
                std::int64_t n_spec = n + r->num_computed - r->num_tokens() - r->placeholders;
                if (n_spec > 0) {
                    Tokens drafts = r->spec;
                    if (static_cast<std::int64_t>(drafts.size()) > n_spec) drafts.resize(n_spec);
                    out.spec_tokens[r->id] = drafts;
                }
                r->spec.clear();  // new ones arrive through update_draft_token_ids
            }
        }

        // Then the waiting requests, in order, while nothing was preempted this step. A request
        // whose KV connector load is in flight (WAITING_FOR_REMOTE_KVS) waits in a side queue
        // (vLLM's skipped_waiting), taken first, until a model runner output reports the load.
        const bool running_scheduled = !scheduled.empty();  // requests of the running queue
        // The adapters of the running requests scheduled so far: a waiting request of another
        // adapter is skipped once they number max_loras (vLLM 0.27.1 counts only the running
        // requests scheduled in this step, not one whose last token is in flight).
        std::set<std::int64_t> loras;
        for (Request* r : scheduled)
            if (s_.max_loras > 0 && r->lora) loras.insert(r->lora->id);
        std::vector<Request*> skipped;  // skipped this step, in order: to skipped_ after the loop
        while (out.preempted.empty() && !(waiting_.empty() && skipped_.empty()) && budget > 0) {
            if (static_cast<std::int64_t>(running_.size()) >= s_.max_num_seqs) break;
            std::deque<Request*>& queue = next_queue();
            Request* r = queue.front();
            if (r->remote_kvs && !promote(*r)) {  // its KV connector load is still in flight
                queue.pop_front();
                skipped.push_back(r);
                continue;
            }
            // vLLM moves a request whose stale output is still in flight to a side queue
            // (skipped_waiting) and resumes it later. With a batch queue of 2 its output always
            // arrives before the next schedule() (engines/PROTOCOL.md), so that never happens
            // here: reaching it is a bug here, not a divergence to report.
            if (r->stale > 0 && !r->drop_stale)
                throw RunError(ErrorKind::internal, "request " + r->id + " would be resumed with stale output in "
                               "flight: the reference engine does not expect it");
            // max_loras: skipped (before any prefix-cache lookup or allocation), the loop goes on
            if (s_.max_loras > 0 && r->lora && static_cast<std::int64_t>(loras.size()) == s_.max_loras &&
                !loras.count(r->lora->id)) {
                queue.pop_front();
                skipped.push_back(r);
                continue;
            }
            // Prefix-cache hits (a new or preempted request has 0 computed tokens; one whose
            // asynchronous load arrived has them), then what the KV connector loads beyond them.
            parity::kv::Hit hits{parity::kv::Tables(kv_.num_groups()), 0};
            std::int64_t external = 0;
            bool load_async = false;
            if (r->num_computed == 0) {
                hits = lookup(*r);
                if (connector_)
                    std::tie(external, load_async) =
                        connector_->matched_tokens(r->id, r->external, r->num_prompt_tokens, hits.tokens);
            }
            const std::int64_t computed = r->num_computed == 0 ? hits.tokens + external : r->num_computed;
            std::int64_t n = 0;  // an asynchronous load computes nothing until it arrives
            bool pad = false;
            if (!load_async) {
                n = r->num_tokens() - computed;
                // vLLM admits a one-token prompt straight into decode, padded with K placeholder
                // drafts, when the running queue's requests scheduled this step are all decoding
                // (uniform decode batches); requests admitted from the waiting queue do not count.
                if (s_.num_speculative_tokens > 0 && n == 1 && running_scheduled && !prefill_scheduled) {
                    n = 1 + s_.num_speculative_tokens;
                    if (n > budget || computed + n > s_.max_model_len) break;
                    pad = true;
                }
                if (0 < s_.long_prefill_token_threshold && s_.long_prefill_token_threshold < n)
                    n = s_.long_prefill_token_threshold;
                if (!s_.enable_chunked_prefill && n > budget) break;
                n = std::min(n, budget);
            }
            // SchedulerConfig.scheduler_reserve_full_isl (on by default): a waiting request is
            // admitted only when its whole sequence fits in the free blocks, not its first chunk
            // alone (kv_cache_manager.hpp: hit blocks in the free queue count against them). An
            // asynchronous load leaves room for what the prefills in flight still need.
            parity::kv::Allocation a = allocation(*r, n, &hits, /*admission=*/true);
            a.num_external = external;
            a.delay_cache = load_async;
            if (load_async) {
                a.num_lookahead = 0;
                a.reserved_blocks = inflight_reserved_blocks();
            }
            if (!kv_.allocate_slots(r->id, a, hash_of(*r))) break;
            if (connector_) connector_->after_alloc(r->id, r->external, kv_.blocks(r->id).front(), external);
            queue.pop_front();
            r->num_computed = computed;
            if (load_async) {  // its blocks are held while it waits
                r->remote_kvs = true;
                skipped.push_back(r);
                inflight_.insert(r->id);
                continue;
            }
            out.block_ids[r->id] = kv_.blocks(r->id);  // at admission: the whole table
            out.cached_tokens[r->id] = computed;       // local and external
            if (r->num_preemptions > 0) out.resent_token_ids.push_back(r->id);
            running_.push_back(r);
            (r->num_preemptions > 0 ? out.resumed : out.new_).push_back(r->id);
            r->running = true;
            if (computed + n < r->num_tokens()) inflight_.insert(r->id);  // still prefilling after this chunk
            take(r, n);
            if (pad) out.spec_tokens[r->id] = Tokens(s_.num_speculative_tokens, -1);
            if (s_.max_loras > 0 && r->lora) loras.insert(r->lora->id);
        }
        // The skipped requests go to the side queue (vLLM 0.27.1's skipped_waiting): FCFS at its
        // front in their order, the priority policy by its order.
        for (auto it = skipped.rbegin(); it != skipped.rend(); ++it) {
            if (s_.priority_policy) skipped_.insert(std::find_if(skipped_.begin(), skipped_.end(), after(**it)), *it);
            else skipped_.push_front(*it);
        }
        if (connector_) out.kv_loads = connector_->take_loads();
        out.finished_by_scheduler = std::exchange(errored_, {});
        if (s_.defer_block_free && !scheduled.empty()) ++sched_seq_;  // a step with tokens

        // The common prefix per group (vLLM's get_num_common_prefix_blocks).
        out.num_common_prefix_blocks = running_.empty() ? std::vector<std::int64_t>(kv_.num_groups(), 0)
                                                        : kv_.num_common_prefix_blocks(running_.front()->id);
        prev_scheduled_.clear();
        for (Request* r : scheduled) prev_scheduled_.insert(r->id);

        // The model runs on what was scheduled: computed tokens advance now (drafts included)
        // (Scheduler._update_after_schedule).
        for (Request* r : scheduled) {
            r->num_computed += out.num_scheduled_tokens[r->id];
            r->in_flight += out.num_scheduled_tokens[r->id];
            r->is_prefill_chunk = r->num_computed < r->num_tokens() + r->placeholders;
            r->last_sched_seq = sched_seq_;
            if (!r->is_prefill_chunk) inflight_.erase(r->id);
        }
        // AsyncScheduler._update_after_schedule: a request that samples in this step gains a
        // placeholder for its bonus token and one per scheduled draft, and K placeholder drafts
        // (-1) for its next step; the model runner fills in the real drafts itself.
        if (s_.async_scheduling)
            for (Request* r : scheduled) {
                if (r->is_prefill_chunk) continue;
                const auto drafts = out.spec_tokens.find(r->id);
                r->placeholders += 1 + (drafts == out.spec_tokens.end() ? 0 : static_cast<std::int64_t>(drafts->second.size()));
                r->spec = Tokens(s_.num_speculative_tokens, -1);
            }
        return out;
    }

    const Tokens& all_token_ids(const std::string& id) const override { return get(id).tokens; }
    std::int64_t num_computed_tokens(const std::string& id) const override { return get(id).num_computed; }

    void update_from_output(const parity::ScheduledStep& step, const std::map<std::string, Tokens>& sampled) override {
        emitted_.clear();
        if (s_.defer_block_free && !step.order.empty()) {  // every write of this step and those before is done
            ++processed_seq_;
            while (!deferred_.empty() && deferred_.front().first <= processed_seq_) {
                const auto& blocks = deferred_.front().second;
                kv_.free_blocks(std::vector<parity::kv::Block>(blocks.rbegin(), blocks.rend()));
                deferred_.pop_front();
            }
        }
        // A KV connector's failed loads first: the requests they roll back (or fail).
        std::set<std::string> failed_loads;
        if (step.kv_connector_output && !step.kv_connector_output->invalid_block_ids.empty())
            failed_loads = handle_invalid_blocks(step);
        for (const auto& id : step.order) {
            Request& r = get(id);
            r.in_flight -= step.num_scheduled_tokens.at(id);
            // The output of a step scheduled before the request's preemption: still appended,
            // but its computed tokens and placeholders were reset by the preemption.
            const bool stale = r.stale > 0;
            if (stale) r.stale -= step.num_scheduled_tokens.at(id);
            if (failed_loads.count(id)) continue;  // rolled back to recompute (or failed below)
            if (r.finish_reason) continue;  // finished (or aborted) while in flight: dropped
            if (stale && r.drop_stale) continue;  // dropped: it was resumed without waiting for it
            const Tokens& new_tokens = sampled.at(id);
            auto drafts = step.spec_tokens.find(id);
            if (drafts != step.spec_tokens.end() && !new_tokens.empty() && !stale) {
                // accepted = sampled - 1 (the bonus token); rejected drafts were not computed,
                // nor will they be output (placeholders)
                std::int64_t rejected =
                    static_cast<std::int64_t>(drafts->second.size()) - (static_cast<std::int64_t>(new_tokens.size()) - 1);
                if (r.num_computed > 0) r.num_computed -= rejected;
                if (r.placeholders > 0) r.placeholders -= rejected;
            }
            const bool was_running = r.running;
            if (!new_tokens.empty()) emitted_.push_back(id);  // a client output
            std::int64_t appended = 0;
            for (Token t : new_tokens) {  // append one by one; a stop drops the rest
                r.tokens.push_back(t);
                ++appended;
                check_stop(r, t);
                if (r.finish_reason) break;
            }
            if (s_.async_scheduling) {  // AsyncScheduler._update_request_with_output
                if (!stale) r.placeholders -= appended;
                // the blocks its known computed tokens fill are cached now, before any free
                if (was_running) cache_blocks(r, r.num_computed - r.placeholders);
            }
            if (r.finish_reason) {
                release(r);
                r.running = false;
                running_.erase(std::remove(running_.begin(), running_.end(), &r), running_.end());
                waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), &r), waiting_.end());  // a stale output
                skipped_.erase(std::remove(skipped_.begin(), skipped_.end(), &r), skipped_.end());
            }
        }
        // Under kv_load_failure_policy fail, a request whose load failed finishes as an error.
        if (!s_.kv_recompute)
            for (const auto& id : failed_loads) {
                finish(get(id), "error");
                emitted_.push_back(id);
                errored_.push_back(id);
            }
        if (step.kv_connector_output) kv_transfers_finished(step.kv_connector_output->finished_recving);
    }

    void abort(const std::string& id) override {
        Request& r = get(id);
        if (r.finish_reason) return;
        finish(r, "abort");
    }

    void update_draft_token_ids(const std::vector<std::pair<std::string, Tokens>>& drafts) override {
        for (const auto& [id, tokens] : drafts) {
            Request& r = get(id);
            if (r.finish_reason || !r.running) continue;
            if (r.is_prefill_chunk) {
                r.spec.clear();  // still prefilling: its drafts are meaningless
                continue;
            }
            r.spec = tokens;
        }
    }

    bool is_finished(const std::string& id) const override { return get(id).finish_reason.has_value(); }
    Tokens output_token_ids(const std::string& id) const override {
        const Request& r = get(id);
        return Tokens(r.tokens.begin() + r.num_prompt_tokens, r.tokens.end());
    }
    std::optional<std::string> finish_reason(const std::string& id) const override { return get(id).finish_reason; }
    std::optional<Token> stop_reason(const std::string& id) const override { return get(id).stop_reason; }
    Tokens draft_token_ids(const std::string& id) const override { return get(id).spec; }

    std::int64_t num_kv_blocks(const std::string& id) const override { return kv_.num_blocks_held(id); }
    parity::KvBlocks kv_blocks() const override {
        return {kv_.num_free(), s_.num_gpu_blocks - 1 - kv_.num_free(), kv_.num_cached()};
    }
    std::vector<std::string> waiting() const override {  // the side queue first, as vLLM's recorder lists them
        std::vector<std::string> out = ids(skipped_);
        for (const auto& id : ids(waiting_)) out.push_back(id);
        return out;
    }
    std::optional<std::vector<std::string>> emitted() const override { return emitted_; }
    bool drops_stale_output(const std::string& id) const override { return get(id).drop_stale; }
    std::vector<std::string> running() const override { return ids(running_); }
    std::int64_t num_output_placeholders(const std::string& id) const override { return get(id).placeholders; }
    std::int64_t num_stale_output_tokens(const std::string& id) const override { return get(id).stale; }
    bool is_prefill_chunk(const std::string& id) const override { return get(id).is_prefill_chunk; }

  private:
    struct Request {
        std::string id;
        Tokens tokens;  // prompt + outputs
        std::int64_t arrival_step = 0, priority = 0, num_prompt_tokens = 0, max_tokens = 0, num_computed = 0, num_preemptions = 0;
        std::vector<std::int64_t> hashes;         // its full blocks' hashes, computed once
        std::set<Token> stop_token_ids;
        std::int64_t min_tokens = 0;
        std::optional<Token> eos_token_id;
        std::optional<parity::standin::Repetition> repetition;
        std::optional<parity::Lora> lora;  // its adapter, if any
        std::optional<Token> stop_reason;
        Tokens spec;  // drafts proposed for the next step (under async scheduling: K placeholders, -1)
        bool running = false, is_prefill_chunk = false;
        // Async scheduling (vLLM's Request): num_output_placeholders, the tokens scheduled and
        // not yet updated (num_in_flight_tokens), and those of them scheduled before its
        // preemption (num_stale_output_tokens).
        std::int64_t placeholders = 0, in_flight = 0, stale = 0;
        std::optional<std::string> finish_reason;
        // A KV connector: what the remote store holds of it, and whether it waits for its
        // asynchronous load (vLLM's WAITING_FOR_REMOTE_KVS).
        std::optional<parity::External> external;
        bool remote_kvs = false;
        bool drop_stale = false;          // its stale output is dropped (vLLM's drop_stale_output)
        std::int64_t last_sched_seq = 0;  // the non-empty step that last scheduled it (defer_block_free)
        std::int64_t num_tokens() const { return static_cast<std::int64_t>(tokens.size()); }
        std::int64_t num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
    };

    Request& get(const std::string& id) const { return *requests_.at(id); }

    // vLLM 0.27.1's check_stop after each appended token: min_tokens holds back every stop;
    // then the eos token (no stop_reason), a stop token (its stop_reason), the length caps,
    // and last the repetition check.
    void check_stop(Request& r, Token t) const {
        if (r.num_output_tokens() < r.min_tokens && !g_ignore_min_tokens) return;
        if (r.eos_token_id && t == *r.eos_token_id) {
            r.finish_reason = "stop";
        } else if (r.stop_token_ids.count(t)) {
            r.finish_reason = "stop";
            r.stop_reason = t;
        } else if (r.num_tokens() >= s_.max_model_len || r.num_output_tokens() >= r.max_tokens) {
            r.finish_reason = "length";
        } else if (r.repetition && parity::standin::repeats(r.tokens, static_cast<std::size_t>(r.num_prompt_tokens),
                                                    *r.repetition)) {
            r.finish_reason = "repetition";
        }
    }

    template <typename Queue>
    static std::vector<std::string> ids(const Queue& queue) {
        std::vector<std::string> out;
        for (const Request* r : queue) out.push_back(r->id);
        return out;
    }

    static parity::kv::Settings kv_settings(const Settings& s) {
        parity::kv::Settings kv;
        kv.num_blocks = s.num_gpu_blocks;
        kv.block_size = s.block_size;
        kv.max_model_len = s.max_model_len;
        kv.caching = s.enable_prefix_caching;
        kv.eagle = s.eagle_family;
        kv.groups = s.kv_groups;
        kv.max_in_flight_tokens = s.max_in_flight_tokens;
        return kv;
    }
    static bool all_empty(const parity::kv::Tables& tables) {
        return std::all_of(tables.begin(), tables.end(), [](const auto& g) { return g.empty(); });
    }
    parity::kv::HashOf hash_of(Request& r) {
        return [this, &r](std::int64_t i) { return hash(r, i); };
    }
    // allocate_slots's arguments for `n` new tokens of `r` (an admission: with its hits, and
    // only if its whole sequence fits).
    parity::kv::Allocation allocation(const Request& r, std::int64_t n, const parity::kv::Hit* hits, bool admission) const {
        parity::kv::Allocation a;
        a.num_computed = r.num_computed;
        a.num_tokens = r.num_tokens();
        a.num_new_tokens = n;
        a.num_lookahead = s_.num_lookahead_tokens;
        a.num_in_flight = r.in_flight;
        a.hit = hits;
        a.full_sequence_must_fit = admission;
        return a;
    }

    // KV blocks for computed + new tokens plus the lookahead slots of the drafts to come, taken
    // from the free queue's head (the new ones per group in `added`); then the blocks the
    // scheduled tokens fill are cached, drafts and lookahead slots never (allocate_slots).
    bool allocate(Request& r, std::int64_t n, parity::kv::Tables* added = nullptr) {
        auto got = kv_.allocate_slots(r.id, allocation(r, n, nullptr, false), hash_of(r));
        if (!got) return false;
        if (added) *added = std::move(*got);
        return true;
    }

    // Caches the request's blocks fully covered by `tokens` (at most its known tokens) that do
    // not yet hold their hash (KVCacheManager.cache_blocks).
    void cache_blocks(Request& r, std::int64_t tokens) { kv_.cache_blocks(r.id, hash_of(r), std::min(tokens, r.num_tokens())); }

    // Block i's hash (a full block of its tokens).
    std::int64_t hash(Request& r, std::int64_t i) {
        while (static_cast<std::int64_t>(r.hashes.size()) <= i) {
            const std::int64_t j = static_cast<std::int64_t>(r.hashes.size());
            const Tokens block(r.tokens.begin() + j * s_.block_size, r.tokens.begin() + (j + 1) * s_.block_size);
            r.hashes.push_back(hashes_.of(j == 0 ? -1 : r.hashes.back(), block, r.lora ? r.lora->name : ""));
        }
        return r.hashes[i];
    }

    // The cached blocks a request admitted now hits: at most its tokens - 1, the longest hit
    // every KV cache group serves (an EAGLE-family method drops the last hit block).
    parity::kv::Hit lookup(Request& r) { return kv_.find_longest_cache_hit(hash_of(r), r.num_tokens() - 1); }

    // A finished or preempted request gives its blocks back (each group last block first).
    void release(Request& r) {
        inflight_.erase(r.id);
        // with a connector, the blocks out of the window go first (Scheduler._connector_finished)
        if (connector_ && r.finish_reason)
            kv_.remove_skipped_blocks(r.id, std::max<std::int64_t>(0, r.num_computed - r.in_flight));
        free_blocks(r);
    }
    // _free_request_blocks: now, or, where a step in flight may still write them, once it is
    // processed (deferred, all groups' blocks together, freed last first).
    void free_blocks(const Request& r) {
        if (!s_.defer_block_free || r.last_sched_seq <= processed_seq_) {
            kv_.free(r.id);
            return;
        }
        auto blocks = kv_.pop_blocks(r.id);
        if (!blocks.empty()) deferred_.emplace_back(sched_seq_, std::move(blocks));
    }

    // ---- a KV connector's paths (Scheduler in vllm/v1/core/sched/scheduler.py) ----

    // Scheduler.finish_requests (one id): out of its queue, finished, its blocks freed, unless an
    // asynchronous load still writes them: then they go when the load is reported.
    void finish(Request& r, const std::string& reason) {
        running_.erase(std::remove(running_.begin(), running_.end(), &r), running_.end());
        waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), &r), waiting_.end());
        skipped_.erase(std::remove(skipped_.begin(), skipped_.end(), &r), skipped_.end());
        bool delay_free = false;
        if (r.remote_kvs) {
            delay_free = !finished_recving_.count(r.id);
            finished_recving_.erase(r.id);
            failed_recving_.erase(r.id);
        }
        r.spec.clear();
        r.running = false;
        r.finish_reason = reason;
        if (!delay_free) {
            release(r);
            return;
        }
        inflight_.erase(r.id);
        kv_.remove_skipped_blocks(r.id, std::max<std::int64_t>(0, r.num_computed - r.in_flight));
    }

    // _try_promote_blocked_waiting_request: a request whose load a model runner output reported
    // finished is schedulable again; its loaded blocks are cached now. A failed load keeps the
    // tokens before its first invalid block, or, with none left, gives its blocks back (the
    // connector is asked again).
    bool promote(Request& r) {
        if (!finished_recving_.count(r.id)) return false;
        if (failed_recving_.count(r.id)) {
            if (r.num_computed > 0) cache_blocks(r, r.num_computed);
            else kv_.free(r.id);
            failed_recving_.erase(r.id);
        } else {
            cache_blocks(r, r.num_computed);
            if (r.num_computed == r.num_tokens()) r.num_computed = r.num_tokens() - 1;  // recompute the last token
        }
        finished_recving_.erase(r.id);
        r.remote_kvs = false;
        return true;
    }

    // _inflight_prefill_reserved_blocks: the blocks the prefills in flight still need.
    std::int64_t inflight_reserved_blocks() const {
        std::int64_t n = 0;
        for (const auto& id : inflight_) n += kv_.remaining_blocks(id, get(id).num_tokens(), get(id).num_computed);
        return n;
    }

    // _update_requests_with_invalid_blocks: each request holding an invalid block among those
    // of its computed tokens (before this step's) is rolled back to the tokens before the first;
    // a block shared with a request before it is recomputed by that one. Returns the affected
    // requests; `evict` collects the invalid blocks and those after them.
    std::set<std::string> roll_back(const std::vector<Request*>& requests, const std::set<std::int64_t>& invalid,
                                    const parity::ScheduledStep& step, std::set<std::int64_t>* evict) {
        std::set<std::string> affected;
        std::set<std::int64_t> marked;
        for (Request* r : requests) {
            const std::vector<std::int64_t> blocks = kv_.blocks(r->id).front();
            const auto n = step.num_scheduled_tokens.find(r->id);
            const std::int64_t computed = r->num_computed - (n == step.num_scheduled_tokens.end() ? 0 : n->second);
            const std::int64_t num_blocks = (computed + s_.block_size - 1) / s_.block_size;
            bool is_affected = false, rolled_back = false;
            for (std::int64_t i = 0; i < std::min<std::int64_t>(num_blocks, static_cast<std::int64_t>(blocks.size())); ++i) {
                if (!invalid.count(blocks[i])) continue;
                is_affected = true;
                if (!marked.insert(blocks[i]).second || rolled_back) continue;
                rolled_back = true;
                r->num_computed = i * s_.block_size;
                if (evict) evict->insert(blocks.begin() + i, blocks.end());
            }
            if (!is_affected) continue;
            if (!rolled_back) r->num_computed = computed;
            affected.insert(r->id);
        }
        return affected;
    }

    // _handle_invalid_blocks: the requests whose load failed, asynchronous (waiting for it) and
    // synchronous (running). Under the policy recompute, the asynchronous ones retry when their
    // load is reported and the synchronous ones (returned) recompute; under fail, all are
    // returned, their blocks' hashes evicted.
    std::set<std::string> handle_invalid_blocks(const parity::ScheduledStep& step) {
        const auto& ids = step.kv_connector_output->invalid_block_ids;
        const std::set<std::int64_t> invalid(ids.begin(), ids.end());
        std::vector<Request*> loading;
        for (Request* r : skipped_)
            if (r->remote_kvs) loading.push_back(r);
        const std::set<std::string> async_failed = roll_back(loading, invalid, step, nullptr);
        std::set<std::int64_t> evict;
        std::set<std::string> sync_failed = roll_back(running_, invalid, step, &evict);
        if (async_failed.empty() && sync_failed.empty()) return {};
        if (!s_.kv_recompute) {
            if (!evict.empty()) kv_.evict_blocks(evict);
            sync_failed.insert(async_failed.begin(), async_failed.end());
            return sync_failed;
        }
        failed_recving_.insert(async_failed.begin(), async_failed.end());
        return sync_failed;
    }

    // _update_from_kv_xfer_finished: a finished load makes its request schedulable; one whose
    // request finished meanwhile frees its blocks now.
    void kv_transfers_finished(const std::vector<std::string>& finished_recving) {
        for (const auto& id : finished_recving) {
            Request& r = get(id);
            if (!r.finish_reason && r.remote_kvs) finished_recving_.insert(id);
            else free_blocks(r);  // held for the load since its request finished
        }
    }

    // FCFS preempts the last running request. The priority policy preempts the lowest priority
    // (the largest value), then the latest arrival: max() over the running queue by (priority,
    // arrival time), which keeps the first of equals. The oracle's arrival time is the arrival step.
    Request* pick_victim() const {
        if (!s_.priority_policy) return running_.back();
        Request* victim = running_.front();
        for (Request* r : running_)
            if (std::make_pair(r->priority, r->arrival_step) > std::make_pair(victim->priority, victim->arrival_step))
                victim = r;
        return victim;
    }

    // FCFS: at the back of the waiting queue. Priority: a heap ordered by (priority, arrival time,
    // request id), taken (and recorded) in that order.
    void enqueue_waiting(Request& r, bool front = false) {
        if (!s_.priority_policy) {
            if (front) waiting_.push_front(&r);
            else waiting_.push_back(&r);
            return;
        }
        waiting_.insert(std::find_if(waiting_.begin(), waiting_.end(), after(r)), &r);
    }

    // Whether a queued request comes after `r` in the priority heap's order.
    static std::function<bool(const Request*)> after(const Request& r) {
        return [&r](const Request* w) {
            return std::make_tuple(w->priority, w->arrival_step, w->id) > std::make_tuple(r.priority, r.arrival_step, r.id);
        };
    }

    // The queue the next waiting request comes from (Scheduler._select_waiting_queue_for_scheduling):
    // FCFS drains the side queue first; the priority policy takes the earlier of the two heads.
    std::deque<Request*>& next_queue() {
        if (skipped_.empty()) return waiting_;
        if (waiting_.empty() || !s_.priority_policy) return skipped_;
        return after(*skipped_.front())(waiting_.front()) ? skipped_ : waiting_;
    }

    // Back to the waiting queue (FCFS: at its front); everything is recomputed on resumption.
    void preempt(Request& r) {
        release(r);  // (out of the prefills in flight too)
        r.num_computed = 0;
        r.spec.clear();
        r.running = false;
        // Async scheduling: its output in flight becomes stale, its placeholders are dropped. A
        // connector that hands KV off (kv_producer, kv_both) drops that output instead.
        r.drop_stale = s_.requires_kv_delivery || (r.drop_stale && r.stale > 0);
        r.stale = r.in_flight;
        r.placeholders = 0;
        ++r.num_preemptions;
        enqueue_waiting(r, /*front=*/true);
    }

    Settings s_;
    parity::kv::KvCacheManager kv_;
    BlockHashes hashes_;
    // A KV connector (src/kv_connector.hpp, the stand-in's remote store), if configured, and the
    // scheduler's state about its loads (requests waiting for one are in skipped_): the loads
    // reported finished and those that failed, and the prefills in flight whose remaining blocks
    // an asynchronous load must leave free.
    std::optional<parity::kv::StandInConnector> connector_;
    std::set<std::string> finished_recving_, failed_recving_, inflight_;
    std::vector<std::string> emitted_;  // the requests the last update made a client output for
    std::vector<std::string> errored_;  // finished as an error since the last schedule()
    // defer_block_free (a consumer connector under async scheduling): a request's blocks a step
    // in flight may still write are freed once that step's output is processed. Non-empty steps
    // scheduled and processed, and the deferred frees with their fence.
    std::int64_t sched_seq_ = 0, processed_seq_ = 0;
    std::deque<std::pair<std::int64_t, std::vector<parity::kv::Block>>> deferred_;
    std::set<std::string> prev_scheduled_;  // scheduled at the step before
    std::map<std::string, std::unique_ptr<Request>> requests_;
    std::vector<Request*> running_;
    std::deque<Request*> waiting_;
    // vLLM 0.27.1's skipped_waiting: requests a step skipped for a reason of their own (an
    // adapter over max_loras, a KV connector load in flight), taken before `waiting_` under FCFS
    std::deque<Request*> skipped_;
};

// ---- the run handler: layers -> records ----------------------------------------------------

void handle_run(parity::Session& session, const json& message) {
    std::vector<std::string> layers;
    for (const auto& layer : message["layers"]) {
        if (!layer.is_string()) throw RunError(ErrorKind::bad_request, "run.layers must be a list of strings");
        layers.push_back(layer.get<std::string>());
    }
    for (const auto& layer : layers)
        if (std::find(kServed.begin(), kServed.end(), layer) == kServed.end())
            throw RunError(ErrorKind::unsupported,
                           "the reference engine serves config, steps and outputs, not " + layer +
                               (layer.rfind("engine_", 0) == 0 ? " (the engine layers need a real model runner)" : ""));

    const parity::Scenario scenario = parity::read_scenario(message["scenario"]);
    Settings settings;
    const ConfigRecord config = resolve_config(scenario.engine_args, settings);

    std::optional<parity::WorkloadResult> result;  // one drive serves both steps and outputs
    auto drive = [&]() -> const parity::WorkloadResult& {
        if (!result) {
            if (!scenario.workload)
                throw RunError(ErrorKind::bad_request, "the steps and outputs layers need a workload; this scenario has none");
            SimpleScheduler scheduler(settings);
            // The loop vLLM runs for this configuration on a GPU host: the batch queue where async
            // scheduling resolves on (config.batch_queue_size batches), else the synchronous one.
            if (config.async_scheduling_gpu)
                result = parity::run_workload_async(*scenario.workload, settings.num_speculative_tokens, scheduler,
                                                    g_sync_loop ? 1 : config.batch_queue_size);
            else
                result = parity::run_workload(*scenario.workload, settings.num_speculative_tokens, scheduler);
        }
        return *result;
    };
    for (const auto& layer : layers) {
        if (layer == "config") {
            session.record("config", config.to_json());
        } else if (config.refused) {  // a refused configuration is the result of every layer
            session.record(layer, {{"refused", config.refused->to_json()}});
        } else if (layer == "steps") {
            for (const auto& step : drive().steps) session.record("steps", step.to_json());
        } else if (layer == "outputs") {
            for (const auto& output : drive().outputs) session.record("outputs", output.to_json());
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--no-draft-reservation") {
            g_no_draft_reservation = true;
        } else if (arg == "--sync-loop") {
            g_sync_loop = true;
        } else if (arg == "--ignore-min-tokens") {
            g_ignore_min_tokens = true;
        } else {
            std::fprintf(stderr, "usage: reference_engine [--no-draft-reservation] [--sync-loop] [--ignore-min-tokens]\n");
            return 2;
        }
    }
    parity::Session session(stdout);
    session.hello(kEngineName, kEngineVersion, kServed, nullptr, kFeatures);
    return parity::serve(session, stdin, handle_run);
}
