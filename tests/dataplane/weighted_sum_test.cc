// The reduce's vectorised sum against the formula element by element: the
// same bits, groups (racks) summed apart and then in order, the output
// overwriting an input, lengths past a block and not a multiple of lanes.
#include "dataplane/weighted_sum.h"

#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace mend::dataplane {
namespace {

TEST(WeightedSumTest, SumsEachRackThenTheRacksInOrderBitForBit) {
  constexpr size_t kValues = 2500;  // two blocks of 1024 and a tail of 452
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> x(3, std::vector<float>(kValues));
  for (auto& member : x) {
    for (float& v : member) v = normal(rng);
  }
  const std::vector<float> weights = {0.25f, 0.5f, 0.125f};
  const std::vector<std::vector<int>> groups = {{0, 2}, {1}};
  const float scale = 1.0f / 3.0f;
  std::vector<float> want(kValues);
  for (size_t i = 0; i < kValues; ++i) {
    float rack0 = weights[0] * x[0][i];
    rack0 += weights[2] * x[2][i];
    const float rack1 = weights[1] * x[1][i];
    want[i] = (rack0 + rack1) * scale;
  }
  // Into member 0's own values, as the reduce does with its slice.
  const std::vector<const float*> inputs = {x[0].data(), x[1].data(), x[2].data()};
  WeightedSum(x[0].data(), inputs, weights, groups, scale, kValues);
  EXPECT_EQ(std::memcmp(x[0].data(), want.data(), kValues * sizeof(float)), 0);
  // One rack, no scale: w0 x0 + w1 x1 + w2 x2 from left to right.
  std::vector<float> out(kValues), flat(kValues);
  for (size_t i = 0; i < kValues; ++i) {
    float sum = weights[0] * x[0][i];
    sum += weights[1] * x[1][i];
    sum += weights[2] * x[2][i];
    flat[i] = sum;
  }
  WeightedSum(out.data(), inputs, weights, {{0, 1, 2}}, 1.0f, kValues);
  EXPECT_EQ(std::memcmp(out.data(), flat.data(), kValues * sizeof(float)), 0);
}

}  // namespace
}  // namespace mend::dataplane
