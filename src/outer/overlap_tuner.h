// tau, the inner steps a concurrent round may take before a learner waits
// for it: the configured overlap_steps, or (overlap_steps = 0) derived from
// what this learner measures: tau = ceil(margin * round time / inner-step
// time) + 1, the number of steps that hide the round (the auto-tuner's
// N* = ceil(G / T_step) with the round's time in place of G), capped by the
// fragment schedule (the next fragment's boundary joins the round anyway;
// an explicit overlap_steps is taken as given).
// A round's result is applied as soon as it arrives either way; tau only
// bounds how stale it may get before the learner stops to wait for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>

namespace mend::outer {

class OverlapTuner {
 public:
  static constexpr double kMargin = 1.25;   // rounds vary; a little more hides the slower ones
  static constexpr size_t kRoundsKept = 4;  // the slowest of the last few rounds is the estimate
  static constexpr double kStepSmoothing = 0.1;  // EMA weight of a new inner-step time

  // `configured` > 0 fixes tau (as given: an override); 0 tunes it within
  // [1, cap] (`cap` is raised to 1).
  OverlapTuner(int64_t configured, uint64_t cap);

  // The training time of one inner step (outside the reducer), in seconds.
  void RecordStep(double seconds);
  // A round's time from its launch to its result being ready, in seconds.
  void RecordRound(double seconds);

  // tau for a round launched now. Before the first measured round it is the
  // cap: nothing is known yet, and a result is applied when it arrives.
  uint64_t Tau() const;

  bool automatic() const { return configured_ == 0; }
  double step_seconds() const { return step_seconds_; }
  double round_seconds() const;  // the estimate: the slowest of the kept rounds (0: none yet)

 private:
  const int64_t configured_;
  const uint64_t cap_;
  double step_seconds_ = 0;  // EMA; 0: no step measured
  std::deque<double> rounds_;
};

}  // namespace mend::outer
