// The one interface a port implements to put its scheduler under the `steps` and `outputs`
// layers, and the driver that runs it on a scenario's workload with the stand-in.
//
// It mirrors the part of vLLM's v1 Scheduler the engine core calls each step
// (add_request, schedule, update_from_output, update_draft_token_ids) plus what the driver
// must read back about a request. Wrap your scheduler in an adapter that implements it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "parity/records.hpp"
#include "parity/scenario.hpp"
#include "parity/standin.hpp"

namespace parity {

using standin::Token;
using standin::Tokens;

// A KV connector (engines/PROTOCOL.md "A KV connector: the remote store and its loads"): a
// load a schedule() issued (vLLM's connector metadata), which the stand-in worker reports.
struct KvLoad {
    std::string id;
    std::vector<std::int64_t> block_ids;      // the blocks of the loaded range, first KV cache group
    std::optional<std::int64_t> async_steps;  // none: synchronous (ends within its step)
    bool fail = false;                        // the load fails: its first block is reported invalid
};

// The connector's part of a model runner output (vLLM's KVConnectorOutput).
struct KvConnectorOutput {
    std::vector<std::string> finished_recving;  // asynchronous loads that finished
    std::vector<std::int64_t> invalid_block_ids;  // blocks whose load failed
};

// What schedule() decided for one step.
struct ScheduledStep {
    std::vector<std::string> order;                    // scheduled request ids, in batch order
    std::map<std::string, std::int64_t> num_scheduled_tokens;  // id -> tokens this step
    std::map<std::string, Tokens> spec_tokens;         // id -> draft tokens scheduled for verification
    std::vector<std::string> new_, resumed, preempted;  // first scheduled / resumed / preempted this step
    std::int64_t token_budget = 0;                      // the step's budget (max_num_scheduled_tokens)
    // The identities the scheduler output hands out (engines/PROTOCOL.md "steps request entry"):
    // id -> per KV cache group: its block table at admission (the null block, 0, where a
    // sliding-window group dropped a block), its new blocks at a running step; absent: none (null)
    std::map<std::string, std::vector<std::vector<std::int64_t>>> block_ids;
    std::map<std::string, std::int64_t> cached_tokens;  // id -> prefix-cache hit tokens of its admission
    std::vector<std::string> resent_token_ids;          // ids whose whole token ids the output carries
    std::vector<std::int64_t> num_common_prefix_blocks{0};  // per KV cache group, after this step's admissions
    // A KV connector: the loads this schedule() issued. The driver plays the connector's worker
    // side and hands update_from_output() the output's connector part (nullopt: no connector).
    std::vector<KvLoad> kv_loads;
    std::optional<KvConnectorOutput> kv_connector_output;
    // Requests the scheduler itself finished through finish_requests() since the schedule()
    // before (a failed KV load's error): vLLM's recorder lists them in the record's `aborted`
    // beside the driver's aborts.
    std::vector<std::string> finished_by_scheduler;
};

struct KvBlocks {
    std::int64_t free = 0, used = 0, cached = 0;  // cached: blocks holding a prefix-cache hash
};

class PortScheduler {
  public:
    virtual ~PortScheduler() = default;
    // A request arrives (before the schedule() of its arrival step). `prompt` holds its
    // stand-in prompt tokens; greedy sampling, EOS ignored, stop_token_ids and max_tokens apply.
    virtual void add_request(const RequestSpec& spec, Tokens prompt) = 0;
    // Aborts an unfinished request (vLLM's finish_requests(id, FINISHED_ABORTED), one id per
    // call), waiting, running or preempted: it leaves its queue and frees its blocks at once
    // (last block first); its finish reason is "abort".
    virtual void abort(const std::string& id) = 0;
    // Decide this step. Advances each scheduled request's computed tokens by its scheduled
    // tokens (drafts included), as vLLM does before the model runs.
    virtual ScheduledStep schedule() = 0;
    // The request's prompt and output tokens so far, and its computed tokens.
    virtual const Tokens& all_token_ids(const std::string& id) const = 0;
    virtual std::int64_t num_computed_tokens(const std::string& id) const = 0;
    // The model runner's answer: id -> sampled tokens (empty for a prefill chunk that does
    // not end the prompt; accepted drafts plus a bonus token otherwise). Rejected drafts
    // give back their computed tokens; stop conditions are checked token by token.
    virtual void update_from_output(const ScheduledStep& step, const std::map<std::string, Tokens>& sampled) = 0;
    // The drafter's K proposals for each request of the batch just run (finished requests
    // and prefill chunks ignore theirs).
    virtual void update_draft_token_ids(const std::vector<std::pair<std::string, Tokens>>& drafts) = 0;
    virtual bool is_finished(const std::string& id) const = 0;
    virtual Tokens output_token_ids(const std::string& id) const = 0;
    virtual std::optional<std::string> finish_reason(const std::string& id) const = 0;  // "length"/"stop"/"abort"
    // The stop token a request stopped on (finish reason "stop"), else nullopt.
    virtual std::optional<Token> stop_reason(const std::string& id) const = 0;
    // The drafts it holds for its next step, as update_draft_token_ids() kept them
    // (`next_draft_token_ids`: empty for a finished or prefilling request, and without speculation).
    virtual Tokens draft_token_ids(const std::string& id) const = 0;
    // The state each step record carries, read after update_from_output():
    // KV blocks the request holds (0 once finished, its blocks freed),
    virtual std::int64_t num_kv_blocks(const std::string& id) const = 0;
    // the KV cache's free blocks, the blocks requests hold (neither counts vLLM's null block) and
    // the blocks holding a prefix-cache hash,
    virtual KvBlocks kv_blocks() const = 0;
    // the waiting queue in the order the scheduler takes from it (a preempted request goes
    // back to its front under FCFS), and the running queue in its own order (newly admitted
    // requests at its end; under FCFS the last one is the next preemption victim).
    virtual std::vector<std::string> waiting() const = 0;
    virtual std::vector<std::string> running() const = 0;

    // Async scheduling: what run_workload_async() reads of a scheduler that behaves as vLLM's
    // AsyncScheduler (engines/PROTOCOL.md "Async scheduling: the batch-queue loop"). A port
    // running only the synchronous loop leaves them as they are (and its hello leaves the
    // feature `async_scheduling` out).
    //
    // Its output placeholders (vLLM's num_output_placeholders): tokens scheduled for it whose
    // output has not been applied yet; 0 once preempted.
    virtual std::int64_t num_output_placeholders(const std::string& /*id*/) const { return 0; }
    // The tokens of steps in flight when it was preempted, not yet come back (vLLM's
    // num_stale_output_tokens): their output is still appended, but changes neither its
    // computed tokens nor its placeholders.
    virtual std::int64_t num_stale_output_tokens(const std::string& /*id*/) const { return 0; }
    // Whether that stale output is dropped rather than appended (vLLM's drop_stale_output: a KV
    // connector that hands KV off, kv_producer or kv_both, drops it): its delivery is "dropped".
    virtual bool drops_stale_output(const std::string& /*id*/) const { return false; }
    // Read right after schedule(): whether its computed tokens stay below its tokens plus the
    // placeholders it had before this schedule() (vLLM's Request.is_prefill_chunk, set by
    // _update_after_schedule before the AsyncScheduler adds this step's placeholders). The
    // stand-in model runner samples a request only when it is false.
    virtual bool is_prefill_chunk(const std::string& /*id*/) const {
        throw RunError(ErrorKind::internal,
                       "run_workload_async() needs PortScheduler::is_prefill_chunk(); this port does not implement it");
    }

    // The requests the last update_from_output() made a client output for (vLLM's
    // EngineCoreOutput: a sampled token, or a finish such as a failed KV load's error), sorted or
    // not. nullopt (the default): those of its step that sampled a token, which is exact
    // without a KV connector.
    virtual std::optional<std::vector<std::string>> emitted() const { return std::nullopt; }
};

// Every request's prompt: request_prompt(workload, id) of conformance/formats/workload.py
// (a shared prefix's tokens, or the continued request's prompt and expected output, then its own).
std::map<std::string, Tokens> request_prompts(const Workload& workload);

struct WorkloadResult {
    std::vector<StepRecord> steps;
    std::vector<OutputRecord> outputs;  // sorted by id
};

// Drives `scheduler` over the workload exactly as engines/vllm/steps_layer.py drives vLLM's:
//   add the requests arriving at step n; abort those whose abort_step is n (one id per call,
//   in workload order); stop when every request has finished, unless one was aborted at n;
//   schedule(); the stand-in samples (verify() of the scheduled drafts); update_from_output();
//   record the state (computed and output tokens, KV blocks, queues);
//   if K > 0 and tokens were scheduled: draft() K tokens per scheduled request with the
//   acceptance of its pattern (indexed by its verify steps so far); update_draft_token_ids().
// A verify step of a request is a step that scheduled drafts for it (the placeholder drafts
// vLLM pads a request admitted with one token left to compute with included) and whose tokens
// reach the end of its known tokens, so the stand-in samples; a step whose drafts were cut to
// none is not one (engines/PROTOCOL.md, `steps`, states the whole contract).
// Throws RunError(internal) when the workload does not finish within max_steps.
WorkloadResult run_workload(const Workload& workload, std::int64_t k, PortScheduler& scheduler);

// Drives `scheduler` (vLLM's AsyncScheduler behaviour, above) over the workload exactly as
// engines/vllm/async_loop.py drives vLLM's own EngineCore.step_with_batch_queue, for a
// configuration whose `config` record says async_scheduling_gpu (its batch_queue_size is the
// queue's size, 2). Driver iteration i:
//   add the requests arriving at i; abort those whose abort_step is i (one id per call, in
//   workload order), while the batch of the iteration before may still be in flight;
//   stop when every request has arrived, the scheduler has no requests (none unfinished, no
//   finished one a schedule() has not yet reported) and the queue is empty;
//   if the scheduler has requests: schedule() -> batch b (step record number s), which the
//   stand-in model runner executes at once (it keeps each request's tokens and drafts itself:
//   the scheduler's -1 drafts are replaced by its own for the requests that sampled in the
//   last batch with tokens); b joins the queue; if the queue has room and b scheduled tokens or
//   the scheduler still has requests, the iteration ends here;
//   update_from_output() from the oldest batch in the queue, whose record is read then.
// There is no drafting step (update_draft_token_ids() is never called): each record's
// next_draft_token_ids stay empty. Records come in update order (step order), each with
// `iteration` / `update_iteration`, and per request `output_placeholders` and `delivery`.
// `batch_queue_size` 1 gives the synchronous order (each batch updated before the next is
// scheduled): not vLLM's loop under async scheduling, which the gate reports as a divergence.
// Throws RunError(internal) when the workload does not finish within max_steps iterations.
WorkloadResult run_workload_async(const Workload& workload, std::int64_t k, PortScheduler& scheduler,
                                  std::int64_t batch_queue_size = 2);

}  // namespace parity
