#include "coordinator/failslow_detector.h"

#include <algorithm>
#include <cmath>

namespace mend::coordinator {
namespace {

// Median of `values`; reorders them.
double MedianInPlace(std::vector<double>& values) {
  if (values.empty()) return 0;
  size_t middle = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + middle, values.end());
  double upper = values[middle];
  if (values.size() % 2 == 1) return upper;
  double lower = *std::max_element(values.begin(), values.begin() + middle);
  return (lower + upper) / 2;
}

// 0.6745 is the 75th percentile of the standard normal: it makes the MAD an
// estimate of the standard deviation for normal data (Iglewicz and Hoaglin).
constexpr double kMadToSigma = 0.6745;

}  // namespace

StepTimeWindow::StepTimeWindow(size_t capacity) : values_(std::max<size_t>(capacity, 1)) {}

void StepTimeWindow::Add(double step_ms) {
  values_[next_] = step_ms;
  next_ = (next_ + 1) % values_.size();
  count_ = std::min(count_ + 1, values_.size());
}

double StepTimeWindow::Median() const {
  std::vector<double> copy(values_.begin(), values_.begin() + static_cast<long>(count_));
  return MedianInPlace(copy);
}

std::vector<double> RobustZScores(std::span<const double> values, double mad_floor_fraction) {
  std::vector<double> scores(values.size(), 0.0);
  if (values.empty()) return scores;
  std::vector<double> scratch(values.begin(), values.end());
  double median = MedianInPlace(scratch);
  for (size_t i = 0; i < values.size(); ++i) scratch[i] = std::fabs(values[i] - median);
  double mad = MedianInPlace(scratch);
  double floor = mad_floor_fraction * std::fabs(median);
  double scale = std::max(mad, floor);
  if (scale <= 0) return scores;  // every value is zero
  for (size_t i = 0; i < values.size(); ++i) {
    scores[i] = kMadToSigma * (values[i] - median) / scale;
  }
  return scores;
}

bool NextSlowFlag(bool slow_before, double zscore, const FailSlowOptions& options) {
  if (slow_before) return zscore >= options.zscore_threshold * options.clear_ratio;
  return zscore > options.zscore_threshold;
}

}  // namespace mend::coordinator
