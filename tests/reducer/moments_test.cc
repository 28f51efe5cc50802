// What a round brings to the inner optimizer's Adam moments
// (reducer/fragment_book.h, ApplyMoments): a heal's moments and step count,
// DES-LOC's averages, each as if they had been the moments at the boundary,
// with the optimizer's progress since kept. No network, no threads.
#include <cmath>
#include <span>
#include <vector>

#include "gtest/gtest.h"
#include "reducer/flat_state.h"
#include "reducer/fragment_book.h"
#include "reducer/round_flight.h"
#include "test_util/vector_moments.h"

namespace mend::reducer {
namespace {

// One optimizer step of `moments` with gradient g for every value.
void Step(VectorMoments& moments, float g) {
  moments.Step([g](size_t) { return g; });
}

// The moments `moments` holds at a boundary at `step`, snapshot as a round's flight does.
void Snap(const VectorMoments& moments, uint64_t step, InFlight& flight) {
  flight.boundary_step = step;
  flight.moment_step = moments.step();
  for (auto which : {FlatMoments::kFirst, FlatMoments::kSecond})
    flight.moments[which] = moments.values(which);
}

TEST(MomentsTest, AHealAppliedLaterStartsTheMomentsFromTheSourcesAndKeepsTheProgressSince) {
  // This learner's second moment was large at the boundary (early, large
  // gradients); the source's is small. Three small steps later the heal
  // arrives: adding (source - snapshot) would leave a negative second
  // moment, whose square root is NaN. Adam's moments after k steps keep
  // beta^k of where they started, so the result is the source's moments
  // moved by the same three steps, and the step count the source's plus 3.
  VectorMoments mine({0.5f, -0.5f}, {4.0f, 1.0f}, 20);
  InFlight flight;
  Snap(mine, 40, flight);
  const std::vector<float> source_first = {0.01f, 0.02f}, source_second = {0.001f, 0.002f};
  VectorMoments expected(source_first, source_second, 31);
  for (float g : {0.1f, -0.2f, 0.05f}) {
    Step(mine, g);
    Step(expected, g);
  }
  Outcome outcome;
  outcome.healed_moments[0] = source_first;
  outcome.healed_moments[1] = source_second;
  outcome.healed_moment_step = 31;
  const MomentsApplied applied = ApplyMoments(&mine, outcome, flight, 43);
  EXPECT_TRUE(applied.changed);
  EXPECT_EQ(applied.synced, 0u);
  for (auto which : {FlatMoments::kFirst, FlatMoments::kSecond}) {
    for (size_t k = 0; k < 2; ++k) {
      EXPECT_NEAR(mine.values(which)[k], expected.values(which)[k], 2e-6)
          << "moment " << which << " value " << k;
      if (which == FlatMoments::kSecond) {
        EXPECT_GE(mine.values(which)[k], 0.0f);
      }
    }
  }
  EXPECT_EQ(mine.step(), 34u);  // 31 + the 3 steps since the boundary
}

TEST(MomentsTest, AHealAtTheBoundaryTakesTheSourcesMomentsAndStepCountExactly) {
  VectorMoments mine({0.5f, -0.5f}, {4.0f, 1.0f}, 7);
  InFlight flight;
  Snap(mine, 40, flight);
  Outcome outcome;
  outcome.healed_moments[0] = {0.25f, 0.125f};
  outcome.healed_moments[1] = {0.0625f, 0.5f};
  outcome.healed_moment_step = 400;
  ApplyMoments(&mine, outcome, flight, 40);
  EXPECT_EQ(mine.values(FlatMoments::kFirst), outcome.healed_moments[0]);
  EXPECT_EQ(mine.values(FlatMoments::kSecond), outcome.healed_moments[1]);
  EXPECT_EQ(mine.step(), 400u);
}

TEST(MomentsTest, WithoutTheOptimizersStepCountTheReducersStepsSinceTheBoundaryCount) {
  // An optimizer that keeps no step count mend can see (step() is 0): the
  // reducer's steps since the boundary (2) are the optimizer's.
  VectorMoments mine({1.0f}, {2.0f}, 0);
  InFlight flight;
  Snap(mine, 10, flight);
  Step(mine, 0.5f);
  Step(mine, 0.5f);
  mine.set_step(0);
  VectorMoments expected({0.0f}, {0.0f}, 0);
  Step(expected, 0.5f);
  Step(expected, 0.5f);
  Outcome outcome;
  outcome.healed_moments[0] = {0.0f};
  outcome.healed_moments[1] = {0.0f};
  ApplyMoments(&mine, outcome, flight, 12);
  EXPECT_NEAR(mine.values(FlatMoments::kFirst)[0], expected.values(FlatMoments::kFirst)[0], 1e-6);
  EXPECT_NEAR(mine.values(FlatMoments::kSecond)[0], expected.values(FlatMoments::kSecond)[0], 1e-6);
  EXPECT_GE(mine.values(FlatMoments::kSecond)[0], 0.0f);
  EXPECT_EQ(mine.step(), 0u);  // none to take: the heal brought none
}

TEST(MomentsTest, DeslocAveragesAppliedLaterKeepTheProgressSinceAndTheStepCount) {
  VectorMoments mine({0.5f, 0.1f}, {3.0f, 0.2f}, 12);
  InFlight flight;
  Snap(mine, 12, flight);
  Outcome outcome;
  outcome.averaged_moments[0] = {0.3f, 0.0f};
  outcome.averaged_moments[1] = {0.5f, 0.1f};
  VectorMoments expected(outcome.averaged_moments[0], outcome.averaged_moments[1], 12);
  for (float g : {0.3f, 0.01f}) {
    Step(mine, g);
    Step(expected, g);
  }
  const MomentsApplied applied = ApplyMoments(&mine, outcome, flight, 14);
  EXPECT_EQ(applied.synced, 2u);
  for (auto which : {FlatMoments::kFirst, FlatMoments::kSecond}) {
    for (size_t k = 0; k < 2; ++k)
      EXPECT_NEAR(mine.values(which)[k], expected.values(which)[k], 1e-6);
  }
  EXPECT_EQ(mine.step(), 14u);  // an average brings no step count
}

TEST(MomentsTest, RoundingNeverLeavesANegativeSecondMoment) {
  // target 0: the adjusted second moment is the progress since alone, which
  // here is 0 (two steps of zero gradient); float rounding of current -
  // beta^2 * snapshot makes each of these -1.5e-8 to -3e-8 unless clamped.
  std::vector<float> v = {0.2329f, 0.4521f, 0.4658f};
  std::vector<float> snapshot;
  for (float value : v) snapshot.push_back(value / 0.95f / 0.95f);
  const std::vector<float> zero(3, 0.0f);
  AdjustMoment(FlatMoments::kSecond, v, zero, snapshot, static_cast<float>(0.95 * 0.95));
  for (float value : v) EXPECT_GE(value, 0.0f);
}

}  // namespace
}  // namespace mend::reducer
