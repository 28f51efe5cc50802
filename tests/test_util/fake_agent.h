// A learner's agent without a lighthouse, for tests of what sits above the
// control plane (the round driver, a group's pulse): what the lighthouse
// reported is set by the test, and what the code above did with the agent
// is recorded. Every member is safe from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "mend/clock.h"
#include "mend/learner_agent.h"

namespace mend::testing_util {

class FakeAgent final : public LearnerAgent {
 public:
  explicit FakeAgent(const Clock& clock = *RealClock(), std::string id = "fake-learner")
      : clock_(clock), id_(std::move(id)) {}

  // What the lighthouse reported, as the test says.
  void ReportRound(uint64_t round_id, uint64_t step) {
    round_id_ = round_id;
    round_step_ = step;
  }
  std::atomic<bool> lost{false};
  std::atomic<bool> short_of_minimum{false};

  // What was done with the agent.
  std::atomic<uint64_t> steps_recorded{0};
  std::atomic<uint64_t> last_tokens{0};      // the last step's
  std::atomic<uint64_t> tokens_recorded{0};  // every step's, summed (the agent's tokens_total)
  std::atomic<int> interrupts{0};
  mutable std::atomic<int> looked_at_rounds{0};  // reads of latest_round_*: a waiter polling
  std::vector<bool> withhold_calls() const {
    std::lock_guard lock(mu_);
    return withhold_calls_;
  }

  void RecordStep(uint64_t step, uint64_t tokens, Micros) override {
    steps_recorded = step;
    last_tokens = tokens;
    tokens_recorded += tokens;
  }
  StatusOr<QuorumResult> Quorum(uint64_t, uint64_t, Micros, bool, uint64_t) override {
    return FailedPreconditionError("fake agent: no lighthouse");
  }
  void Interrupt() override { interrupts++; }
  Status Leave(const std::string& reason) override {
    std::lock_guard lock(mu_);
    leave_reasons_.push_back(reason);
    return OkStatus();
  }
  std::vector<std::string> leave_reasons() const {
    std::lock_guard lock(mu_);
    return leave_reasons_;
  }
  void Stop() override {}
  void WithholdHeartbeats(bool withhold) override {
    std::lock_guard lock(mu_);
    withhold_calls_.push_back(withhold);
  }
  const std::string& id() const override { return id_; }
  bool slow() const override { return false; }
  double slow_zscore() const override { return 0; }
  uint64_t latest_round_id() const override {
    looked_at_rounds++;
    return round_id_;
  }
  uint64_t latest_round_step() const override {
    looked_at_rounds++;
    return round_step_;
  }
  bool lighthouse_lost() const override { return lost; }
  bool short_of_quorum() const override { return short_of_minimum; }
  uint64_t registrations() const override { return 1; }
  Status fatal_status() const override { return OkStatus(); }
  const Clock& clock() const override { return clock_; }
  LighthouseClient& client() override { std::abort(); }  // no lighthouse to reach
  StatusOr<std::unique_ptr<RendezvousStore>> OpenGroupStore() override {
    return FailedPreconditionError("fake agent: no group store");
  }

 private:
  const Clock& clock_;
  const std::string id_;
  std::atomic<uint64_t> round_id_{0};
  std::atomic<uint64_t> round_step_{0};
  mutable std::mutex mu_;
  std::vector<std::string> leave_reasons_;
  std::vector<bool> withhold_calls_;
};

}  // namespace mend::testing_util
