// What the next step does, fixed before it (PlanStep): whether it may wait
// for a round, and which fragments' parameters it may read or write (a
// front end that stages its parameters copies those in before the step).
#include <algorithm>
#include <utility>
#include <vector>

#include "reducer/round_driver_impl.h"

namespace mend::reducer {

// What the next step does with the round in flight, as it will see it.
Action RoundDriverImpl::NextStepAction() const {
  const uint64_t next = stats_.steps + 1;
  const bool arrived = flights_->ArrivedWhenPlanned(0);
  const bool* seen = flights_->Planned(next) ? &arrived : nullptr;
  return Next(flights_->View(next, flights_->HeadPhase(seen)), {Event::kStep}).action;
}

namespace {

// A step that takes up a round (or waits for one), or launches one, may wait.
bool MayWait(Action action, const std::vector<uint8_t>& launches) {
  return action == Action::kApply || action == Action::kAwait ||
         std::find(launches.begin(), launches.end(), 1) != launches.end();
}

}  // namespace

bool RoundDriverImpl::NextStepMayWait() const {
  return MayWait(NextStepAction(), LaunchesAt(stats_.steps + 1));
}

StepPlan RoundDriverImpl::PlanStep() {
  const uint64_t next = stats_.steps + 1;
  flights_->Plan(next);
  const Action action = NextStepAction();
  std::vector<uint8_t> launches = LaunchesAt(next);
  StepPlan plan;
  plan.may_wait = MayWait(action, launches);
  // A group's join passed over is looked at (and maybe applied) at every step.
  plan.touches_parameters = plan.may_wait || action == Action::kAskGroup;
  plan.may_write = plan.touches_parameters && !flights_->LaunchOnlyReads(next, action);
  // (A group's launch takes rank 0's tau; this rank's is the estimate.)
  plan.launch_due_next = options_.concurrent && overlap_.Tau() <= 1 &&
                         std::find(launches.begin(), launches.end(), 1) != launches.end();
  plan.fragments = plan.touches_parameters
                       ? flights_->PlannedFragments(next, std::move(launches))
                       : std::vector<uint8_t>(static_cast<size_t>(fragments()), 0);
  return plan;
}

}  // namespace mend::reducer
