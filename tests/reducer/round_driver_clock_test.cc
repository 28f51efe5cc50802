// The round driver (round_driver.h) on a fake clock, over fake round
// services and a fake agent: tau (the cap for a learner of one rank),
// the wait at boundary + tau, a round passed over, an unreachable
// lighthouse, too few learners, and a failed round. Time is the injected
// clock's, moved by the test in microseconds; the round runs on the driver's
// own thread, so the test waits on conditions (the fakes' and the driver's),
// never for time to pass.
#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "mend/clock.h"
#include "reducer/round_driver.h"
#include "reducer/round_fakes.h"
#include "test_util/driver_options.h"
#include "test_util/fake_agent.h"
#include "test_util/job_config.h"
#include "test_util/wait.h"

namespace mend::reducer {
namespace {

constexpr int64_t kStepMs = 100;  // every inner step, on the fake clock
constexpr uint64_t kTokens = 64;  // per step
constexpr uint64_t kPeriod = 10;  // a round every 10 steps
constexpr Micros kAwait = 60 * kMicrosPerSecond;

class RoundDriverClockTest : public ::testing::Test {
 protected:
  // A learner of one rank with concurrent rounds; overlap_steps 0 tunes tau.
  // With `fragments`, a round every kPeriod steps still (H = fragments x
  // kPeriod), of each fragment in turn, up to `rounds_in_flight` at once.
  void Start(int64_t overlap_steps, bool train_through_outage = false, int64_t fragments = 1,
             int64_t rounds_in_flight = 0) {
    Config config = testing_util::ConcurrentJobConfig(
        1, static_cast<int>(kPeriod * static_cast<uint64_t>(fragments)), overlap_steps);
    config.fragments = fragments;
    config.rounds_in_flight = rounds_in_flight;
    config.train_through_lighthouse_outage = train_through_outage;
    config.quorum_timeout_ms = 4321;
    auto services = std::make_unique<fakes::FakeServices>(clock_, &agent_);
    services_ = services.get();
    ASSERT_TRUE(SetConfigValue(config, "outer_apply", outer_apply_, "test").ok());
    if (outer_warmup_steps_ >= 0) config.outer_warmup_steps = outer_warmup_steps_;
    config.total_steps = total_steps_;
    auto values = std::make_unique<fakes::Values>(1.0f);
    values_ = values.get();
    auto driver = RoundDriver::Create(mend::testing_util::DriverOptionsFor(config), agent_, clock_,
                                      std::move(values), nullptr, 0, std::move(services));
    ASSERT_TRUE(driver.ok()) << driver.status();
    driver_ = std::move(*driver);
  }
  // Steps until the driver launches its n-th round.
  void StepToLaunch(uint64_t n) {
    while (driver_->stats().rounds_started < n) {
      Status status = Step();
      ASSERT_TRUE(status.ok()) << status;
    }
  }
  // One inner step: kStepMs of training on the fake clock, then the driver's step.
  Status Step() {
    clock_.AdvanceMillis(kStepMs);
    return driver_->step(kTokens);
  }
  void StepTo(uint64_t step) {
    while (driver_->stats().steps < step) {
      Status status = Step();
      ASSERT_TRUE(status.ok()) << status;
    }
  }
  // Until the round in flight has ended (the next step, neither a boundary
  // nor boundary + tau, takes it up).
  bool AwaitArrival() {
    return testing_util::WaitFor(kAwait, [&]() { return driver_->NextStepMayWait(); });
  }
  // Step `step` on a thread of its own; whether it has returned, and how.
  void StepAside() {
    clock_.AdvanceMillis(kStepMs);
    aside_ = std::thread([this]() {
      aside_status_ = driver_->step(kTokens);
      aside_returned_ = true;
    });
  }
  // Until the driver, waiting in step(), looks whether the lighthouse closed
  // its round without it (it does at every poll while it waits).
  bool AwaitWaiting() {
    const int before = agent_.looked_at_rounds.load();
    return testing_util::WaitFor(kAwait, [&]() { return agent_.looked_at_rounds > before + 2; });
  }
  void TearDown() override {
    if (aside_.joinable()) {
      services_->Release();
      services_->ReleaseExchanges();
      aside_.join();
    }
  }

  FakeClock clock_;
  testing_util::FakeAgent agent_{clock_};
  fakes::FakeServices* services_ = nullptr;  // owned by the driver
  fakes::Values* values_ = nullptr;          // the parameters, owned by the driver
  std::string outer_apply_ = "eager";        // set before Start()
  int64_t outer_warmup_steps_ = -1;          // set before Start(); -1: the config's
  int64_t total_steps_ = 0;                  // set before Start(); 0: not known
  std::unique_ptr<RoundDriver> driver_;
  std::thread aside_;
  Status aside_status_;
  std::atomic<bool> aside_returned_{false};
};

// The model's layout the lighthouse compares: its shapes themselves as far
// as they fit in a setting (so that a refusal shows where two models
// differ), and a digest of all of them.
TEST(ParametersSettingTest, NamesTheShapesThatFitAndADigestOfAll) {
  const std::string small = ParametersSetting({{4, 6}, {3}, {}});
  EXPECT_EQ(small.rfind("parameters=3 tensors, 28 values, shapes ", 0), 0u) << small;
  EXPECT_EQ(small.substr(small.find(':')), ": [4,6] [3] []");
  EXPECT_NE(ParametersSetting({{6, 4}, {3}}), ParametersSetting({{4, 6}, {3}}));
  std::vector<std::vector<int64_t>> many(1000, {1024, 1024});
  const std::string large = ParametersSetting(many);
  EXPECT_LE(large.size(), 512u);  // the lighthouse's limit on a setting
  EXPECT_EQ(large.substr(large.size() - 4), " ...");
  many.back() = {1024, 1023};  // past what fits: the digest tells them apart
  const std::string other = ParametersSetting(many);
  EXPECT_EQ(other.size(), large.size());
  EXPECT_NE(other, large);
}

TEST_F(RoundDriverClockTest, TauOfALearnerOfOneRankIsTheCapItsRoundsAreAppliedOnArrival) {
  Start(/*overlap_steps=*/0);
  services_->Hold();
  ASSERT_NO_FATAL_FAILURE(StepTo(kPeriod));
  ASSERT_TRUE(services_->AwaitAsks(1));
  // tau is the cap, a fragment period less one.
  EXPECT_EQ(driver_->stats().overlap_steps, kPeriod - 1);
  EXPECT_EQ(services_->last_ask().timeout, 4321 * kMicrosPerMilli);
  EXPECT_EQ(services_->last_ask().boundary_step, kPeriod);
  // The round takes three steps' time: 300 ms from its launch to its result,
  // applied at the step after it arrived.
  ASSERT_NO_FATAL_FAILURE(StepTo(kPeriod + 3));
  services_->Release();
  ASSERT_TRUE(AwaitArrival());
  ASSERT_TRUE(Step().ok());
  EXPECT_EQ(driver_->stats().rounds, 1u);
  // Measured rounds do not lower it: a group would tune it to
  // ceil(1.25 x 300 ms / 100 ms) + 1 = 5, but here that would only make a
  // step wait for a round a little later than the last ones.
  ASSERT_NO_FATAL_FAILURE(StepTo(2 * kPeriod));
  EXPECT_EQ(driver_->stats().rounds_started, 2u);
  EXPECT_EQ(driver_->stats().overlap_steps, kPeriod - 1);
  ASSERT_TRUE(driver_->shutdown().ok());
  EXPECT_EQ(driver_->stats().rounds, 2u);
  EXPECT_EQ(driver_->stats().passed_over, 0u);
  EXPECT_EQ(driver_->stats().round_waits, 0u);
}

TEST_F(RoundDriverClockTest, AtBoundaryPlusTauTheLearnerWaitsForItsRoundAndAppliesIt) {
  Start(/*overlap_steps=*/3);
  services_->Hold();
  ASSERT_NO_FATAL_FAILURE(StepTo(kPeriod + 2));
  EXPECT_EQ(driver_->stats().rounds, 0u);
  StepAside();  // step 13 = boundary + tau
  ASSERT_TRUE(AwaitWaiting());
  EXPECT_FALSE(aside_returned_.load());  // it waits: nothing told it to train on
  services_->Release();
  aside_.join();
  ASSERT_TRUE(aside_status_.ok()) << aside_status_;
  EXPECT_EQ(driver_->stats().steps, kPeriod + 3);
  EXPECT_EQ(driver_->stats().rounds, 1u);
  EXPECT_EQ(driver_->stats().passed_over, 0u);
  EXPECT_EQ(services_->asks().size(), 1u);
  EXPECT_EQ(services_->last_ask().tokens, kPeriod * kTokens);
}

TEST_F(RoundDriverClockTest, ARoundThatClosedWithoutTheLearnerIsPassedOverAndAppliedOnArrival) {
  Start(/*overlap_steps=*/3);
  services_->Hold();
  ASSERT_NO_FATAL_FAILURE(StepTo(kPeriod + 2));
  agent_.ReportRound(/*round_id=*/5, /*step=*/kPeriod);  // the others' round for step 10
  ASSERT_TRUE(Step().ok());                              // step 13: it trains on
  EXPECT_EQ(driver_->stats().passed_over, 1u);
  EXPECT_EQ(driver_->stats().rounds, 0u);
  ASSERT_TRUE(Step().ok());
  // Its join forms the next round; the result is applied when it arrives.
  services_->Release();
  ASSERT_TRUE(AwaitArrival());
  ASSERT_TRUE(Step().ok());
  EXPECT_EQ(driver_->stats().rounds, 1u);
  EXPECT_EQ(driver_->stats().failed_rounds, 0u);
  // The next boundary launches as usual.
  ASSERT_NO_FATAL_FAILURE(StepTo(2 * kPeriod));
  EXPECT_EQ(driver_->stats().rounds_started, 2u);
  ASSERT_TRUE(driver_->shutdown().ok());
}

TEST_F(RoundDriverClockTest, AnUnreachableLighthouseIsWaitedForUnlessTrainingThroughIsOn) {
  Start(/*overlap_steps=*/3, /*train_through_outage=*/false);
  services_->Hold();
  agent_.lost = true;
  ASSERT_NO_FATAL_FAILURE(StepTo(kPeriod + 2));
  StepAside();  // step 13: it waits for the lighthouse
  ASSERT_TRUE(AwaitWaiting());
  EXPECT_FALSE(aside_returned_.load());
  services_->Release();
  aside_.join();
  EXPECT_EQ(driver_->stats().rounds, 1u);
  EXPECT_EQ(driver_->stats().passed_over, 0u);
}

TEST_F(RoundDriverClockTest, AnUnreachableLighthouseLetsTheLearnerTrainOnWhenAllowed) {
  Start(/*overlap_steps=*/3, /*train_through_outage=*/true);
  services_->Hold();
  agent_.lost = true;
  ASSERT_NO_FATAL_FAILURE(StepTo(kPeriod + 3));  // step 13 returns
  EXPECT_EQ(driver_->stats().passed_over, 1u);
  EXPECT_EQ(driver_->stats().rounds, 0u);
  agent_.lost = false;  // it is back; the round forms
  services_->Release();
  ASSERT_TRUE(AwaitArrival());
  ASSERT_TRUE(Step().ok());
  EXPECT_EQ(driver_->stats().rounds, 1u);
}

TEST_F(RoundDriverClockTest, FewerLearnersThanTheMinimumLetTheLearnerTrainOn) {
  Start(/*overlap_steps=*/3);
  services_->Hold();
  agent_.short_of_minimum = true;
  ASSERT_NO_FATAL_FAILURE(StepTo(kPeriod + 5));
  EXPECT_EQ(driver_->stats().passed_over, 1u);
  EXPECT_EQ(driver_->stats().rounds, 0u);
  // At shutdown its join is called off: no round can form for it.
  ASSERT_TRUE(driver_->shutdown().ok());
  EXPECT_TRUE(services_->interrupted());
  EXPECT_EQ(driver_->stats().rounds, 0u);
  EXPECT_EQ(driver_->stats().failed_rounds, 0u);
}

// The lighthouse's event log tells a learner that stopped early (a signal,
// its loop) from one that finished the job.
TEST_F(RoundDriverClockTest, ALearnerStoppedBeforeTheJobsLastStepLeavesSayingSo) {
  total_steps_ = 100;
  Start(0);
  StepTo(3);
  ASSERT_TRUE(driver_->shutdown().ok());
  EXPECT_EQ(agent_.leave_reasons(), (std::vector<std::string>{"stopped at step 3 of 100"}));
}

TEST_F(RoundDriverClockTest, AFailedRoundChangesNothingAndItsTokensGoIntoTheNext) {
  Start(/*overlap_steps=*/3);
  services_->SetQuorum(DeadlineExceededError("quorum: no round within quorum_timeout_ms"));
  ASSERT_NO_FATAL_FAILURE(StepTo(kPeriod));
  ASSERT_TRUE(AwaitArrival());
  ASSERT_TRUE(Step().ok());
  EXPECT_EQ(driver_->stats().failed_rounds, 1u);
  EXPECT_EQ(driver_->stats().rounds, 0u);
  services_->SetQuorum(fakes::RoundOfOne(1, 2 * kPeriod));
  ASSERT_NO_FATAL_FAILURE(StepTo(2 * kPeriod));
  ASSERT_TRUE(services_->AwaitAsks(2));
  const auto asks = services_->asks();
  EXPECT_EQ(asks[0].tokens, kPeriod * kTokens);
  EXPECT_EQ(asks[1].tokens, 2 * kPeriod * kTokens);  // the failed round's, and its own
  EXPECT_EQ(asks[1].last_round_id, 0u);
  ASSERT_TRUE(driver_->shutdown().ok());
  EXPECT_EQ(driver_->stats().rounds, 1u);
  EXPECT_EQ(agent_.steps_recorded.load(), 2 * kPeriod);
  // The agent is given each step's tokens (it sums them for its heartbeats'
  // tokens_total), not the sum so far (the lighthouse showed 1 + 2 + ... + n).
  EXPECT_EQ(agent_.last_tokens.load(), kTokens);
  EXPECT_EQ(agent_.tokens_recorded.load(), 2 * kPeriod * kTokens);
}

}  // namespace
}  // namespace mend::reducer

namespace mend::reducer {
namespace {

// outer_apply: with `eager` the boundary takes the outer step with the
// learner's own pseudo-gradient at once and the result replaces it; with
// `exact` the parameters stay until the result comes. Either way the result
// keeps what was trained since exactly once. One member: the merged
// pseudo-gradient is the learner's own, so the provisional step is the
// round's. theta 1 -> 0.5 by the boundary (delta 0.5, momentum 0): theta_g'
// = 1 - 0.7 x (0.5 + 0.9 x 0.5) = 0.335.
class OuterApplyTest : public RoundDriverClockTest,
                       public ::testing::WithParamInterface<std::string> {
 protected:
  void StartAt(const std::string& mode) {
    outer_apply_ = mode;
    outer_warmup_steps_ = 0;  // the first round takes the outer Nesterov step
    Start(/*overlap_steps=*/0);
    values_->values().assign(values_->values().size(), 0.5f);  // trained to the boundary
    services_->HoldExchangesFrom(1);
    ASSERT_NO_FATAL_FAILURE(StepToLaunch(1));
    ASSERT_TRUE(services_->AwaitConnects(1));
  }
  void TrainBy(float change) {
    for (float& v : values_->values()) v += change;
  }
  float value() const { return values_->values()[0]; }
};

TEST_P(OuterApplyTest, TheResultKeepsWhatWasTrainedSinceTheBoundaryOrTheProvisionalStep) {
  const bool eager = GetParam() == "eager";
  ASSERT_NO_FATAL_FAILURE(StartAt(GetParam()));
  EXPECT_NEAR(value(), eager ? 0.335f : 0.5f, 1e-6);
  TrainBy(-0.1f);
  services_->ReleaseExchanges();
  ASSERT_TRUE(AwaitArrival());
  ASSERT_TRUE(Step().ok());
  ASSERT_EQ(driver_->stats().rounds, 1u);
  EXPECT_NEAR(driver_->global(0)[0], 0.335f, 1e-6);
  EXPECT_NEAR(value(), 0.235f, 1e-6);  // theta_g' and the -0.1 trained since
  ASSERT_TRUE(driver_->shutdown().ok());
}

TEST_P(OuterApplyTest, AFailedRoundTakesTheProvisionalStepBack) {
  ASSERT_NO_FATAL_FAILURE(StartAt(GetParam()));
  TrainBy(-0.1f);
  services_->SetConnect(UnavailableError("fake services: the link is down"));
  services_->ReleaseExchanges();
  ASSERT_TRUE(AwaitArrival());
  ASSERT_TRUE(Step().ok());
  EXPECT_EQ(driver_->stats().failed_rounds, 1u);
  EXPECT_FLOAT_EQ(driver_->global(0)[0], 1.0f);  // the global state as it was
  EXPECT_NEAR(value(), 0.4f, 1e-6);              // what was trained, and no outer step
  ASSERT_TRUE(driver_->shutdown().ok());
}

// A launch with nothing in flight only reads the parameters, unless it
// takes the provisional step (eager): a front end that stages them may
// then make the step later (MEND_STEP_MAY_WRITE). Taking a round up writes.
TEST_P(OuterApplyTest, ALaunchWithNothingInFlightOnlyReadsUnlessItTakesTheProvisionalStep) {
  const bool eager = GetParam() == "eager";
  outer_apply_ = GetParam();
  outer_warmup_steps_ = 0;
  Start(/*overlap_steps=*/0);
  values_->values().assign(values_->values().size(), 0.5f);  // trained to the boundary
  services_->HoldExchangesFrom(1);
  ASSERT_NO_FATAL_FAILURE(StepTo(kPeriod - 1));
  const StepPlan launch = driver_->PlanStep();
  EXPECT_TRUE(launch.touches_parameters);
  EXPECT_EQ(launch.may_write, eager);
  ASSERT_TRUE(Step().ok());
  ASSERT_EQ(driver_->stats().rounds_started, 1u);
  EXPECT_EQ(value() != 0.5f, eager);  // (the provisional step moved it)
  ASSERT_TRUE(services_->AwaitConnects(1));
  services_->ReleaseExchanges();
  ASSERT_TRUE(AwaitArrival());
  EXPECT_TRUE(driver_->PlanStep().may_write);
  ASSERT_TRUE(Step().ok());
  EXPECT_EQ(driver_->stats().rounds, 1u);
  ASSERT_TRUE(driver_->shutdown().ok());
}

// A fresh learner that joins a job in progress (its lighthouse has had
// rounds) waits for its first round at the boundary, where the round heals
// it and writes the parameters: that launch's plan says so (a front end
// that made a read-only step later had the heal overwritten; found with
// learners started against a lighthouse whose job had rounds already). A
// later launch, with a round behind it, only reads again.
TEST_F(RoundDriverClockTest, AFreshLearnerJoiningAJobInProgressPlansItsFirstLaunchAsAWrite) {
  agent_.ReportRound(3, 12);  // the job's newest round, before this learner's first
  outer_apply_ = "exact";     // (an eager launch past the warm-up writes anyway)
  Start(/*overlap_steps=*/2);
  ASSERT_NO_FATAL_FAILURE(StepTo(kPeriod - 1));
  const StepPlan first = driver_->PlanStep();
  EXPECT_TRUE(first.touches_parameters);
  EXPECT_TRUE(first.may_wait);
  EXPECT_TRUE(first.may_write) << "the first round is taken up (and may heal) at its boundary";
  ASSERT_TRUE(Step().ok());
  EXPECT_EQ(driver_->stats().rounds, 1u) << "taken up at the boundary";
  ASSERT_NO_FATAL_FAILURE(StepTo(2 * kPeriod - 1));
  EXPECT_FALSE(driver_->PlanStep().may_write) << "a later launch only reads";
  ASSERT_TRUE(driver_->shutdown().ok());
}

// In the outer warm-up a round averages and takes no provisional step: its
// launch only reads, eager or not; past it, an eager launch writes.
TEST_F(RoundDriverClockTest, AnEagerLaunchOnlyReadsInTheOuterWarmUp) {
  outer_apply_ = "eager";
  outer_warmup_steps_ = kPeriod;
  Start(/*overlap_steps=*/0);
  ASSERT_NO_FATAL_FAILURE(StepTo(kPeriod - 1));
  const StepPlan warm_up = driver_->PlanStep();
  EXPECT_TRUE(warm_up.touches_parameters);
  EXPECT_FALSE(warm_up.may_write);
  ASSERT_TRUE(Step().ok());
  ASSERT_EQ(driver_->stats().rounds_started, 1u);
  while (driver_->stats().rounds < 1) {  // taken up by boundary + tau (H - 1)
    ASSERT_TRUE(AwaitArrival());
    ASSERT_TRUE(Step().ok());
  }
  ASSERT_NO_FATAL_FAILURE(StepTo(2 * kPeriod - 1));
  const StepPlan past = driver_->PlanStep();
  EXPECT_TRUE(past.touches_parameters);
  EXPECT_TRUE(past.may_write);
  ASSERT_TRUE(Step().ok());
  EXPECT_EQ(driver_->stats().rounds_started, 2u);
  ASSERT_TRUE(driver_->shutdown().ok());
}

// A launch's plan says when its round is due at the very next step (tau =
// 1, as given or as the cap of a short fragment period), so that a front end
// makes it at once rather than at the next optimizer step; tau = 2 is not.
TEST_F(RoundDriverClockTest, ALaunchWhoseRoundIsDueAtTheNextStepIsPlannedSo) {
  outer_apply_ = "exact";
  for (const int64_t tau : {1, 2}) {
    SCOPED_TRACE(tau);
    Start(/*overlap_steps=*/tau);
    ASSERT_NO_FATAL_FAILURE(StepTo(kPeriod - 2));
    EXPECT_FALSE(driver_->PlanStep().launch_due_next);  // (step kPeriod - 1 launches nothing)
    ASSERT_NO_FATAL_FAILURE(StepTo(kPeriod - 1));
    const StepPlan launch = driver_->PlanStep();
    EXPECT_TRUE(launch.touches_parameters);
    EXPECT_EQ(launch.launch_due_next, tau == 1);
    ASSERT_TRUE(Step().ok());
    ASSERT_EQ(driver_->stats().rounds_started, 1u);
    ASSERT_TRUE(driver_->shutdown().ok());
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, OuterApplyTest, ::testing::Values("eager", "exact"),
                         [](const auto& mode) { return mode.param; });

}  // namespace
}  // namespace mend::reducer

namespace mend::reducer {
namespace {

// Rounds in flight (rounds_in_flight). Two fragments, a round every 10 steps (1 s). Round 1 (the
// job's first: its members compare their states, so nothing is launched beside it) is waited for
// and takes about 1 s; tau is the cap (19, or 9 with one round at a time); round 2
// takes 11 steps' time, longer than the time between rounds. One round at a time, a step waits for
// it; two in flight, no step waits.
class RoundsInFlightTest : public RoundDriverClockTest {
 protected:
  // Round 1 waited for and taken up; round 2 launched, formed and held in
  // its exchange.
  void FirstRoundsThenHold(int64_t rounds_in_flight) {
    Start(/*overlap_steps=*/0, false, /*fragments=*/2, rounds_in_flight);
    services_->HoldExchangesFrom(1);
    ASSERT_NO_FATAL_FAILURE(StepToLaunch(1));
    const uint64_t first = driver_->stats().steps;
    ASSERT_TRUE(services_->AwaitConnects(1));
    // One at a time, tau is at its cap (9): the step before the next boundary waits.
    const bool one = rounds_in_flight == 1;
    ASSERT_NO_FATAL_FAILURE(StepTo(first + kPeriod - (one ? 2 : 1)));
    // Planned while round 1 is held before its agreement (it may heal: the
    // next boundary takes it up first), so the step sees it so, however
    // soon round 1 agrees once released.
    first_plan_ = driver_->PlanStep();
    StepAside();  // waits at boundary + tau (one), or at the next boundary (two)
    services_->HoldExchangesFrom(2);
    aside_.join();
    ASSERT_TRUE(aside_status_.ok()) << aside_status_;
    ASSERT_EQ(driver_->stats().rounds, 1u);
    ASSERT_NO_FATAL_FAILURE(StepTo(first + kPeriod));
    ASSERT_EQ(driver_->stats().rounds_started, 2u);
    boundary_ = driver_->stats().steps;
    ASSERT_TRUE(services_->AwaitConnects(2));
    waits_ = driver_->stats().round_waits;
  }
  uint64_t boundary_ = 0;  // round 2's
  uint64_t waits_ = 0;     // before round 2
  StepPlan first_plan_;    // of the step that took round 1 up
};

TEST_F(RoundsInFlightTest, ARoundLongerThanTheTimeBetweenRoundsMakesNoStepWait) {
  ASSERT_NO_FATAL_FAILURE(FirstRoundsThenHold(/*rounds_in_flight=*/0));  // 0: one per fragment
  // tau is the cap, H - 1 = 19 (rounds_in_flight x H / fragments - 1).
  EXPECT_EQ(driver_->stats().overlap_steps, 2 * kPeriod - 1);
  // The other fragment's boundary launches round 3 beside round 2, which goes on.
  ASSERT_NO_FATAL_FAILURE(StepTo(boundary_ + kPeriod));
  EXPECT_EQ(driver_->stats().rounds_started, 3u);
  EXPECT_EQ(driver_->stats().rounds, 1u);
  EXPECT_EQ(driver_->stats().most_rounds_in_flight, 2u);
  // Round 3 joins once round 2 formed, reporting round 2 as held.
  ASSERT_TRUE(services_->AwaitAsks(3));
  EXPECT_EQ(services_->last_ask().last_round_id, 2u);
  EXPECT_EQ(services_->last_ask().boundary_step, boundary_ + kPeriod);
  // Round 2 ends after 11 steps' time, applied at the next step; then round 3.
  ASSERT_NO_FATAL_FAILURE(StepTo(boundary_ + 11));
  EXPECT_FALSE(driver_->NextStepMayWait());  // round 2 is still held: nothing to wait for
  services_->ReleaseExchanges();
  while (driver_->stats().rounds < 3) {  // (both may arrive before one step)
    ASSERT_TRUE(AwaitArrival());
    ASSERT_TRUE(Step().ok());
  }
  EXPECT_EQ(driver_->stats().last_round_id, 3u);
  EXPECT_EQ(driver_->stats().round_waits, waits_);  // no step waited for round 2 or 3
  ASSERT_TRUE(driver_->shutdown().ok());
}

TEST_F(RoundsInFlightTest, OneRoundAtATimeAStepWaitsForARoundLongerThanTheTimeBetweenRounds) {
  ASSERT_NO_FATAL_FAILURE(FirstRoundsThenHold(/*rounds_in_flight=*/1));
  EXPECT_EQ(driver_->stats().overlap_steps, kPeriod - 1);  // the cap, H / fragments - 1
  ASSERT_NO_FATAL_FAILURE(StepTo(boundary_ + kPeriod - 2));
  // The next step is boundary + tau, and round 2 is held: that step must wait for it.
  EXPECT_TRUE(driver_->NextStepMayWait());
  services_->ReleaseExchanges();
  ASSERT_TRUE(Step().ok());
  EXPECT_EQ(driver_->stats().rounds, 2u);  // taken up at boundary + tau, before the next boundary
  ASSERT_NO_FATAL_FAILURE(StepTo(boundary_ + kPeriod));
  EXPECT_EQ(driver_->stats().rounds_started, 3u);
  EXPECT_EQ(driver_->stats().most_rounds_in_flight, 1u);
  ASSERT_TRUE(driver_->shutdown().ok());
  EXPECT_EQ(driver_->stats().rounds, 3u);
}

// Staging by fragment (mend_learner_step_fragments): a round that formed
// with no member to heal touches its own fragment only, so the step that
// waits for it plans that fragment alone, and the next boundary's launch
// the other; the job's first round, before its members agreed, may heal:
// every fragment. A step that touches nothing plans none.
TEST_F(RoundsInFlightTest, AStepPlansTheFragmentsItsRoundsMayTouch) {
  ASSERT_NO_FATAL_FAILURE(FirstRoundsThenHold(/*rounds_in_flight=*/1));
  EXPECT_EQ(first_plan_.fragments, (std::vector<uint8_t>{1, 1}));
  const StepPlan quiet = driver_->PlanStep();
  EXPECT_FALSE(quiet.touches_parameters);
  EXPECT_EQ(quiet.fragments, (std::vector<uint8_t>{0, 0}));
  ASSERT_NO_FATAL_FAILURE(StepTo(boundary_ + kPeriod - 2));
  const StepPlan waits = driver_->PlanStep();  // boundary + tau: round 2, held, is waited for
  EXPECT_TRUE(waits.may_wait);
  ASSERT_EQ(waits.fragments.size(), 2u);
  EXPECT_EQ(waits.fragments[0] + waits.fragments[1], 1);
  services_->ReleaseExchanges();
  ASSERT_TRUE(Step().ok());
  EXPECT_EQ(driver_->stats().rounds, 2u);
  const StepPlan launches = driver_->PlanStep();  // the other fragment's boundary
  EXPECT_TRUE(launches.may_wait);
  EXPECT_EQ(launches.fragments, (std::vector<uint8_t>{waits.fragments[1], waits.fragments[0]}));
  ASSERT_TRUE(Step().ok());
  EXPECT_EQ(driver_->stats().rounds_started, 3u);
  ASSERT_TRUE(driver_->shutdown().ok());
}

// A round that may heal (here the job's first) has nothing launched beside
// it: the next boundary takes it up first.
TEST_F(RoundsInFlightTest, NothingIsLaunchedBesideARoundThatMayHeal) {
  Start(/*overlap_steps=*/0, false, /*fragments=*/2, /*rounds_in_flight=*/2);
  services_->HoldExchangesFrom(1);
  ASSERT_NO_FATAL_FAILURE(StepToLaunch(1));
  const uint64_t first = driver_->stats().steps;
  ASSERT_TRUE(services_->AwaitConnects(1));
  ASSERT_NO_FATAL_FAILURE(StepTo(first + kPeriod - 1));
  // The next boundary's plan, made while round 1 is held before its
  // agreement (it may heal): the step decides on what its plan saw (as the
  // C ABI's front ends plan every step), so releasing round 1 now, which
  // then agrees and could let a round launch beside it, cannot race the
  // step's decision.
  EXPECT_TRUE(driver_->PlanStep().may_wait);
  services_->ReleaseExchanges();
  ASSERT_TRUE(Step().ok());
  EXPECT_EQ(driver_->stats().rounds, 1u);  // taken up before round 2 was launched
  EXPECT_EQ(driver_->stats().rounds_started, 2u);
  EXPECT_EQ(driver_->stats().most_rounds_in_flight, 1u);
  ASSERT_TRUE(driver_->shutdown().ok());
}

// The job's first round, once its members found their states equal (here:
// held in its merge, past that), is a round like another: the next
// fragment's boundary launches beside it, and no step waits.
TEST_F(RoundsInFlightTest, TheFirstRoundOnceItsMembersAgreedHasTheNextLaunchedBesideIt) {
  Start(/*overlap_steps=*/0, false, /*fragments=*/2, /*rounds_in_flight=*/2);
  services_->HoldMergesFrom(1);
  ASSERT_NO_FATAL_FAILURE(StepToLaunch(1));
  const uint64_t first = driver_->stats().steps;
  ASSERT_TRUE(services_->AwaitMerges(1));
  ASSERT_NO_FATAL_FAILURE(StepTo(first + kPeriod));
  EXPECT_EQ(driver_->stats().rounds_started, 2u);
  EXPECT_EQ(driver_->stats().rounds, 0u);
  EXPECT_EQ(driver_->stats().most_rounds_in_flight, 2u);
  services_->ReleaseMerges();
  while (driver_->stats().rounds < 2) {
    ASSERT_TRUE(AwaitArrival());
    ASSERT_TRUE(Step().ok());
  }
  EXPECT_EQ(driver_->stats().round_waits, 0u);
  ASSERT_TRUE(driver_->shutdown().ok());
}

}  // namespace
}  // namespace mend::reducer
