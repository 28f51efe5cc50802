#include "reducer/round_plan.h"

namespace mend::reducer {

std::string_view PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kIdle:
      return "Idle";
    case Phase::kJoining:
      return "Joining";
    case Phase::kExchanging:
      return "Exchanging";
    case Phase::kArrived:
      return "Arrived";
    case Phase::kFailed:
      return "Failed";
    case Phase::kPassedOver:
      return "PassedOver";
    case Phase::kCatchingUp:
      return "CatchingUp";
  }
  return "?";
}

std::string_view ActionName(Action action) {
  switch (action) {
    case Action::kNone:
      return "none";
    case Action::kAwait:
      return "await";
    case Action::kApply:
      return "apply";
    case Action::kTrainOn:
      return "train on";
    case Action::kAskGroup:
      return "ask the group";
    case Action::kSkipFinalPeriod:
      return "skip (final period)";
    case Action::kSkipJoinWaits:
      return "skip (join waits)";
    case Action::kSkipNotDue:
      return "skip (not due)";
    case Action::kLaunch:
      return "launch";
    case Action::kLaunchAndApply:
      return "launch and apply";
    case Action::kFinalMerge:
      return "final merge";
    case Action::kAwaitLast:
      return "await the last round";
    case Action::kCallOff:
      return "call off";
  }
  return "?";
}

Event VerdictEvent(Verdict verdict, bool ending) {
  Event event{Event::kVerdict};
  event.verdict = verdict;
  event.ending = ending;
  return event;
}

Event GroupAnswerEvent(bool all_arrived, bool formed) {
  Event event{Event::kGroupAnswer};
  event.all_arrived = all_arrived;
  event.formed = formed;
  return event;
}

Event BoundaryEvent(bool final_period, bool still_due) {
  Event event{Event::kBoundary};
  event.final_period = final_period;
  event.still_due = still_due;
  return event;
}

Phase PhaseOf(const FlightStatus& flight, bool group) {
  if (!flight.launched) return Phase::kIdle;
  if (flight.passed_over && (group || !flight.done)) {
    return flight.formed || flight.done ? Phase::kCatchingUp : Phase::kPassedOver;
  }
  if (flight.done) return flight.ok ? Phase::kArrived : Phase::kFailed;
  return flight.formed ? Phase::kExchanging : Phase::kJoining;
}

namespace {

bool Running(Phase phase) { return phase != Phase::kIdle; }

// An inner step ended. A round that arrived is applied at once by a learner
// of one rank; a group's ranks apply together at boundary + tau (each rank
// sees its slice arrive at its own time), and a passed-over join is looked
// at by all of them at every step.
Decision OnStep(const RoundView& view) {
  const bool due = view.step >= view.apply_at_step;
  switch (view.phase) {
    case Phase::kIdle:
      return {Action::kNone, Phase::kIdle};
    case Phase::kJoining:
    case Phase::kExchanging:
      return {due ? Action::kAwait : Action::kNone, view.phase};
    case Phase::kArrived:
    case Phase::kFailed:
      if (!view.group) return {Action::kApply, Phase::kIdle};
      return {due ? Action::kAwait : Action::kNone, view.phase};
    case Phase::kPassedOver:
    case Phase::kCatchingUp:
      return {view.group ? Action::kAskGroup : Action::kNone, view.phase};
  }
  return {Action::kNone, view.phase};
}

// A wait ended. At shutdown (`ending`), a join that will not be formed is
// called off instead of waiting for the next round.
Decision OnVerdict(Verdict verdict, bool ending) {
  if (verdict == Verdict::kDone) return {Action::kApply, Phase::kIdle};
  if (ending) return {Action::kCallOff, Phase::kIdle};
  return {Action::kTrainOn, Phase::kPassedOver};
}

Decision OnGroupAnswer(const Event& event) {
  if (event.all_arrived) return {Action::kApply, Phase::kIdle};
  return {Action::kNone, event.formed ? Phase::kCatchingUp : Phase::kPassedOver};
}

// A fragment's boundary. A round still in flight is applied first (waiting
// for it) unless another may be launched beside it, then the boundary is
// looked at again; a join passed over that still has no round trains on
// instead (the others may be far ahead).
Decision OnBoundary(const RoundView& view, const Event& event) {
  if (event.final_period) return {Action::kSkipFinalPeriod, view.phase};
  if (view.phase == Phase::kPassedOver || view.join_waits)
    return {Action::kSkipJoinWaits, view.phase};
  if (ReadsLaunchBlocked(view, event) && view.launch_blocked) return {Action::kApply, Phase::kIdle};
  if (!event.still_due) return {Action::kSkipNotDue, view.phase};
  if (view.concurrent) {
    // Launched beside the rounds in flight, the oldest stays what the phase is.
    return {Action::kLaunch, Running(view.phase) ? view.phase : Phase::kJoining};
  }
  return {Action::kLaunchAndApply, Phase::kIdle};
}

}  // namespace

bool ReadsLaunchBlocked(const RoundView& view, const Event& event) {
  return event.kind == Event::kBoundary && !event.final_period &&
         view.phase != Phase::kPassedOver && !view.join_waits && Running(view.phase);
}

Decision Next(const RoundView& view, const Event& event) {
  switch (event.kind) {
    case Event::kStep:
      return OnStep(view);
    case Event::kVerdict:
      return OnVerdict(event.verdict, event.ending);
    case Event::kGroupAnswer:
      return OnGroupAnswer(event);
    case Event::kBoundary:
      return OnBoundary(view, event);
    case Event::kShutdown:
      if (!Running(view.phase)) return {Action::kFinalMerge, Phase::kIdle};
      return {Action::kAwaitLast, view.phase};
  }
  return {Action::kNone, view.phase};
}

}  // namespace mend::reducer
