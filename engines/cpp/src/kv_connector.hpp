// TEST DOUBLE: the scheduler side of the stand-in's KV connector, a port of
// engines/vllm/kv_connector.py StandInConnector (the remote KV store a request's `external`
// describes). Part of the reference engine: a port's engine loop asks its own connector, and
// the gate gives it the same answers (engines/PROTOCOL.md "A KV connector").
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "parity/scheduler.hpp"

namespace parity::kv {

class StandInConnector {
  public:
    explicit StandInConnector(std::int64_t block_size) : block_size_(block_size) {}

    // get_num_new_matched_tokens: the tokens the store holds beyond the `local` ones computed
    // locally (block-aligned); a request always computes its last prompt token. Whether they
    // load asynchronously.
    std::pair<std::int64_t, bool> matched_tokens(const std::string& id, const std::optional<External>& external,
                                                 std::int64_t num_prompt_tokens, std::int64_t local) {
        if (!external) return {0, false};
        const std::int64_t held = std::min(external->tokens, num_prompt_tokens - 1);
        const std::int64_t tokens = std::max<std::int64_t>(0, held - local);
        asked_[id] = local;
        return {tokens, tokens > 0 && external->async_steps.has_value()};
    }

    // update_state_after_alloc: a load of `num_external` tokens into the blocks after the local
    // ones (`blocks`: the request's block table in the first KV cache group). Its first load
    // fails where the store says so.
    void after_alloc(const std::string& id, const std::optional<External>& external, const std::vector<std::int64_t>& blocks,
                     std::int64_t num_external) {
        if (num_external <= 0) return;
        const std::int64_t local = asked_.at(id);
        asked_.erase(id);
        const auto first = static_cast<std::size_t>(local / block_size_);
        const auto end = std::min(blocks.size(), static_cast<std::size_t>((local + num_external + block_size_ - 1) / block_size_));
        KvLoad load;
        load.id = id;
        if (first < end) load.block_ids.assign(blocks.begin() + static_cast<std::ptrdiff_t>(first),
                                               blocks.begin() + static_cast<std::ptrdiff_t>(end));
        load.async_steps = external->async_steps;
        load.fail = external->fail && failed_.insert(id).second;
        pending_.push_back(std::move(load));
    }

    // build_connector_meta: the loads this schedule() issued.
    std::vector<KvLoad> take_loads() { return std::exchange(pending_, {}); }

  private:
    std::int64_t block_size_;
    std::map<std::string, std::int64_t> asked_;  // request -> the local tokens it was asked with
    std::vector<KvLoad> pending_;
    std::set<std::string> failed_;  // requests whose one failing load was issued
};

}  // namespace parity::kv
