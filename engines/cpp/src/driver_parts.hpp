// What the kit's two loops share (src/driver.cpp: the synchronous one, src/async_loop.cpp:
// the batch-queue one): the parts of a step record read from schedule() and from the state
// after an update, and the output records.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "parity/scheduler.hpp"

namespace parity::detail {

// A step record's decisions and identities, read from what schedule() returned (the state
// fields are filled after the update).
StepRecord open_record(const ScheduledStep& out, std::int64_t step, const std::vector<std::string>& aborted);
// The scheduler's state after an update: the KV cache and the two queues.
void read_state(StepRecord& rec, const PortScheduler& scheduler);
// TEST DOUBLE: the stand-in worker's side of a KV connector (engines/vllm/kv_connector.py
// Transfers): per step (schedule() call), the connector part of its model runner output. A load
// a step issued ends within it (synchronous) or is reported finished `async_steps` steps later;
// a failing load reports the first block of its range invalid in the output that ends it.
class KvTransfers {
  public:
    explicit KvTransfers(bool connector) : connector_(connector) {}
    // The output of step `step`, whose scheduler output is `out`; nullopt without a connector.
    std::optional<KvConnectorOutput> output(std::int64_t step, const ScheduledStep& out);

  private:
    bool connector_;
    std::map<std::int64_t, std::vector<KvLoad>> due_;  // step -> asynchronous loads it reports
};

// One output record per request, sorted by id (`specs` is a std::map).
std::vector<OutputRecord> output_records(const std::map<std::string, const RequestSpec*>& specs,
                                         const PortScheduler& scheduler);

}  // namespace parity::detail
