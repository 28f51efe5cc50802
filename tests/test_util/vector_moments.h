// An inner optimizer's Adam moments over plain vectors, for the round
// driver's tests without LibTorch: betas 0.9 and 0.95, a step count, and
// Adam's update of both moments. Read fails while it has no state (before
// its first step, unless it starts with some).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "reducer/flat_state.h"

namespace mend::reducer {

class VectorMoments final : public FlatMoments {
 public:
  // No state yet: n zeros each, step 0.
  explicit VectorMoments(size_t n) : values_{std::vector<float>(n), std::vector<float>(n)} {}
  // State from the start.
  VectorMoments(std::vector<float> first, std::vector<float> second, uint64_t step)
      : values_{std::move(first), std::move(second)}, step_(step), has_state_(true) {}

  size_t size() const override { return values_[0].size(); }
  bool Read(Which which, std::span<float> out) const override {
    if (!has_state_) return false;
    std::copy(values_[which].begin(), values_[which].end(), out.begin());
    return true;
  }
  void Adjust(Which which, std::span<const float> target, std::span<const float> snapshot,
              float weight) override {
    AdjustMoment(which, values_[which], target, snapshot, weight);
  }
  void Replace(Which which, std::span<const float> target) override {
    std::copy(target.begin(), target.end(), values_[which].begin());
  }
  double beta(Which which) const override { return which == kFirst ? kBeta1 : kBeta2; }
  uint64_t step() const override { return step_; }
  void set_step(uint64_t step) override { step_ = step; }

  // One optimizer step with gradient(i) for value i.
  void Step(const std::function<float(size_t)>& gradient) {
    has_state_ = true;
    ++step_;
    for (size_t i = 0; i < size(); ++i) {
      const float g = gradient(i);
      values_[0][i] = static_cast<float>(kBeta1) * values_[0][i] + (1 - kBeta1f) * g;
      values_[1][i] = static_cast<float>(kBeta2) * values_[1][i] + (1 - kBeta2f) * g * g;
    }
  }
  const std::vector<float>& values(Which which) const { return values_[which]; }
  // Both moments, then the step count.
  std::vector<float> All() const {
    std::vector<float> all = values_[0];
    all.insert(all.end(), values_[1].begin(), values_[1].end());
    all.push_back(static_cast<float>(step_));
    return all;
  }

  static constexpr double kBeta1 = 0.9;
  static constexpr double kBeta2 = 0.95;

 private:
  static constexpr float kBeta1f = static_cast<float>(kBeta1);
  static constexpr float kBeta2f = static_cast<float>(kBeta2);
  std::vector<float> values_[2];
  uint64_t step_ = 0;
  bool has_state_ = false;
};

}  // namespace mend::reducer
