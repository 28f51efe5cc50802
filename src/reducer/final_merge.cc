#include "reducer/final_merge.h"

#include <algorithm>
#include <vector>

#include "core/status_format.h"
#include "spdlog/spdlog.h"

namespace mend::reducer {
namespace {

enum class FinalRound { kMerged, kNotMerged, kLeftOut };

// Fragment f's round of the final merge: whether it merged, or closed
// without this learner.
StatusOr<FinalRound> MergeFragment(Flights& flights, ReducerStats& stats, int f, bool last,
                                   const std::function<Decision(Event)>& ask) {
  MEND_RETURN_IF_ERROR(flights.Launch(f, 0, /*final_merge=*/true));
  flights.head().checkpoint = last;
  MEND_ASSIGN_OR_RETURN(Verdict verdict, flights.AwaitVerdict(flights.head(), stats.steps, false));
  if (ask(VerdictEvent(verdict, /*ending=*/true)).action == Action::kCallOff) {
    if (verdict == Verdict::kShortOfQuorum) {
      spdlog::warn(
          "fragment {}: the final merge at step {} has too few learners left to form its round; "
          "it keeps its own parameters",
          f, stats.steps);
    }
    flights.CallOff(flights.head());
    MEND_RETURN_IF_ERROR(flights.TakeUp());
    return verdict == Verdict::kPassedOver ? FinalRound::kLeftOut : FinalRound::kNotMerged;
  }
  const uint64_t rounds = stats.rounds;
  MEND_RETURN_IF_ERROR(flights.TakeUp());
  if (stats.rounds == rounds) {
    spdlog::warn("fragment {}: the final merge failed; this learner keeps its own parameters", f);
    return FinalRound::kNotMerged;
  }
  stats.final_rounds++;
  return FinalRound::kMerged;
}

}  // namespace

StatusOr<bool> RunFinalMerge(Flights& flights, const OuterState& outer, const RoundOptions& options,
                             ReducerStats& stats, const Clock& clock,
                             const std::function<Decision(Event)>& ask) {
  if (options.final_merge_step == 0 || stats.steps != options.final_merge_step) return false;
  std::vector<int> due;
  for (int f = 0; f < static_cast<int>(outer.book().size()); ++f) {
    // (A learner restored at this step from a checkpoint holds its merged state.)
    const uint64_t last = outer.book().at(f).last_round_boundary;
    if (std::max(last, outer.restored_step()) < stats.steps) due.push_back(f);
  }
  const Micros begin = clock.NowMicros();
  int merged = 0;
  for (int f : due) {
    MEND_ASSIGN_OR_RETURN(FinalRound went, MergeFragment(flights, stats, f, f == due.back(), ask));
    if (went != FinalRound::kMerged) return went == FinalRound::kLeftOut;
    merged++;
  }
  if (merged > 0) {
    spdlog::info(
        "final merge: {} round(s) at step {} in {:.3f} s; their members hold the same model",
        merged, stats.steps, static_cast<double>(clock.NowMicros() - begin) / kMicrosPerSecond);
  }
  return false;
}

}  // namespace mend::reducer
