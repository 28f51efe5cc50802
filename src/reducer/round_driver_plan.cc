// What the next step does, fixed before it (PlanStep): whether it may wait
// for a round, and which fragments' parameters it may read or write (a
// front end that stages its parameters copies those in before the step).
#include <algorithm>
#include <vector>

#include "reducer/round_driver_impl.h"

namespace mend::reducer {

// What the next step does with the round in flight, as it will see it.
Action RoundDriverImpl::NextStepAction() const {
  const uint64_t next = stats_.steps + 1;
  const bool arrived = planned_arrivals_ > 0;
  return Next(View(next, CurrentPhase(planned_step_ == next ? &arrived : nullptr)), {Event::kStep})
      .action;
}

bool RoundDriverImpl::NextStepMayWait() const {
  const Action action = NextStepAction();
  return action == Action::kApply || action == Action::kAwait || LaunchesAt(stats_.steps + 1);
}

// A planned step sees the rounds in flight as PlanStep saw them (a first
// round that agreed since still holds the next launch back); else as they are.
FlightStatus RoundDriverImpl::PlannedStatus(InFlight& flight) const {
  if (planned_step_ == stats_.steps) {
    for (const auto& [planned, status] : planned_status_) {
      if (planned == &flight) return status;
    }
  }
  return flight.Status();
}

StepPlan RoundDriverImpl::PlanStep() {
  const uint64_t next = stats_.steps + 1;
  planned_step_ = next;
  planned_arrivals_ = 0;
  planned_status_.clear();
  for (const auto& flight : flights_) planned_status_.emplace_back(flight.get(), flight->Status());
  for (const auto& flight : flights_) {
    if (!flight->done.load(std::memory_order_acquire)) break;
    planned_arrivals_++;
  }
  const Action action = NextStepAction();
  StepPlan plan;
  plan.may_wait = action == Action::kApply || action == Action::kAwait || LaunchesAt(next);
  // A group's join passed over is looked at (and maybe applied) at every step.
  plan.touches_parameters = plan.may_wait || action == Action::kAskGroup;
  plan.fragments = PlannedFragments(next, plan.touches_parameters);
  return plan;
}

// The fragments whose parameters step `next` may read or write: those it
// launches a round of, and for each round it may take up, what its result
// touches (its fragment; an adopted one's too; every fragment for a heal).
// A round not in yet that it may wait for touches its own fragment when it
// formed with no member to heal. Every fragment where that is not known
// yet: a synchronous round (launched and taken up in one step), a round
// that has not formed, a group (its ranks decide together, and share the
// whole replica).
std::vector<uint8_t> RoundDriverImpl::PlannedFragments(uint64_t next, bool touches) const {
  std::vector<uint8_t> fragments(book_.size(), 0);
  if (!touches) return fragments;
  const std::vector<uint8_t> all(book_.size(), 1);
  if (!concurrent_ || policy_->group()) return all;
  bool launches = false;
  for (int64_t f = 0; f < schedule_.fragments(); ++f) {
    if (!schedule_.StartsAt(f, static_cast<int64_t>(next)) || InFinalPeriod(next)) continue;
    fragments[static_cast<size_t>(f)] = 1;
    launches = true;
  }
  for (size_t k = 0; k < flights_.size(); ++k) {
    const InFlight& flight = *flights_[k];
    if (k >= planned_arrivals_) {
      // Not in: waited for when due (or to make room for a launch).
      if (!launches && flight.apply_at_step > next) break;
      const FlightStatus& status = planned_status_[k].second;
      if (!status.formed || status.may_heal) return all;
      fragments[static_cast<size_t>(flight.fragment)] = 1;
      continue;
    }
    fragments[static_cast<size_t>(flight.fragment)] = 1;  // (a failed round's undone step too)
    if (!flight.outcome.ok()) continue;
    if (!flight.outcome->healed.empty()) return all;
    fragments[static_cast<size_t>(flight.outcome->fragment)] = 1;
  }
  return fragments;
}

}  // namespace mend::reducer
