#include "coordinator/failslow_detector.h"

#include <vector>

#include "gtest/gtest.h"

namespace mend::coordinator {
namespace {

TEST(StepTimeWindowTest, MedianOfTheLastSamplesOnly) {
  StepTimeWindow window(3);
  EXPECT_EQ(window.Median(), 0);
  window.Add(10);
  EXPECT_EQ(window.Median(), 10);
  window.Add(30);
  EXPECT_EQ(window.Median(), 20);
  window.Add(20);
  EXPECT_EQ(window.Median(), 20);
  window.Add(100);  // drops 10
  window.Add(100);  // drops 30
  EXPECT_EQ(window.size(), 3u);
  EXPECT_EQ(window.Median(), 100);
}

TEST(RobustZScoresTest, OutlierStandsOutAndOthersDoNot) {
  std::vector<double> medians = {100, 102, 98, 101, 300};
  auto z = RobustZScores(medians, 0.05);
  ASSERT_EQ(z.size(), 5u);
  EXPECT_GT(z[4], 10);
  for (int i = 0; i < 4; ++i) EXPECT_LT(std::abs(z[i]), 1.0) << i;
}

TEST(RobustZScoresTest, IdenticalValuesUseTheFloorNotInfinity) {
  std::vector<double> medians = {100, 100, 300};
  auto z = RobustZScores(medians, 0.05);
  // MAD is 0; the floor 5% of 100 = 5 gives 0.6745 * 200 / 5.
  EXPECT_NEAR(z[2], 0.6745 * 200 / 5, 1e-9);
  EXPECT_EQ(z[0], 0);
}

TEST(RobustZScoresTest, SmallDifferencesUnderTheFloorAreNotOutliers) {
  std::vector<double> medians = {100, 100, 110};
  auto z = RobustZScores(medians, 0.05);
  EXPECT_LT(z[2], 3.5);
}

TEST(RobustZScoresTest, AllZeroGivesZeroScores) {
  std::vector<double> medians = {0, 0, 0};
  auto z = RobustZScores(medians, 0.05);
  for (double value : z) EXPECT_EQ(value, 0);
}

TEST(NextSlowFlagTest, FlagsAboveThresholdAndClearsBelowHalf) {
  FailSlowOptions options;
  options.zscore_threshold = 4;
  EXPECT_FALSE(NextSlowFlag(false, 4.0, options));
  EXPECT_TRUE(NextSlowFlag(false, 4.1, options));
  EXPECT_TRUE(NextSlowFlag(true, 2.5, options));  // hysteresis band
  EXPECT_FALSE(NextSlowFlag(true, 1.9, options));
}

}  // namespace
}  // namespace mend::coordinator
