// The round's vectorised kernels against the scalar arithmetic of
// mend/outer.h: the same bits in every mode, at lengths that are not a
// multiple of the lanes and from unaligned starts; sums of squares as a
// plain double sum gives them (to rounding: the kernels sum in lanes).
#include "outer/round_kernels.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "mend/config.h"
#include "mend/outer.h"

namespace mend::kernels {
namespace {

constexpr size_t kValues = 1037;  // 129 lanes of 8 and a tail of 5

std::vector<float> Random(uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(kValues + 1);
  for (float& v : values) v = normal(rng);
  return values;
}

// Bit for bit: a float equal by value could still differ in its sign of zero.
void ExpectSameBits(const std::vector<float>& got, const std::vector<float>& want,
                    const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    uint32_t a = 0, b = 0;
    std::memcpy(&a, &got[i], 4);
    std::memcpy(&b, &want[i], 4);
    ASSERT_EQ(a, b) << what << " differs at " << i << ": " << got[i] << " vs " << want[i];
  }
}

double Squares(const float* values, size_t n) {
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += static_cast<double>(values[i]) * values[i];
  return sum;
}

TEST(RoundKernelsTest, DifferenceIsThePseudoGradientBitForBit) {
  const std::vector<float> global = Random(1, 1.0f), theta = Random(2, 1.0f);
  for (size_t start : {0, 1}) {  // aligned and not
    const size_t n = kValues + 1 - start;
    std::vector<float> want(n), got(n);
    PseudoGradient(std::span(global).subspan(start), std::span(theta).subspan(start), want);
    const double squares = Difference(global.data() + start, theta.data() + start, got.data(), n);
    ExpectSameBits(got, want, "pseudo-gradient");
    EXPECT_NEAR(squares, Squares(want.data(), n), 1e-12 * Squares(want.data(), n));
  }
}

TEST(RoundKernelsTest, ProvisionalStepIsNesterovsStepWithTheLearnersOwnGradient) {
  const std::vector<float> global = Random(3, 1.0f), momentum = Random(4, 0.1f),
                           delta = Random(5, 0.01f);
  const OuterOptions outer{0.7f, 0.9f};
  // OuterNesterovStep on copies: p is the new theta_g.
  std::vector<float> p = global, m = momentum;
  OuterNesterovStep(p, m, delta, outer);
  std::vector<float> step_want(global.size());
  for (size_t i = 0; i < global.size(); ++i) step_want[i] = global[i] - p[i];
  std::vector<float> theta(global.size(), 123.0f), step(global.size());
  ProvisionalStep(global.data(), momentum.data(), delta.data(), theta.data(), step.data(),
                  global.size(), outer.lr, outer.momentum);
  ExpectSameBits(theta, p, "parameters");
  ExpectSameBits(step, step_want, "step");
}

struct Case {
  bool average;
  LocalUpdate local;
};

class RoundKernelsCommitTest : public testing::TestWithParam<Case> {};

TEST_P(RoundKernelsCommitTest, CommitIsTheOuterStepAndItsApplicationBitForBit) {
  const Case c = GetParam();
  const OuterOptions outer{0.7f, 0.9f};
  const float alpha = 0.3f;
  const std::vector<float> merged = Random(6, 0.01f), global = Random(7, 1.0f),
                           momentum = Random(8, 0.1f), theta = Random(9, 1.0f),
                           add = Random(10, 0.01f);
  for (size_t start : {0, 1}) {
    auto tail = [&](const std::vector<float>& v) {
      return std::vector<float>(v.begin() + static_cast<std::ptrdiff_t>(start), v.end());
    };
    const std::vector<float> d = tail(merged), old = tail(global), own = tail(add);
    // The scalar arithmetic: the outer step, then its application.
    std::vector<float> g_want = old, m_want = tail(momentum), theta_want = tail(theta);
    if (c.average) {
      OuterAverageStep(g_want, d);
    } else {
      OuterNesterovStep(g_want, m_want, d, outer);
    }
    switch (c.local) {
      case LocalUpdate::kReplace:
        theta_want = g_want;
        break;
      case LocalUpdate::kProgress:
        for (size_t i = 0; i < theta_want.size(); ++i) theta_want[i] += g_want[i] - old[i];
        break;
      case LocalUpdate::kExact:
        ApplyOuterResult(theta_want, g_want, old, own, OuterApply::kEager, 0);
        break;
      case LocalUpdate::kMix:
        ApplyOuterResult(theta_want, g_want, old, own, OuterApply::kMix, alpha);
        break;
    }
    std::vector<float> g = old, m = tail(momentum), th = tail(theta);
    CommitArgs args;
    args.average = c.average;
    args.lr = outer.lr;
    args.mu = outer.momentum;
    args.local = c.local;
    args.alpha = alpha;
    const double squares = Commit(args, d.data(), g.data(), m.data(), th.data(),
                                  c.local == LocalUpdate::kExact ? own.data() : nullptr, d.size());
    ExpectSameBits(g, g_want, "global state");
    ExpectSameBits(m, m_want, "momentum");
    ExpectSameBits(th, theta_want, "parameters");
    EXPECT_NEAR(squares, Squares(d.data(), d.size()), 1e-12 * Squares(d.data(), d.size()));
  }
}

std::string CaseName(const testing::TestParamInfo<Case>& info) {
  static const char* const kLocal[] = {"Replace", "Progress", "Exact", "Mix"};
  return std::string(info.param.average ? "Average" : "Nesterov") +
         kLocal[static_cast<int>(info.param.local)];
}

INSTANTIATE_TEST_SUITE_P(
    Modes, RoundKernelsCommitTest,
    testing::Values(Case{false, LocalUpdate::kReplace}, Case{false, LocalUpdate::kProgress},
                    Case{false, LocalUpdate::kExact}, Case{false, LocalUpdate::kMix},
                    Case{true, LocalUpdate::kReplace}, Case{true, LocalUpdate::kProgress},
                    Case{true, LocalUpdate::kExact}, Case{true, LocalUpdate::kMix}),
    CaseName);

}  // namespace
}  // namespace mend::kernels
