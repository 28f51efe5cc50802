// Drives a LighthouseCore with a FakeClock: learners register, heartbeat and
// join rounds; the test advances time and reads what each join got.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/lighthouse_core.h"
#include "gtest/gtest.h"
#include "mend/clock.h"

namespace mend::coordinator::testing {

// What one Quorum call received (shared so the callback may outlive a copy).
struct JoinOutcome {
  std::optional<StatusOr<RoundAssignment>> result;
  uint64_t waiter_id = 0;

  bool done() const { return result.has_value(); }
  bool ok() const { return result && result->ok(); }
  const Round& round() const { return *(*result)->round; }
  uint32_t rank() const { return (*result)->rank; }
  StatusCode code() const { return result->status().code(); }
  std::string message() const { return std::string(result->status().message()); }
};

class CoreHarness {
 public:
  explicit CoreHarness(LighthouseOptions options)
      : core_(std::make_unique<LighthouseCore>(std::move(options), &clock_, 7)) {}

  static LighthouseOptions Options(size_t min_learners, int64_t grace_ms, bool adaptive = false) {
    LighthouseOptions options;
    options.job_id = "job";
    options.quorum.job_id = "job";
    options.quorum.min_learners = min_learners;
    options.quorum.grace_window = grace_ms * kMicrosPerMilli;
    options.quorum.grace_window_min = 0;
    options.quorum.adaptive = adaptive;
    options.heartbeat_interval = 100 * kMicrosPerMilli;
    options.heartbeat_timeout = 1000 * kMicrosPerMilli;
    options.failslow.window_steps = 8;
    options.failslow.min_samples = 4;
    return options;
  }

  uint64_t Register(const std::string& id, const std::string& rack = "", uint64_t last_round = 0) {
    RegisterArgs args;
    args.learner_id = id;
    args.rack = rack;
    args.last_round_id = last_round;
    auto result = core_->Register(args);
    EXPECT_TRUE(result.ok()) << result.status();
    sessions_[id] = result->session_id;
    return result->session_id;
  }

  // Registers with `args` as given; the session is kept when it succeeds.
  StatusOr<RegisterResult> RegisterWith(const RegisterArgs& args) {
    auto result = core_->Register(args);
    if (result.ok()) sessions_[args.learner_id] = result->session_id;
    return result;
  }

  StatusOr<HeartbeatResult> Heartbeat(const std::string& id, std::vector<double> step_ms = {}) {
    HeartbeatArgs args;
    args.learner_id = id;
    args.session_id = sessions_[id];
    args.step_ms = std::move(step_ms);
    return core_->Heartbeat(args);
  }

  void HeartbeatAll(const std::vector<std::string>& ids) {
    for (const auto& id : ids) EXPECT_TRUE(Heartbeat(id).ok()) << id;
  }

  std::shared_ptr<JoinOutcome> Join(const std::string& id, uint64_t last_round = 0,
                                    uint64_t tokens = 0, int64_t timeout_ms = 60000,
                                    uint64_t step = 0, bool synchronous = false) {
    auto outcome = std::make_shared<JoinOutcome>();
    QuorumArgs args;
    args.learner_id = id;
    args.session_id = sessions_[id];
    args.last_round_id = last_round;
    args.tokens_since_last_round = tokens;
    args.step = step;
    args.timeout = timeout_ms * kMicrosPerMilli;
    args.give_up_short_of_quorum = synchronous;
    outcome->waiter_id =
        core_->Quorum(args, [outcome](StatusOr<RoundAssignment> r) { outcome->result = r; });
    return outcome;
  }

  // Advances the fake clock by `ms` and runs the time-based rules as the
  // server's tick thread does: at each deadline on the way (NextDeadline),
  // then at the end. (One jump past half a heartbeat timeout would read as
  // the lighthouse itself stalled: StallMs.)
  void AdvanceMs(int64_t ms) {
    const Micros target = clock_.NowMicros() + ms * kMicrosPerMilli;
    for (Micros next = core_->NextDeadline(); next < target; next = core_->NextDeadline()) {
      clock_.Advance(std::max<Micros>(next - clock_.NowMicros(), 1));
      core_->Tick();
    }
    clock_.Advance(target - clock_.NowMicros());
    core_->Tick();
  }
  // Advances the fake clock by `ms` with no tick on the way, as a
  // lighthouse stopped that long sees it, then runs the time-based rules.
  void StallMs(int64_t ms) {
    clock_.AdvanceMillis(ms);
    core_->Tick();
  }

  static std::vector<std::string> MemberIds(const Round& round) {
    std::vector<std::string> ids;
    for (const auto& m : round.members) ids.push_back(m.id);
    return ids;
  }

  LighthouseCore& core() { return *core_; }
  FakeClock& clock() { return clock_; }
  uint64_t session(const std::string& id) { return sessions_[id]; }

 private:
  FakeClock clock_;
  std::unique_ptr<LighthouseCore> core_;
  std::map<std::string, uint64_t> sessions_;
};

}  // namespace mend::coordinator::testing
