// FragmentSchedule's one check (mend/outer.h), in the core library so that
// CheckConfig applies the same rule (fragments within [1, H]) as every
// schedule made in code: the rule is written here only.
#include "core/status_format.h"
#include "fmt/format.h"
#include "mend/outer.h"

namespace mend {

StatusOr<FragmentSchedule> FragmentSchedule::Make(int64_t fragments, int64_t period) {
  if (period < 1) {
    return InvalidArgumentError(fmt::format("sync_period_steps = {}: must be >= 1", period));
  }
  if (fragments < 1 || fragments > period) {
    return InvalidArgumentError(fmt::format(
        "fragments = {}: must be in [1, sync_period_steps = {}] (each fragment needs its own step)",
        fragments, period));
  }
  return FragmentSchedule(fragments, period);
}

}  // namespace mend
