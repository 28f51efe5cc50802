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

TEST(OverlapTunerTest, StepTimeIsSmoothedAndBadSamplesIgnored) {
  OverlapTuner tuner(0, 1000);
  tuner.RecordStep(0.1);
  tuner.RecordStep(-1);
  tuner.RecordStep(0.0);
  EXPECT_DOUBLE_EQ(tuner.step_seconds(), 0.1);
  tuner.RecordStep(0.2);  // 0.9 * 0.1 + 0.1 * 0.2
  EXPECT_NEAR(tuner.step_seconds(), 0.11, 1e-12);
  tuner.RecordRound(-3);
  EXPECT_EQ(tuner.round_seconds(), 0.0);
}

}  // namespace
}  // namespace mend::outer
