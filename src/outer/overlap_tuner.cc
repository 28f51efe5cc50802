#include "outer/overlap_tuner.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace mend::outer {

OverlapTuner::OverlapTuner(int64_t configured, uint64_t cap, bool applied_on_arrival)
    : configured_(std::max<int64_t>(0, configured)),
      cap_(std::max<uint64_t>(1, cap)),
      applied_on_arrival_(applied_on_arrival) {}

void OverlapTuner::RecordStep(double seconds) {
  if (!(seconds > 0) || !std::isfinite(seconds)) return;
  steps_.push_back(seconds);
  while (steps_.size() > kStepsKept) steps_.pop_front();
}

double OverlapTuner::step_seconds() const {
  if (steps_.empty()) return 0;
  std::vector<double> sorted(steps_.begin(), steps_.end());
  const size_t mid = sorted.size() / 2;
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<ptrdiff_t>(mid), sorted.end());
  if (sorted.size() % 2 == 1) return sorted[mid];
  const double upper = sorted[mid];
  const double lower =
      *std::max_element(sorted.begin(), sorted.begin() + static_cast<ptrdiff_t>(mid));
  return (lower + upper) / 2;
}

void OverlapTuner::RecordRound(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return;
  rounds_.push_back(seconds);
  while (rounds_.size() > kRoundsKept) rounds_.pop_front();
}

double OverlapTuner::round_seconds() const {
  return rounds_.empty() ? 0 : *std::max_element(rounds_.begin(), rounds_.end());
}

uint64_t OverlapTuner::Tau() const {
  if (configured_ > 0) return static_cast<uint64_t>(configured_);
  if (applied_on_arrival_ || rounds_.empty()) return cap_;
  const double step = step_seconds();
  if (step <= 0) return cap_;
  const double steps = std::ceil(kMargin * round_seconds() / step) + 1;
  if (steps >= static_cast<double>(cap_)) return cap_;
  return std::max<uint64_t>(1, static_cast<uint64_t>(steps));
}

}  // namespace mend::outer
