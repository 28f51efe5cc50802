// The training thread's side of the rounds: at each step the driver observes
// the rounds in flight (their phase), asks the round plan what the step's
// events call for (round_plan.h) and has Flights carry it out.
#include <algorithm>
#include <utility>

#include "core/status_format.h"
#include "reducer/round_driver_impl.h"
#include "spdlog/spdlog.h"

namespace mend::reducer {

Status RoundDriverImpl::step(uint64_t tokens) {
  if (shut_down_) return FailedPreconditionError("reducer: step() after shutdown()");
  MEND_RETURN_IF_ERROR(policy_->broken());
  if (Status fatal = flights_->services().fatal_status(); !fatal.ok()) {
    if (fatal.code() != StatusCode::kOutOfRange) return fatal;
    return OutOfRangeError(fmt::format(
        "{}: it would train a new job alone, so it stops instead. Take the job's final model "
        "from the final round's checkpoint "
        "(resume_from, or checkpoint_dir with resume) or from a learner that took part; to run "
        "the job again, start its learners together",
        fatal.message()));
  }
  RecordStep(policy_->LearnerTokens(tokens));
  MEND_RETURN_IF_ERROR(TakeUpFlights());
  Phase phase = flights_->HeadPhase();
  MEND_RETURN_IF_ERROR(LookAtGroupJoin(&phase));
  for (int64_t f = 0; f < schedule_.fragments(); ++f) {
    if (!schedule_.StartsAt(f, static_cast<int64_t>(stats_.steps))) continue;
    MEND_RETURN_IF_ERROR(AtBoundary(static_cast<int>(f), &phase));
  }
  // The inner step's own time (from here to the next call) is what tau counts in.
  last_return_ = clock_.NowMicros();
  flights_->Unplan();
  return OkStatus();
}

// The step's time, tokens and report to the lighthouse.
void RoundDriverImpl::RecordStep(uint64_t tokens) {
  const Micros now = clock_.NowMicros();
  const Micros step_time = !stepped_ ? 0 : now - last_step_;
  if (stepped_) overlap_.RecordStep(static_cast<double>(now - last_return_) / kMicrosPerSecond);
  last_step_ = now;
  stepped_ = true;
  stats_.steps++;
  flights_->StepNow(stats_.steps);
  stats_.tokens += tokens;
  SayIfPastTheEnd();
  for (Fragment& fragment : outer_.book().fragments()) fragment.tokens_since_round += tokens;
  flights_->services().RecordStep(stats_.steps, tokens, policy_->ReportedStepTime(step_time));
  if (diagnostics_->enabled()) {
    diagnostics_->Step({{"step", stats_.steps},
                        {"tokens", tokens},
                        {"step_ms", static_cast<double>(step_time) / kMicrosPerMilli}});
  }
}

// The first step past the job's last (total_steps) is said once: its steps
// from there on miss the final merge, which runs at a shutdown at
// total_steps. A heal that moved the step forward is the usual cause.
void RoundDriverImpl::SayIfPastTheEnd() {
  if (said_past_the_end_ || options_.total_steps == 0 || stats_.steps <= options_.total_steps)
    return;
  said_past_the_end_ = true;
  const int64_t moved = stats_.steps_moved;
  spdlog::warn(
      "learner '{}': step {} is past the job's last step (total_steps = {}){}; steps past the "
      "end miss the final merge, which runs at a shutdown at step {}. Stop the loop once the "
      "learner has trained total_steps (its stats' steps; Python: runtime.finished or "
      "Learner.finished, where the transformers and Lightning callbacks stop)",
      flights_->services().learner_id(), stats_.steps, options_.total_steps,
      moved > 0 ? fmt::format(": rounds moved this learner {} step(s) forward onto the job's "
                              "step, so a loop of its own count runs past the end",
                              moved)
                : std::string(),
      options_.total_steps);
}

// A round's result is applied as soon as it has arrived; at step boundary +
// tau at the latest (waiting for it there), unless the round for that
// boundary closed without this learner, or the lighthouse is unreachable:
// then its join waits for the next round (or for the lighthouse) while it
// trains on. Several rounds in flight are taken up oldest first.
Status RoundDriverImpl::TakeUpFlights() {
  const bool planned = flights_->Planned(stats_.steps);
  for (size_t taken = 0; !flights_->empty(); ++taken) {
    const bool arrived_then = flights_->ArrivedWhenPlanned(taken);
    const Decision decision = Ask({Event::kStep}, planned ? &arrived_then : nullptr);
    bool taken_up = decision.action == Action::kApply;
    if (taken_up) {
      MEND_RETURN_IF_ERROR(flights_->TakeUp());
    } else if (decision.action == Action::kAwait) {
      MEND_RETURN_IF_ERROR(ApplyOrTrainOn(flights_->head(), &taken_up));
    }
    if (!taken_up) return OkStatus();
  }
  return OkStatus();
}

// At boundary + tau: waits for `head`, then applies it or trains on.
Status RoundDriverImpl::ApplyOrTrainOn(InFlight& head, bool* taken_up) {
  flights_->CountWait(head);
  MEND_ASSIGN_OR_RETURN(
      Verdict verdict,
      flights_->AwaitVerdict(head, head.boundary_step, options_.train_through_lighthouse_outage));
  const Decision then = Ask(VerdictEvent(verdict));
  *taken_up = then.action == Action::kApply;
  if (*taken_up) return flights_->TakeUp();
  if (then.action == Action::kTrainOn) flights_->TrainOn(head, verdict);
  return OkStatus();
}

// A group's join passed over: its ranks agree at every step whether all
// slices of its round have arrived (then all apply it now), and whether rank
// 0's join formed a round yet (a boundary meanwhile is skipped).
Status RoundDriverImpl::LookAtGroupJoin(Phase* phase) {
  if (Next(flights_->View(stats_.steps, *phase), {Event::kStep}).action != Action::kAskGroup)
    return OkStatus();
  const FlightStatus flight = flights_->head().Status();
  MEND_ASSIGN_OR_RETURN(auto answer,
                        policy_->AllArrived(flight.done, flight.done || flight.formed));
  const Decision decision =
      Next(flights_->View(stats_.steps, *phase), GroupAnswerEvent(answer.first, answer.second));
  *phase = decision.next;
  return decision.action == Action::kApply ? flights_->TakeUp() : OkStatus();
}

// Fragment f's boundary at this step. A learner of one rank looks at its
// join as it is now; a group's ranks at what they agreed this step.
Status RoundDriverImpl::AtBoundary(int f, Phase* phase) {
  while (true) {
    if (policy_->AppliedOnArrival()) *phase = flights_->HeadPhase();
    MEND_ASSIGN_OR_RETURN(const Decision decision, BoundaryDecision(f, *phase));
    *phase = decision.next;
    switch (decision.action) {
      case Action::kSkipFinalPeriod:
        spdlog::info(
            "fragment {}: no round at step {}: it could not be taken up before the job's last "
            "step {}",
            f, stats_.steps, options_.total_steps);
        return OkStatus();
      case Action::kSkipJoinWaits:
        // The others may be far ahead, or done. The steps since go into the next join.
        spdlog::info(
            "fragment {}: boundary at step {} skipped; the join for step {} still waits for a "
            "round",
            f, stats_.steps, flights_->newest().boundary_step);
        return OkStatus();
      case Action::kApply: {
        // Waited for as at boundary + tau: a join that cannot form a round
        // (passed over, too few learners alive, the lighthouse lost) is
        // trained on and the boundary skipped, where it held the learner
        // until its quorum timeout at every boundary (a round of another
        // fragment launches only beside a join that formed).
        bool taken_up = false;
        MEND_RETURN_IF_ERROR(ApplyOrTrainOn(flights_->head(), &taken_up));
        // The next oldest (never one passed over: see LaunchBlocked), or the one trained on.
        *phase = flights_->HeadPhase();
        continue;
      }
      case Action::kLaunch:
        MEND_RETURN_IF_ERROR(Launch(f));
        // (A join into a job in progress with none of its state: waited for here, see
        // Flights::Launch.)
        return options_.concurrent && flights_->newest().training_waits ? flights_->TakeUp()
                                                                        : OkStatus();
      case Action::kLaunchAndApply:  // synchronous DiLoCo: wait here
        MEND_RETURN_IF_ERROR(Launch(f));
        return flights_->TakeUp();
      default:
        return OkStatus();
    }
  }
}

// The table's decision at fragment f's boundary, asking Flights whether a
// launch is blocked only where the table reads that.
StatusOr<Decision> RoundDriverImpl::BoundaryDecision(int f, Phase phase) {
  // A heal may have moved this learner's step off the boundary, or onto
  // one whose round it just took part in.
  const bool still_due = schedule_.StartsAt(f, static_cast<int64_t>(stats_.steps)) &&
                         stats_.steps > outer_.book().at(f).last_round_boundary;
  const Event event = BoundaryEvent(options_.InFinalPeriod(stats_.steps), still_due);
  RoundView view = flights_->View(stats_.steps, phase);
  if (ReadsLaunchBlocked(view, event)) {
    MEND_ASSIGN_OR_RETURN(view.launch_blocked, flights_->LaunchBlocked(f));
  }
  return Next(view, event);
}

// At fragment f's boundary: tau for its round (a group: rank 0's), and the launch.
Status RoundDriverImpl::Launch(int f) {
  stats_.overlap_steps = overlap_.Tau();
  if (options_.concurrent) {
    MEND_ASSIGN_OR_RETURN(stats_.overlap_steps, policy_->AgreeTau(stats_.overlap_steps));
  }
  return flights_->Launch(f, stats_.overlap_steps, /*final_merge=*/false);
}

ReducerStats RoundDriverImpl::stats() const {
  ReducerStats stats = stats_;
  stats.checkpoints = outer_.written();
  stats.checkpoint_failures = outer_.failed();
  stats.group_bytes_sent = policy_->GroupBytesSent();
  stats.group_state_bytes_sent = policy_->GroupStateBytesSent();
  return stats;
}

// The fragments whose round step `step` launches (1 each).
std::vector<uint8_t> RoundDriverImpl::LaunchesAt(uint64_t step) const {
  std::vector<uint8_t> launches(static_cast<size_t>(schedule_.fragments()), 0);
  for (int64_t f = 0; f < schedule_.fragments() && !options_.InFinalPeriod(step); ++f)
    launches[static_cast<size_t>(f)] = schedule_.StartsAt(f, static_cast<int64_t>(step)) ? 1 : 0;
  return launches;
}

}  // namespace mend::reducer
