// The stand-in driver of the synchronous loop: see include/parity/scheduler.hpp and
// engines/vllm/steps_layer.py (the batch-queue loop is src/async_loop.cpp).
#include <algorithm>
#include <set>

#include "driver_parts.hpp"

namespace parity {

std::map<std::string, Tokens> request_prompts(const Workload& workload) {
    std::map<std::string, Tokens> prompts;
    for (const auto& r : workload.requests) {  // a continued request comes earlier in the workload
        Tokens prompt;
        if (r.prefix) {
            const auto& p = *std::find_if(workload.prefixes.begin(), workload.prefixes.end(),
                                          [&](const Prefix& x) { return x.name == *r.prefix; });
            prompt = standin::prefix_tokens(workload.seed, p.name, p.len, workload.vocab_size);
        } else if (r.continues) {
            const auto& e = *std::find_if(workload.requests.begin(), workload.requests.end(),
                                          [&](const RequestSpec& x) { return x.id == *r.continues; });
            prompt = prompts.at(e.id);
            const Tokens answer = standin::expected_output(workload.seed, prompt, e.max_tokens, stops_of(e),
                                                           workload.max_model_len, workload.vocab_size);
            prompt.insert(prompt.end(), answer.begin(), answer.end());
        }
        const Tokens own = standin::prompt_tokens(workload.seed, r.id, r.prompt_len, workload.vocab_size);
        prompt.insert(prompt.end(), own.begin(), own.end());
        prompts[r.id] = std::move(prompt);
    }
    return prompts;
}

namespace detail {  // declared, and said what each does, in driver_parts.hpp

StepRecord open_record(const ScheduledStep& out, std::int64_t step, const std::vector<std::string>& aborted) {
    StepRecord rec;
    rec.step = step;
    rec.aborted = aborted;
    rec.aborted.insert(rec.aborted.end(), out.finished_by_scheduler.begin(), out.finished_by_scheduler.end());
    rec.token_budget = out.token_budget;
    for (const auto& id : out.order) {
        auto drafts = out.spec_tokens.find(id);
        std::int64_t n = out.num_scheduled_tokens.at(id);
        parity::StepRequest entry;
        entry.tokens = n;
        entry.draft_tokens = drafts == out.spec_tokens.end() ? 0 : static_cast<std::int64_t>(drafts->second.size());
        if (drafts != out.spec_tokens.end()) entry.draft_token_ids = drafts->second;
        if (auto b = out.block_ids.find(id); b != out.block_ids.end()) entry.block_ids = b->second;
        if (auto c = out.cached_tokens.find(id); c != out.cached_tokens.end()) entry.cached_tokens = c->second;
        entry.resent_token_ids = std::find(out.resent_token_ids.begin(), out.resent_token_ids.end(), id) !=
                                 out.resent_token_ids.end();
        rec.requests[id] = entry;
        rec.total_num_scheduled_tokens += n;
    }
    rec.new_ = out.new_;
    rec.resumed = out.resumed;
    rec.preempted = out.preempted;
    rec.num_common_prefix_blocks = out.num_common_prefix_blocks;
    return rec;
}

void read_state(StepRecord& rec, const PortScheduler& scheduler) {
    const KvBlocks blocks = scheduler.kv_blocks();
    rec.kv_free = blocks.free;
    rec.kv_used = blocks.used;
    rec.kv_cached = blocks.cached;
    rec.waiting = scheduler.waiting();
    rec.running = scheduler.running();
}

std::vector<OutputRecord> output_records(const std::map<std::string, const RequestSpec*>& specs,
                                         const PortScheduler& scheduler) {
    std::vector<OutputRecord> outputs;
    for (const auto& [id, spec] : specs) {
        OutputRecord o;
        o.id = id;
        o.output_token_ids = scheduler.output_token_ids(id);
        o.finish_reason = scheduler.finish_reason(id);
        o.stop_reason = scheduler.stop_reason(id);
        outputs.push_back(std::move(o));
    }
    return outputs;
}

}  // namespace detail

using detail::open_record;
using detail::output_records;
using detail::read_state;

WorkloadResult run_workload(const Workload& workload, std::int64_t k, PortScheduler& scheduler) {
    std::map<std::int64_t, std::vector<const RequestSpec*>> arrivals, aborts;
    std::map<std::string, Tokens> prompts = request_prompts(workload);
    std::map<std::string, const RequestSpec*> specs;
    std::map<std::string, std::int64_t> verified;  // verify steps so far, per request
    for (const auto& r : workload.requests) {
        arrivals[r.arrival_step].push_back(&r);
        specs[r.id] = &r;
        verified[r.id] = 0;
        if (r.abort_step) aborts[*r.abort_step].push_back(&r);
    }
    std::set<std::string> added;
    WorkloadResult result;
    detail::KvTransfers transfers(workload.kv_connector);  // the connector's worker side, if any
    const std::uint64_t seed = workload.seed;
    const std::int64_t vocab = workload.vocab_size;

    for (std::int64_t step = 0;; ++step) {
        if (auto it = arrivals.find(step); it != arrivals.end())
            for (const RequestSpec* r : it->second) {
                scheduler.add_request(*r, prompts.at(r->id));
                added.insert(r->id);
            }
        std::vector<std::string> aborted;
        if (auto it = aborts.find(step); it != aborts.end())
            for (const RequestSpec* r : it->second)
                if (!scheduler.is_finished(r->id)) {  // one id per call, in workload order
                    scheduler.abort(r->id);
                    aborted.push_back(r->id);
                }
        bool all_done = added.size() == specs.size();
        for (const auto& id : added) all_done = all_done && scheduler.is_finished(id);
        if (all_done && aborted.empty()) break;  // the step after an abort is always recorded
        if (step >= workload.max_steps)
            throw RunError(ErrorKind::internal, "the workload did not finish within max_steps=" +
                                                    std::to_string(workload.max_steps));

        std::vector<std::string> unfinished;
        for (const auto& id : added)
            if (!scheduler.is_finished(id)) unfinished.push_back(id);

        ScheduledStep out = scheduler.schedule();

        StepRecord rec = open_record(out, step, aborted);

        // The stand-in model runner.
        std::map<std::string, Tokens> sampled;
        for (const auto& id : out.order) {
            auto it = out.spec_tokens.find(id);
            const Tokens no_drafts;
            const Tokens& drafts = it == out.spec_tokens.end() ? no_drafts : it->second;
            const Tokens& tokens = scheduler.all_token_ids(id);
            // schedule() has already advanced the computed tokens by the scheduled ones.
            if (scheduler.num_computed_tokens(id) - static_cast<std::int64_t>(drafts.size()) <
                static_cast<std::int64_t>(tokens.size())) {
                sampled[id] = {};  // a prefill chunk that does not reach the end: no sample
                continue;
            }
            if (!drafts.empty()) ++verified[id];
            sampled[id] = standin::verify(seed, tokens, drafts, vocab);
        }
        out.kv_connector_output = transfers.output(step, out);
        scheduler.update_from_output(out, sampled);
        for (const auto& id : unfinished)
            if (scheduler.is_finished(id)) rec.finished.push_back(id);

        // The state after the update.
        for (auto& [id, entry] : rec.requests) {
            const Tokens& tokens = sampled.at(id);
            if (entry.draft_tokens > 0 && !tokens.empty())  // the target samples a bonus token
                entry.accepted_draft_tokens = static_cast<std::int64_t>(tokens.size()) - 1;
            entry.computed_tokens = scheduler.num_computed_tokens(id);
            entry.output_tokens = static_cast<std::int64_t>(scheduler.output_token_ids(id).size());
            entry.kv_blocks = scheduler.num_kv_blocks(id);
            if (!tokens.empty()) rec.emitted.push_back(id);  // a client output: it sampled
        }
        if (auto emitted = scheduler.emitted()) rec.emitted = std::move(*emitted);  // the scheduler knows better
        read_state(rec, scheduler);

        // The stand-in drafter (post_step).
        if (k > 0 && rec.total_num_scheduled_tokens > 0) {
            std::vector<std::pair<std::string, Tokens>> drafts;
            for (const auto& id : out.order) {
                if (scheduler.is_finished(id)) continue;  // the scheduler would drop these
                const auto& pattern = specs.at(id)->acceptance;
                std::int64_t accept = pattern[static_cast<std::size_t>(verified[id]) % pattern.size()];
                drafts.emplace_back(id, standin::draft(seed, scheduler.all_token_ids(id), k, accept, vocab));
            }
            scheduler.update_draft_token_ids(drafts);
        }
        for (auto& [id, entry] : rec.requests) entry.next_draft_token_ids = scheduler.draft_token_ids(id);
        result.steps.push_back(std::move(rec));
    }
    result.outputs = output_records(specs, scheduler);
    return result;
}

}  // namespace parity
