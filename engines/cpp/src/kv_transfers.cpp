// TEST DOUBLE: the stand-in worker's side of the stand-in KV connector, a port of
// engines/vllm/kv_connector.py Transfers (see driver_parts.hpp). Both loops use it, counting
// steps in schedule() calls.
#include <algorithm>
#include <set>

#include "driver_parts.hpp"

namespace parity::detail {

std::optional<KvConnectorOutput> KvTransfers::output(std::int64_t step, const ScheduledStep& out) {
    if (!connector_) return std::nullopt;
    std::vector<const KvLoad*> reported;  // synchronous loads end within their step
    for (const KvLoad& load : out.kv_loads) {
        if (load.async_steps) due_[step + *load.async_steps].push_back(load);
        else reported.push_back(&load);
    }
    std::vector<KvLoad> due;
    if (auto it = due_.find(step); it != due_.end()) {
        due = std::move(it->second);
        due_.erase(it);
    }
    for (const KvLoad& load : due) reported.push_back(&load);
    KvConnectorOutput result;
    std::set<std::string> finished;
    for (const KvLoad& load : due) finished.insert(load.id);
    result.finished_recving.assign(finished.begin(), finished.end());
    std::set<std::int64_t> invalid;
    for (const KvLoad* load : reported)
        if (load->fail && !load->block_ids.empty()) invalid.insert(load->block_ids.front());
    result.invalid_block_ids.assign(invalid.begin(), invalid.end());
    return result;
}

}  // namespace parity::detail
