// Fail-slow detection (after FALCON, arXiv 2410.12588): a learner whose
// inner-step time is a persistent outlier among all learners.
//
// Each learner keeps a sliding window of its last `window_steps` step times.
// Its window median is compared with the medians of all learners by a robust
// z-score, z = 0.6745 (m - median) / MAD, where MAD is floored at
// `mad_floor_fraction` of the median so that near-identical learners do not
// make every small difference an outlier. A learner is flagged slow when z
// rises above the threshold and cleared when z falls below
// threshold x clear_ratio (hysteresis, so a learner near the edge does not flap).
//
// Thread-safety: none; the owner (Membership, under the lighthouse mutex) serializes.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace mend::coordinator {

struct FailSlowOptions {
  double zscore_threshold = 3.5;
  size_t window_steps = 16;
  // A learner's window needs this many samples before it is judged.
  size_t min_samples = 4;
  // Fewer judged learners than this and nobody is flagged: with two learners
  // there is no telling which one is the outlier.
  size_t min_learners = 3;
  double clear_ratio = 0.5;
  double mad_floor_fraction = 0.05;
};

// Ring buffer of the most recent step times (milliseconds) of one learner.
class StepTimeWindow {
 public:
  explicit StepTimeWindow(size_t capacity);

  void Add(double step_ms);
  size_t size() const { return count_; }
  // Median of the samples in the window; 0 when empty.
  double Median() const;

 private:
  std::vector<double> values_;
  size_t next_ = 0;
  size_t count_ = 0;
};

// Robust z-score of each value against all of them. The result has the size
// of `values`; with fewer than one value it is empty.
std::vector<double> RobustZScores(std::span<const double> values, double mad_floor_fraction);

// The slow flag after seeing `zscore`, given the flag before.
bool NextSlowFlag(bool slow_before, double zscore, const FailSlowOptions& options);

}  // namespace mend::coordinator
