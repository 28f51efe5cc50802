// The round driver without LibTorch: flat parameters in plain vectors, a
// fake clock for the step and round times, two learners on loopback.
#include "reducer/round_driver.h"

#include <cstring>
#include <string>
#include <thread>

#include "fmt/format.h"
#include "gtest/gtest.h"
#include "mend/lighthouse.h"
#include "reducer/vector_parameters.h"
#include "test_util/driver_options.h"
#include "test_util/job_config.h"

namespace mend::reducer {
namespace {

constexpr char kToken[] = "round-driver-test-token-0123456789";

// Two parameters: "w" (2 x 3) and "b" (2).
std::unique_ptr<VectorParameters> WAndB(float start) {
  return std::make_unique<VectorParameters>(
      std::vector<VectorParameters::Tensor>{{"w", {2, 3}}, {"b", {2}}}, start);
}

struct LearnerRun {
  ReducerStats stats;
  std::vector<float> global;
  std::vector<float> local;
  uint64_t quiet_steps = 0;
  uint64_t quiet_copies = 0;
};

// A learner whose "training" adds `slope` to every value and advances its
// clock by 50 ms per step.
void Learn(const Config& config, const std::string& id, float slope, int steps, LearnerRun* run,
           float start = 1.0f) {
  auto agent = LearnerAgent::Start(mend::testing_util::AgentOptionsFor(config), kToken,
                                   {id, "", "", ""}, *RealClock());
  ASSERT_TRUE(agent.ok()) << agent.status();
  FakeClock clock;
  auto parameters = WAndB(start);
  VectorParameters* view = parameters.get();
  auto driver = RoundDriver::Create(mend::testing_util::DriverOptionsFor(config), **agent, clock,
                                    std::move(parameters), nullptr, 0);
  ASSERT_TRUE(driver.ok()) << driver.status();
  for (int s = 0; s < steps; ++s) {
    clock.AdvanceMillis(50);
    for (size_t i = 0; i < 2; ++i) {
      for (float& v : view->values(i)) v += slope;
    }
    const ReducerStats before = (*driver)->stats();
    ASSERT_TRUE((*driver)->step(16).ok());
    const ReducerStats after = (*driver)->stats();
    if (after.rounds_started == before.rounds_started && after.rounds == before.rounds &&
        after.failed_rounds == before.failed_rounds) {
      run->quiet_steps++;
      run->quiet_copies += after.parameter_copies - before.parameter_copies;
    }
  }
  ASSERT_TRUE((*driver)->shutdown().ok());
  run->stats = (*driver)->stats();
  auto global = (*driver)->global(0);
  run->global.assign(global.begin(), global.end());
  run->local = view->All();
}

void RunPair(Config config, int steps, LearnerRun* a, LearnerRun* b, float b_start = 1.0f) {
  auto server = LighthouseServer::Start(config, kToken, *RealClock());
  ASSERT_TRUE(server.ok()) << server.status();
  config.lighthouse = (*server)->grpc_address();
  std::thread ta([&]() { Learn(config, "learner-a", 1.0f, steps, a); });
  std::thread tb([&]() { Learn(config, "learner-b", 3.0f, steps, b, b_start); });
  ta.join();
  tb.join();
}

TEST(RoundDriverTest, SynchronousRoundsAverageFlatParametersWithoutLibTorch) {
  Config config = testing_util::SynchronousJobConfig(2, 5);
  config.outer_lr = 1.0;  // parameter averaging: each round moves by the mean progress
  config.outer_momentum = 0.0;
  LearnerRun a, b;
  RunPair(config, 20, &a, &b);
  EXPECT_EQ(a.stats.rounds, 4u);
  EXPECT_EQ(b.stats.rounds, 4u);
  EXPECT_EQ(a.global, b.global);
  // 20 steps of mean slope 2 from 1: every value is 41, local and global.
  for (float v : a.global) EXPECT_FLOAT_EQ(v, 41.0f);
  for (float v : b.local) EXPECT_FLOAT_EQ(v, 41.0f);
  // Steps between boundaries copy nothing.
  EXPECT_EQ(a.quiet_steps, 16u);
  EXPECT_EQ(a.quiet_copies, 0u);
  EXPECT_GT(a.stats.parameter_copies, 0u);
  // They started equal: the first round found that out through the store
  // and sent no state.
  EXPECT_EQ(a.stats.heals + b.stats.heals, 0u);
}

TEST(RoundDriverTest, LearnersThatStartApartTakeRankZerosStateInTheFirstRound) {
  Config config = testing_util::SynchronousJobConfig(2, 5);
  config.outer_lr = 1.0;
  config.outer_momentum = 0.0;
  LearnerRun a, b;
  RunPair(config, 20, &a, &b, /*b_start=*/7.0f);
  EXPECT_EQ(a.stats.heals + b.stats.heals, 1u);  // learner-b healed from learner-a (rank 0)
  EXPECT_EQ(a.global, b.global);
  // From learner-a's start (1) by the mean progress: 41, as if both had started there.
  for (float v : a.global) EXPECT_FLOAT_EQ(v, 41.0f);
}

TEST(RoundDriverTest, ConcurrentRoundsReportTheirTau) {
  for (int64_t overlap : {0, 3}) {  // tuned (within [1, H - 1]), and fixed
    Config config = testing_util::SynchronousJobConfig(2, 8);
    config.concurrent_outer_step = true;
    config.overlap_steps = overlap;
    LearnerRun a, b;
    RunPair(config, 32, &a, &b);
    EXPECT_EQ(a.stats.rounds, 4u) << overlap;
    EXPECT_EQ(a.global, b.global) << overlap;
    if (overlap > 0) {
      EXPECT_EQ(a.stats.overlap_steps, 3u);
    } else {
      EXPECT_GE(a.stats.overlap_steps, 1u);
      EXPECT_LE(a.stats.overlap_steps, 7u);
    }
  }
}

TEST(RoundDriverTest, AConcurrentJobOfKnownLengthLaunchesNoRoundInItsLastFragmentPeriod) {
  // P = 2, H = 8: fragment 1's boundaries at 4, 12, 20, 28; fragment 0's at
  // 8, 16, 24, 32. With one round in flight at a time the job's last period
  // is steps 29-32 (tau < 4); with two (the default, one per fragment) it is
  // steps 25-32 (tau < 8).
  struct Case {
    int64_t total, rounds_in_flight;
    uint64_t rounds;
  };
  for (const Case& c : {Case{0, 1, 8}, Case{32, 1, 7}, Case{0, 0, 8}, Case{32, 0, 6}}) {
    Config config = testing_util::SynchronousJobConfig(2, 8);
    config.concurrent_outer_step = true;
    config.fragments = 2;
    config.rounds_in_flight = c.rounds_in_flight;
    config.total_steps = c.total;
    config.final_merge = false;  // (see the next test)
    LearnerRun a, b;
    RunPair(config, 32, &a, &b);
    const std::string what =
        fmt::format("total {}, rounds in flight {}", c.total, c.rounds_in_flight);
    EXPECT_EQ(a.stats.rounds_started, c.rounds) << what;
    EXPECT_EQ(b.stats.rounds_started, c.rounds) << what;
    EXPECT_EQ(a.stats.rounds, c.rounds) << what;
    EXPECT_EQ(a.global, b.global) << what;
    EXPECT_EQ(a.stats.failed_rounds + b.stats.failed_rounds, 0u) << what;
  }
}

// total_steps known: after shutdown every learner holds the same model, the
// members' average at the last step (final_merge), global and local alike.
// outer_lr 1 and momentum 0 make every round move by the mean progress (2 a
// step here), so the merged value is exactly 1 + 2 x total. Without the
// final merge the learners end apart (each kept its own last steps).
TEST(RoundDriverTest, AJobOfKnownLengthEndsWithEveryLearnerHoldingTheAverageModel) {
  struct Case {
    bool concurrent;
    int64_t total;
    bool final_merge;
  };
  // P = 2, H = 8 (fragment 0's boundaries at 8, 16, ...; fragment 1's at 4, 12, ...): each
  // fragment's last round is before the last step: 16 and 20 of 22 (synchronous); 24 and 20 of 30,
  // and 32 and 28 of 32 less the last fragment period's boundary (concurrent: 28 and 32 are not
  // launched).
  for (Case c :
       {Case{false, 22, true}, Case{true, 30, true}, Case{true, 32, true}, Case{true, 30, false}}) {
    SCOPED_TRACE(testing::Message() << "concurrent " << c.concurrent << ", total_steps " << c.total
                                    << ", final_merge " << c.final_merge);
    Config config = testing_util::SynchronousJobConfig(2, 8);
    config.concurrent_outer_step = c.concurrent;
    config.fragments = 2;
    config.outer_lr = 1.0;
    config.outer_momentum = 0.0;
    config.total_steps = c.total;
    config.final_merge = c.final_merge;
    LearnerRun a, b;
    RunPair(config, static_cast<int>(c.total), &a, &b);
    EXPECT_EQ(a.stats.failed_rounds + b.stats.failed_rounds, 0u);
    if (!c.final_merge) {
      EXPECT_EQ(a.stats.final_rounds, 0u);
      EXPECT_NE(a.local, b.local);
      continue;
    }
    EXPECT_EQ(a.stats.final_rounds, 2u);  // both fragments' last rounds were before the last step
    EXPECT_EQ(b.stats.final_rounds, 2u);
    EXPECT_EQ(a.local, b.local);
    EXPECT_EQ(a.global, b.global);
    const float merged = 1.0f + 2.0f * static_cast<float>(c.total);
    for (float v : a.local) EXPECT_EQ(v, merged);
  }
}

}  // namespace
}  // namespace mend::reducer
