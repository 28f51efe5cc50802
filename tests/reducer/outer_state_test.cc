// The round driver's owners beside it, on their own: RoundOptions (what is
// derived from the config once) and OuterState (the fragment book's state
// outside the rounds: export and import, resume, checkpoints), over a
// learner of one rank and fake parameters, with no lighthouse.
#include "reducer/outer_state.h"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "reducer/group_policy.h"
#include "reducer/options_from_config.h"
#include "reducer/round_fakes.h"
#include "reducer/round_options.h"
#include "test_util/job_config.h"
#include "test_util/wait.h"

namespace mend::reducer {
namespace {

FragmentSchedule Schedule(int64_t fragments, int64_t period) {
  StatusOr<FragmentSchedule> schedule = FragmentSchedule::Make(fragments, period);
  EXPECT_TRUE(schedule.ok()) << schedule.status();
  return *schedule;
}

TEST(OptionsFromConfigTest, TheConfigurationNamesTheCodecAndTheDataPlane) {
  Config config;
  config.codec = CodecKind::kInt4;
  config.codec_block_size = 32;
  config.collective_timeout_ms = 7000;
  config.link_rate_mbit = 80;
  auto codec = MakeCodec(CodecOptionsFrom(config));
  ASSERT_TRUE(codec.ok()) << codec.status();
  EXPECT_EQ((*codec)->kind(), CodecKind::kInt4);
  EXPECT_EQ((*codec)->alignment(), 32u);
  config.codec_block_size = 33;
  EXPECT_EQ(MakeCodec(CodecOptionsFrom(config)).status().code(), StatusCode::kInvalidArgument);
  const CommunicatorOptions dataplane = CommunicatorOptionsFrom(config);
  EXPECT_EQ(dataplane.timeout, 7000 * kMicrosPerMilli);
  EXPECT_DOUBLE_EQ(dataplane.link.bytes_per_s, 10e6);
}

TEST(RoundOptionsTest, DerivesWhatTheDriverReadsOnce) {
  Config config = testing_util::ConcurrentJobConfig(1, 40, 0);
  config.fragments = 4;
  config.total_steps = 200;
  config.rounds_in_flight = 0;  // as many as fragments
  const RoundOptions options = MakeRoundOptions(config, Schedule(4, 40));
  EXPECT_TRUE(options.concurrent);
  EXPECT_EQ(options.rounds_in_flight, 4u);
  EXPECT_EQ(options.fragment_period, 10u);
  EXPECT_EQ(options.final_period, 40u);
  // No round is launched where it could only be taken up after step 200.
  EXPECT_FALSE(options.InFinalPeriod(160));
  EXPECT_TRUE(options.InFinalPeriod(161));
  EXPECT_TRUE(options.InFinalPeriod(200));
  EXPECT_FALSE(options.InFinalPeriod(201));
  // At shutdown in the final period, the last boundary is the period's start's.
  EXPECT_EQ(options.LastBoundary(200), 151u);
  EXPECT_EQ(options.LastBoundary(100), 91u);

  config.concurrent_outer_step = false;
  const RoundOptions synchronous = MakeRoundOptions(config, Schedule(4, 40));
  EXPECT_EQ(synchronous.rounds_in_flight, 1u);
  EXPECT_EQ(synchronous.final_period, 0u);
  EXPECT_FALSE(synchronous.InFinalPeriod(200));
}

TEST(RoundOptionsTest, DeslocIntervalsInRoundsAndMomentsItNeeds) {
  Config config = testing_util::SynchronousJobConfig(1, 10);
  config.desloc = true;
  config.momentum_sync_period_steps = 20;
  config.second_moment_sync_period_steps = 0;  // 6 H
  const RoundOptions options = MakeRoundOptions(config, Schedule(1, 10));
  EXPECT_EQ(options.desloc_rounds[0], 2u);
  EXPECT_EQ(options.desloc_rounds[1], 6u);
  const Status without = options.CheckMoments(false);
  EXPECT_EQ(without.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(without.message().find("desloc"), std::string::npos) << without;
  EXPECT_TRUE(options.CheckMoments(true).ok());

  config.desloc = false;
  config.heal_inner_optimizer = true;
  const Status heal = MakeRoundOptions(config, Schedule(1, 10)).CheckMoments(false);
  EXPECT_NE(heal.message().find("heal_inner_optimizer"), std::string::npos) << heal;
}

// An outer state of one rank over four parameters starting at `start`.
class OuterStateTest : public ::testing::Test {
 protected:
  struct Learner {
    std::unique_ptr<fakes::Values> values;
    std::unique_ptr<RoundPolicy> policy = SingleRankPolicy();
    uint64_t copies = 0;
    std::unique_ptr<OuterState> outer;
  };
  std::unique_ptr<Learner> Make(float start, CheckpointOptions options = {}) {
    auto learner = std::make_unique<Learner>();
    learner->values = std::make_unique<fakes::Values>(start);
    learner->outer =
        std::make_unique<OuterState>(options, *learner->values, schedule_, &learner->copies, pool_,
                                     *learner->policy, "learner-a");
    return learner;
  }

  ThreadPool pool_{1};
  const FragmentSchedule schedule_ = Schedule(1, 10);
};

// Imported with its parameters, an export's global state becomes the
// parameters too; keeping them, the exporting learner's step and tokens
// since its round come back and the parameters stay the caller's.
TEST_F(OuterStateTest, AnExportImportsWithItsParametersOrKeepingTheCallers) {
  auto a = Make(2.0f);
  a->outer->book().at(0).tokens_since_round = 123;
  StatusOr<std::string> bytes = a->outer->Export({37, 3, 640});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  for (bool keep : {false, true}) {
    SCOPED_TRACE(keep ? "keep_parameters" : "with its parameters");
    auto b = Make(5.0f);
    StatusOr<Restored> restored = b->outer->Import(*bytes, keep);
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_EQ(restored->round_id, 3u);
    if (keep) {
      EXPECT_EQ(restored->step, 37u);
    }
    EXPECT_EQ(b->outer->book().at(0).tokens_since_round, keep ? 123u : 0u);
    for (float v : b->values->values()) EXPECT_EQ(v, keep ? 5.0f : 2.0f);
    for (float v : b->outer->book().at(0).state->global()) EXPECT_EQ(v, 2.0f);
  }
}

TEST_F(OuterStateTest, BadBytesAndAMissingResumeFileAreErrorsThatSayWhat) {
  auto a = Make(1.0f);
  StatusOr<Restored> garbage = a->outer->Import("not a checkpoint", false);
  EXPECT_FALSE(garbage.ok());
  EXPECT_NE(std::string(garbage.status().message()).find("imported state"), std::string::npos)
      << garbage.status();
  CheckpointOptions options;
  options.resume_from = testing_util::MakeTempDir() + "/absent.mend";
  auto b = Make(1.0f, options);
  StatusOr<std::optional<Restored>> started = b->outer->Start(0);
  ASSERT_FALSE(started.ok());
  EXPECT_NE(std::string(started.status().message()).find("resume_from"), std::string::npos)
      << started.status();
}

TEST_F(OuterStateTest, CheckpointsEveryNRoundsAndResumesFromTheNewest) {
  CheckpointOptions options;
  options.dir = testing_util::MakeTempDir();
  options.keep = 3;
  options.every_rounds = 2;
  options.resume = true;
  auto a = Make(3.0f, options);
  StatusOr<std::optional<Restored>> fresh = a->outer->Start(0);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_FALSE(fresh->has_value());
  for (uint64_t round = 1; round <= 5; ++round)
    ASSERT_TRUE(a->outer->MaybeCheckpoint({round * 10, round, 0}, 0, 2, false).ok());
  // Rank 1 of a round never writes; `always` writes off the interval.
  ASSERT_TRUE(a->outer->MaybeCheckpoint({60, 6, 0}, 1, 2, true).ok());
  a->outer->Join();
  EXPECT_EQ(a->outer->written(), 2u);  // rounds 2 and 4
  EXPECT_EQ(a->outer->failed(), 0u);

  auto b = Make(9.0f, options);
  StatusOr<std::optional<Restored>> resumed = b->outer->Start(0);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ASSERT_TRUE(resumed->has_value());
  EXPECT_EQ((*resumed)->round_id, 4u);
  for (float v : b->values->values()) EXPECT_EQ(v, 3.0f);
}

}  // namespace
}  // namespace mend::reducer
