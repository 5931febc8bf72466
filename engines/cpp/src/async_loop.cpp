// The batch-queue loop: run_workload_async() (include/parity/scheduler.hpp), a port of
// engines/vllm/async_loop.py, which runs vLLM's own EngineCore.step_with_batch_queue
// (vllm/v1/engine/core.py) with the stand-in as its executor, and of the fields its
// recorder adds under async scheduling (engines/vllm/recorder.py AsyncRecording).
// engines/PROTOCOL.md "Async scheduling: the batch-queue loop" states the contract.
#include <algorithm>
#include <deque>
#include <set>

#include "driver_parts.hpp"

namespace parity {
namespace {

// async_loop.py StandInExecutor: the stand-in model runner as vLLM's V1 GPU model runner
// behaves under async scheduling. It keeps each request's tokens and the drafts it proposed
// itself, and puts its drafts in place of the scheduler's -1 placeholders for the requests
// that sampled in the previous batch that had tokens; any other request verifies the -1s,
// so none of its drafts are accepted. vLLM's loop runs a batch right after its schedule(),
// before any other schedule(): it is computed from the scheduler's state at that moment.
class StandInExecutor {
  public:
    StandInExecutor(const Workload& workload, std::int64_t k)
        : k_(k), seed_(workload.seed), vocab_(workload.vocab_size), transfers_(workload.kv_connector) {
        for (const auto& r : workload.requests) {
            patterns_[r.id] = &r.acceptance;
            verified_[r.id] = 0;  // verify steps so far
        }
    }

    // execute_model() + sample_tokens() of one batch: id -> sampled tokens. `finished` are the
    // scheduler output's finished_req_ids (finished since the schedule() before).
    // The connector's report (the stand-in worker's KV transfers) goes into out.kv_connector_output:
    // an output without tokens still carries it (vLLM's kv_connector_no_forward).
    std::map<std::string, Tokens> execute(ScheduledStep& out, const std::vector<std::string>& finished,
                                          const PortScheduler& scheduler) {
        const std::vector<std::string>& preempted = out.preempted;
        for (const auto* ids : {&finished, &preempted})
            for (const auto& id : *ids) {
                tokens_.erase(id);
                drafts_.erase(id);
            }
        out.kv_connector_output = transfers_.output(executed_++, out);
        std::map<std::string, Tokens> sampled;
        std::int64_t total = 0;
        for (const auto& [id, n] : out.num_scheduled_tokens) total += n;
        if (total == 0) return sampled;  // returns before the batch: `previous_` stays
        // A request samples when its computed tokens after scheduling reach its tokens and
        // placeholders: vLLM's own is_prefill_chunk, set by schedule() just now.
        std::map<std::string, bool> samples;
        for (const auto& id : out.order) samples[id] = !scheduler.is_prefill_chunk(id);
        const std::set<std::string> fresh = [&] {
            std::set<std::string> ids(out.new_.begin(), out.new_.end());
            ids.insert(out.resumed.begin(), out.resumed.end());
            return ids;
        }();
        for (const auto& id : out.order) {
            if (fresh.count(id) || !tokens_.count(id)) tokens_[id] = scheduler.all_token_ids(id);
            if (!samples.at(id)) {
                sampled[id] = {};  // a prefill chunk that does not reach the end: no sample
                continue;
            }
            const auto spec = out.spec_tokens.find(id);
            const std::size_t slots = spec == out.spec_tokens.end() ? 0 : spec->second.size();
            Tokens drafts(slots, -1);
            const auto mine = drafts_.find(id);
            if (slots && previous_.count(id) && mine != drafts_.end())
                drafts.assign(mine->second.begin(),
                              mine->second.begin() + static_cast<std::ptrdiff_t>(std::min(slots, mine->second.size())));
            if (!drafts.empty()) ++verified_[id];
            Tokens got = standin::verify(seed_, tokens_[id], drafts, vocab_);
            Tokens& own = tokens_[id];
            own.insert(own.end(), got.begin(), got.end());  // not cut at a stop: the scheduler drops the rest
            if (k_) {
                const auto& pattern = *patterns_.at(id);
                const std::int64_t accept = pattern[static_cast<std::size_t>(verified_[id]) % pattern.size()];
                drafts_[id] = standin::draft(seed_, own, k_, accept, vocab_);
            }
            sampled[id] = std::move(got);
        }
        previous_.clear();
        for (const auto& [id, got] : sampled)
            if (!got.empty()) previous_.insert(id);
        return sampled;
    }

  private:
    std::int64_t k_;
    std::uint64_t seed_;
    std::int64_t vocab_;
    std::map<std::string, const std::vector<std::int64_t>*> patterns_;
    std::map<std::string, std::int64_t> verified_;
    std::map<std::string, Tokens> tokens_;  // the runner's own copy of each request's tokens
    std::map<std::string, Tokens> drafts_;  // what it proposed after the request's last sample
    std::set<std::string> previous_;        // requests that sampled in the last batch with tokens
    detail::KvTransfers transfers_;         // the KV connector's worker side, if any
    std::int64_t executed_ = 0;             // batches executed (schedule() calls) so far
};

// One scheduled batch in the queue: its scheduler output, the stand-in's answer, its record.
struct Batch {
    ScheduledStep out;
    std::map<std::string, Tokens> sampled;
    StepRecord rec;
};

}  // namespace

WorkloadResult run_workload_async(const Workload& workload, std::int64_t k, PortScheduler& scheduler,
                                  std::int64_t batch_queue_size) {
    // async_loop.py _drive: arrivals and aborts by iteration.
    std::map<std::int64_t, std::vector<const RequestSpec*>> arrivals, aborts;
    const std::map<std::string, Tokens> prompts = request_prompts(workload);
    std::map<std::string, const RequestSpec*> specs;
    for (const auto& r : workload.requests) {
        arrivals[r.arrival_step].push_back(&r);
        specs[r.id] = &r;
        if (r.abort_step) aborts[*r.abort_step].push_back(&r);
    }
    StandInExecutor executor(workload, k);
    std::set<std::string> added;
    // vLLM's finished_req_ids: requests finished (by an update or an abort) since the last
    // schedule(), which reports them. While it is not empty the scheduler has_requests().
    std::vector<std::string> finished_unreported;
    std::vector<std::string> aborted;  // aborted since the last schedule(): its record's `aborted`
    auto has_requests = [&] {  // SchedulerInterface.has_requests()
        if (!finished_unreported.empty()) return true;
        for (const auto& id : added)
            if (!scheduler.is_finished(id)) return true;
        return false;
    };
    std::deque<Batch> queue;  // front: the oldest batch (vLLM pops it from the deque's right)
    std::int64_t steps = 0;   // schedule() calls so far
    WorkloadResult result;

    for (std::int64_t iteration = 0;; ++iteration) {
        if (auto it = arrivals.find(iteration); it != arrivals.end())
            for (const RequestSpec* r : it->second) {
                scheduler.add_request(*r, prompts.at(r->id));
                added.insert(r->id);
            }
        // A client's aborts land between two iterations, as vLLM's busy loop takes them from
        // its input queue before the next step, while the batch of the iteration before may
        // still be in flight: its output for them is dropped. A finished request the next
        // schedule() reports keeps has_requests() true, so it is recorded.
        if (auto it = aborts.find(iteration); it != aborts.end())
            for (const RequestSpec* r : it->second)
                if (!scheduler.is_finished(r->id)) {  // one id per call, in workload order
                    scheduler.abort(r->id);
                    aborted.push_back(r->id);
                    finished_unreported.push_back(r->id);
                }
        if (added.size() == specs.size() && !has_requests() && queue.empty()) break;
        if (iteration >= workload.max_steps)
            throw RunError(ErrorKind::internal, "the workload did not finish within max_steps=" +
                                                    std::to_string(workload.max_steps) + " driver iterations");

        // EngineCore.step_with_batch_queue: schedule while the queue has room ...
        if (has_requests()) {
            Batch batch;
            batch.out = scheduler.schedule();
            batch.rec = detail::open_record(batch.out, steps++, aborted);
            batch.rec.iteration = iteration;
            aborted.clear();
            // execute_model() + sample_tokens() right away, on the state schedule() left.
            batch.sampled = executor.execute(batch.out, finished_unreported, scheduler);
            finished_unreported.clear();  // this scheduler output reported them
            const bool executed = batch.rec.total_num_scheduled_tokens > 0;
            queue.push_back(std::move(batch));
            if (static_cast<std::int64_t>(queue.size()) < batch_queue_size && (executed || has_requests()))
                continue;  // don't block on the oldest batch while the queue has room
        } else if (queue.empty()) {
            continue;  // nothing scheduled, nothing in flight
        }

        // ... then update from the oldest batch's output.
        Batch batch = std::move(queue.front());
        queue.pop_front();
        StepRecord& rec = batch.rec;
        std::vector<std::string> unfinished;
        for (const auto& id : added)
            if (!scheduler.is_finished(id)) unfinished.push_back(id);
        // What the update does with each output, read before it as vLLM reads it
        // (scheduler.py update_from_output; recorder.py AsyncRecording._parity_delivery).
        for (auto& [id, entry] : rec.requests) {
            if (scheduler.is_finished(id)) entry.delivery = "dropped";
            else if (scheduler.num_stale_output_tokens(id) > 0)
                entry.delivery = scheduler.drops_stale_output(id) ? "dropped" : "stale";
            else entry.delivery = "applied";
            const Tokens& got = batch.sampled.at(id);
            if (entry.draft_tokens > 0 && !got.empty() && *entry.delivery != "dropped")
                entry.accepted_draft_tokens = static_cast<std::int64_t>(got.size()) - 1;
        }
        // The batch's output: a batch without tokens gets vLLM's EMPTY_MODEL_RUNNER_OUTPUT.
        scheduler.update_from_output(batch.out, batch.sampled);
        for (const auto& id : unfinished)
            if (scheduler.is_finished(id)) {
                rec.finished.push_back(id);
                finished_unreported.push_back(id);
            }
        // The state after the update (AsyncRecording._parity_after_update).
        for (auto& [id, entry] : rec.requests) {
            const bool finished = scheduler.is_finished(id);
            entry.computed_tokens = scheduler.num_computed_tokens(id);
            entry.output_tokens = static_cast<std::int64_t>(scheduler.output_token_ids(id).size());
            entry.kv_blocks = scheduler.num_kv_blocks(id);
            entry.output_placeholders = finished ? 0 : scheduler.num_output_placeholders(id);
            // a client output: the update appended tokens (a dropped output appends none)
            if (*entry.delivery != "dropped" && !batch.sampled.at(id).empty()) rec.emitted.push_back(id);
        }
        if (auto emitted = scheduler.emitted()) rec.emitted = std::move(*emitted);  // the scheduler knows better
        detail::read_state(rec, scheduler);
        rec.update_iteration = iteration;
        result.steps.push_back(std::move(rec));
    }
    result.outputs = detail::output_records(specs, scheduler);
    return result;
}

}  // namespace parity
