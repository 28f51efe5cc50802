#include "outer/overlap_tuner.h"

#include <algorithm>
#include <cmath>

namespace mend::outer {

OverlapTuner::OverlapTuner(int64_t configured, uint64_t cap)
    : configured_(std::max<int64_t>(0, configured)), cap_(std::max<uint64_t>(1, cap)) {}

void OverlapTuner::RecordStep(double seconds) {
  if (!(seconds > 0) || !std::isfinite(seconds)) return;
  step_seconds_ = step_seconds_ == 0
                      ? seconds
                      : (1 - kStepSmoothing) * step_seconds_ + kStepSmoothing * seconds;
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
  if (rounds_.empty() || step_seconds_ <= 0) return cap_;
  const double steps = std::ceil(kMargin * round_seconds() / step_seconds_) + 1;
  if (steps >= static_cast<double>(cap_)) return cap_;
  return std::max<uint64_t>(1, static_cast<uint64_t>(steps));
}

}  // namespace mend::outer
