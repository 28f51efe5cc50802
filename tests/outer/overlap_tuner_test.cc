#include "outer/overlap_tuner.h"

#include <gtest/gtest.h>

namespace mend::outer {
namespace {

TEST(OverlapTunerTest, ExplicitOverlapStepsIsTakenAsGiven) {
  OverlapTuner tuner(/*configured=*/3, /*cap=*/49);
  EXPECT_FALSE(tuner.automatic());
  EXPECT_EQ(tuner.Tau(), 3u);
  tuner.RecordStep(0.05);
  tuner.RecordRound(10.0);
  EXPECT_EQ(tuner.Tau(), 3u);
  EXPECT_EQ(OverlapTuner(80, 49).Tau(), 80u);  // beyond the schedule: the next boundary waits
}

TEST(OverlapTunerTest, StartsAtTheCapUntilARoundWasMeasured) {
  OverlapTuner tuner(0, 49);
  EXPECT_TRUE(tuner.automatic());
  EXPECT_EQ(tuner.Tau(), 49u);
  tuner.RecordStep(0.05);
  EXPECT_EQ(tuner.Tau(), 49u);
  EXPECT_EQ(OverlapTuner(0, 0).Tau(), 1u);  // a one-step fragment period still gets a step
}

TEST(OverlapTunerTest, HidesTheRoundWithAMargin) {
  OverlapTuner tuner(0, 99);
  tuner.RecordStep(0.1);
  tuner.RecordRound(1.0);  // 10 steps; 1.25x -> 12.5 -> 13, +1
  EXPECT_EQ(tuner.Tau(), 14u);
  tuner.RecordRound(0.2);  // the slowest of the last rounds counts
  EXPECT_EQ(tuner.Tau(), 14u);
  for (int i = 0; i < 4; ++i) tuner.RecordRound(0.2);  // the slow one has aged out: 2.5 -> 3, +1
  EXPECT_EQ(tuner.Tau(), 4u);
  tuner.RecordRound(0.0);
  EXPECT_GE(tuner.Tau(), 1u);
}

TEST(OverlapTunerTest, CappedByTheFragmentSchedule) {
  OverlapTuner tuner(0, 24);
  tuner.RecordStep(0.05);
  tuner.RecordRound(4.0);  // 80 steps would hide it; the next boundary comes after 25
  EXPECT_EQ(tuner.Tau(), 24u);
}

TEST(OverlapTunerTest, StepTimeIsTheMedianOfRecentStepsAndBadSamplesIgnored) {
  OverlapTuner tuner(0, 1000);
  tuner.RecordStep(0.1);
  tuner.RecordStep(-1);
  tuner.RecordStep(0.0);
  EXPECT_DOUBLE_EQ(tuner.step_seconds(), 0.1);
  tuner.RecordStep(0.2);  // two samples: their mean
  EXPECT_NEAR(tuner.step_seconds(), 0.15, 1e-12);
  for (int i = 0; i < 10; ++i) tuner.RecordStep(0.1);
  // An evaluation between two steps: one long sample does not move the estimate, nor tau.
  tuner.RecordRound(1.0);
  const uint64_t tau = tuner.Tau();
  EXPECT_EQ(tau, 14u);  // 1.25 x 1.0 / 0.1 -> 13, +1
  tuner.RecordStep(5.0);
  EXPECT_DOUBLE_EQ(tuner.step_seconds(), 0.1);
  EXPECT_EQ(tuner.Tau(), tau);
  // A lasting change does, once it is most of the kept steps.
  for (size_t i = 0; i < OverlapTuner::kStepsKept / 2 + 1; ++i) tuner.RecordStep(0.04);
  EXPECT_DOUBLE_EQ(tuner.step_seconds(), 0.04);
  EXPECT_EQ(tuner.Tau(), 33u);  // 1.25 x 1.0 / 0.04 = 31.25 -> 32, +1
  tuner.RecordRound(-3);
  EXPECT_EQ(tuner.round_seconds(), 1.0);
}

TEST(OverlapTunerTest, AppliedOnArrivalTauIsTheCap) {
  // A learner of one rank applies a result when it arrives: a tau below the
  // cap would only make a step wait for a round a little late.
  OverlapTuner tuner(0, 99, /*applied_on_arrival=*/true);
  tuner.RecordStep(0.1);
  tuner.RecordRound(1.0);
  EXPECT_EQ(tuner.Tau(), 99u);
  EXPECT_EQ(OverlapTuner(7, 99, true).Tau(), 7u);  // overlap_steps as given
}

}  // namespace
}  // namespace mend::outer
