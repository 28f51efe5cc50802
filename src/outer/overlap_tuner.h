// tau, the inner steps a concurrent round may take before a learner waits
// for it: the configured overlap_steps, or (overlap_steps = 0) chosen:
//  - a learner of one rank applies a round's result as soon as it arrives,
//    so tau only bounds how stale it may get before the learner stops to
//    wait: it is the cap (the fragment schedule's; more would make the next
//    boundary wait anyway), and no step waits for a round that is late by
//    less than that;
//  - a group's ranks apply together at boundary + tau (each sees its slice
//    arrive at its own time), so there tau is the staleness itself and is
//    derived from what the learner measures: tau = ceil(margin * round time /
//    inner-step time) + 1, the steps that hide the round (the auto-tuner's
//    N* = ceil(G / T_step) with the round's time in place of G), capped.
// An explicit overlap_steps is taken as given.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>

namespace mend::outer {

class OverlapTuner {
 public:
  static constexpr double kMargin = 1.25;   // rounds vary; a little more hides the slower ones
  static constexpr size_t kRoundsKept = 4;  // the slowest of the last few rounds is the estimate
  // The inner-step time is the median of the last few: an evaluation or a
  // checkpoint between two steps is one long sample, and must not shrink tau.
  static constexpr size_t kStepsKept = 15;

  // `configured` > 0 fixes tau (as given: an override); 0 chooses it within
  // [1, cap] (`cap` is raised to 1): the cap when results are applied on
  // arrival (`applied_on_arrival`: a learner of one rank), else tuned.
  OverlapTuner(int64_t configured, uint64_t cap, bool applied_on_arrival = false);

  // The training time of one inner step (outside the reducer), in seconds.
  void RecordStep(double seconds);
  // A round's time from its launch to its result being ready, in seconds.
  void RecordRound(double seconds);

  // tau for a round launched now. Before the first measured round it is the
  // cap: nothing is known yet, and a result is applied when it arrives.
  uint64_t Tau() const;

  bool automatic() const { return configured_ == 0; }
  double step_seconds() const;   // the estimate: the median of the kept steps (0: none yet)
  double round_seconds() const;  // the estimate: the slowest of the kept rounds (0: none yet)

 private:
  const int64_t configured_;
  const uint64_t cap_;
  const bool applied_on_arrival_;
  std::deque<double> steps_;
  std::deque<double> rounds_;
};

}  // namespace mend::outer
