#include "reducer/round_options.h"

#include "reducer/fragment_book.h"

namespace mend::reducer {

uint64_t RoundOptions::LastBoundary(uint64_t step) const {
  const uint64_t end =
      !InFinalPeriod(step) ? step : total_steps - std::min(total_steps, final_period);
  return end + 1 - std::min(end + 1, fragment_period);
}

bool RoundOptions::IsFinalMerge(const FragmentSchedule& schedule, uint64_t step,
                                int fragment) const {
  return final_merge_step > 0 && step >= final_merge_step &&
         (concurrent || !schedule.StartsAt(fragment, static_cast<int64_t>(final_merge_step)));
}

Status RoundOptions::CheckMoments(bool given) const {
  if (desloc && !given) {
    return InvalidArgumentError(
        "desloc = true: the reducer was given no inner optimizer moments (DES-LOC averages the "
        "moments of Adam or AdamW)");
  }
  if (heal_inner_optimizer && !given) {
    return InvalidArgumentError(
        "heal_inner_optimizer = true: the reducer was given no inner optimizer moments (use Adam "
        "or AdamW)");
  }
  return OkStatus();
}

}  // namespace mend::reducer
