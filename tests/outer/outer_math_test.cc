// The outer synchronizer's arithmetic against hand-computed values and the
// identities docs/architecture.md states ("Outer synchronizer arithmetic").
#include <vector>

#include "gtest/gtest.h"
#include "mend/outer.h"

namespace mend {
namespace {

TEST(OuterMathTest, NesterovStepMatchesHandComputedValues) {
  // theta = 1, m = 0.5, delta = 0.2, eta = 0.7, mu = 0.9:
  //   m' = 0.9 * 0.5 + 0.2 = 0.65
  //   theta' = 1 - 0.7 * (0.2 + 0.9 * 0.65) = 1 - 0.7 * 0.785 = 0.4505
  std::vector<float> theta = {1.0f, -2.0f};
  std::vector<float> momentum = {0.5f, 0.0f};
  std::vector<float> delta = {0.2f, -1.0f};
  OuterNesterovStep(theta, momentum, delta, {0.7f, 0.9f});
  EXPECT_NEAR(momentum[0], 0.65f, 1e-6);
  EXPECT_NEAR(theta[0], 0.4505f, 1e-6);
  // Second value: m' = -1, theta' = -2 - 0.7 * (-1 + 0.9 * -1) = -2 + 1.33 = -0.67
  EXPECT_NEAR(momentum[1], -1.0f, 1e-6);
  EXPECT_NEAR(theta[1], -0.67f, 1e-6);
}

TEST(OuterMathTest, LrOneMomentumZeroIsParameterAveraging) {
  // Two learners from the same theta_g; the merged pseudo-gradient with equal
  // weights is the mean of theirs, and the step lands on the mean of their
  // local parameters.
  std::vector<float> base = {1.0f, 2.0f, 3.0f};
  std::vector<float> a = {1.5f, 1.0f, 2.0f};
  std::vector<float> b = {0.5f, 4.0f, 3.5f};
  std::vector<float> delta_a(3), delta_b(3), merged(3);
  PseudoGradient(base, a, delta_a);
  PseudoGradient(base, b, delta_b);
  for (int i = 0; i < 3; ++i) merged[i] = 0.5f * delta_a[i] + 0.5f * delta_b[i];
  std::vector<float> theta = base;
  std::vector<float> momentum(3, 0.0f);
  OuterNesterovStep(theta, momentum, merged, {1.0f, 0.0f});
  for (int i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(theta[i], 0.5f * (a[i] + b[i])) << i;
}

TEST(OuterMathTest, ExactApplyKeepsLocalProgressExactlyOnce) {
  // Boundary at step s: theta_i(s) = base - delta_i. Training moves it by p
  // until the result arrives; afterwards theta_i = theta_g' + p.
  std::vector<float> base = {1.0f, 1.0f};
  std::vector<float> at_boundary = {0.8f, 1.3f};
  std::vector<float> delta_i(2);
  PseudoGradient(base, at_boundary, delta_i);
  std::vector<float> progress = {0.05f, -0.1f};
  std::vector<float> theta_i = {at_boundary[0] + progress[0], at_boundary[1] + progress[1]};
  std::vector<float> theta_g_new = {0.9f, 1.2f};
  ApplyOuterResult(theta_i, theta_g_new, base, delta_i, OuterApply::kExact, 0.5f);
  EXPECT_FLOAT_EQ(theta_i[0], 0.9f + 0.05f);
  EXPECT_FLOAT_EQ(theta_i[1], 1.2f - 0.1f);
  // The next round's pseudo-gradient (from the new base) holds p once.
  std::vector<float> next_delta(2);
  PseudoGradient(theta_g_new, theta_i, next_delta);
  EXPECT_NEAR(next_delta[0], -0.05f, 1e-6);
  EXPECT_NEAR(next_delta[1], 0.1f, 1e-6);
}

TEST(OuterMathTest, SynchronousExactApplyReplacesLocalWithGlobal) {
  std::vector<float> base = {2.0f};
  std::vector<float> theta_i = {1.5f};
  std::vector<float> delta_i(1);
  PseudoGradient(base, theta_i, delta_i);
  std::vector<float> theta_g_new = {1.7f};
  ApplyOuterResult(theta_i, theta_g_new, base, delta_i, OuterApply::kExact, 0.5f);
  EXPECT_FLOAT_EQ(theta_i[0], 1.7f);
}

TEST(OuterMathTest, MixAveragesLocalAndGlobalByAlpha) {
  std::vector<float> theta_i = {1.0f};
  std::vector<float> unused = {0.0f};
  ApplyOuterResult(theta_i, std::vector<float>{3.0f}, unused, unused, OuterApply::kMix, 0.25f);
  EXPECT_FLOAT_EQ(theta_i[0], 0.25f * 1.0f + 0.75f * 3.0f);
  std::vector<float> replaced = {1.0f};
  ApplyOuterResult(replaced, std::vector<float>{3.0f}, unused, unused, OuterApply::kMix, 0.0f);
  EXPECT_FLOAT_EQ(replaced[0], 3.0f);
}

TEST(FragmentScheduleTest, FragmentsAreStaggeredByPeriodOverFragments) {
  auto schedule = FragmentSchedule::Make(4, 100);
  ASSERT_TRUE(schedule.ok());
  std::vector<std::vector<int64_t>> starts(4);
  for (int64_t step = 1; step <= 300; ++step) {
    for (int64_t p = 0; p < 4; ++p) {
      if (schedule->StartsAt(p, step)) starts[p].push_back(step);
    }
  }
  EXPECT_EQ(starts[0], (std::vector<int64_t>{100, 200, 300}));
  EXPECT_EQ(starts[1], (std::vector<int64_t>{25, 125, 225}));
  EXPECT_EQ(starts[2], (std::vector<int64_t>{50, 150, 250}));
  EXPECT_EQ(starts[3], (std::vector<int64_t>{75, 175, 275}));
  EXPECT_EQ(FragmentOfLayer(5, 4), 1);
}

TEST(FragmentScheduleTest, OneFragmentIsPlainDiLoCo) {
  auto schedule = FragmentSchedule::Make(1, 3);
  ASSERT_TRUE(schedule.ok());
  std::vector<int64_t> starts;
  for (int64_t step = 0; step <= 9; ++step) {
    if (schedule->StartsAt(0, step)) starts.push_back(step);
  }
  EXPECT_EQ(starts, (std::vector<int64_t>{3, 6, 9}));
}

TEST(FragmentScheduleTest, BadSizesNameTheKey) {
  auto many = FragmentSchedule::Make(8, 4);
  ASSERT_FALSE(many.ok());
  EXPECT_NE(std::string(StatusMessage(many.status())).find("fragments = 8"), std::string::npos);
  EXPECT_FALSE(FragmentSchedule::Make(1, 0).ok());
}

}  // namespace
}  // namespace mend
