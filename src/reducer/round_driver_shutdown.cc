// The end of a learner's rounds: shutdown() takes up what is in flight,
// settles a join that will not be formed, and runs the job's final merge
// (final_merge.h); a broken group calls its rounds off.
#include <algorithm>

#include "core/status_format.h"
#include "reducer/final_merge.h"
#include "reducer/round_driver_impl.h"
#include "spdlog/spdlog.h"

namespace mend::reducer {

Status RoundDriverImpl::shutdown() {
  if (shut_down_) return OkStatus();
  if (Status broken = policy_->broken(); !broken.ok()) return ShutdownBroken(broken);
  // The lighthouse said the job finished without this learner (OUT_OF_RANGE,
  // LighthouseCore::JobFinishedLocked): no round will form for it.
  const Status job_finished = flights_->services().fatal_status();
  Status finished = OkStatus();
  bool left_out = false;
  if (job_finished.code() == StatusCode::kOutOfRange) {
    flights_->CallOffAll();
    left_out = true;
  } else {
    StatusOr<Settled> settled = SettleAtShutdown();
    if (!settled.ok()) return ShutdownBroken(settled.status());
    left_out = *settled == Settled::kLeftOutOfTheEnd;
    finished = flights_->TakeUp();
    // Nothing is in flight now: the shutdown event's Idle row, the final merge.
    if (finished.ok() && policy_->broken().ok() && *settled == Settled::kNothing) {
      StatusOr<bool> merge = RunFinalMerge(*flights_, outer_, options_, stats_, clock_,
                                           [this](Event event) { return Ask(event); });
      finished = merge.status();
      left_out = merge.ok() && *merge;
    }
    // (The lighthouse may have said so while the final merge's join waited.)
    if (flights_->services().fatal_status().code() == StatusCode::kOutOfRange) {
      finished = OkStatus();
      left_out = true;
    }
  }
  if (finished.ok() && left_out && policy_->broken().ok()) finished = TakeTheJobsFinalModel();
  if (finished.ok() && policy_->broken().ok()) DropStepsPastTheFinalState();
  if (Status broken = policy_->broken(); !broken.ok()) return ShutdownBroken(broken);
  outer_.Join();
  shut_down_ = true;
  policy_->Stop(/*done=*/true);
  // (The lighthouse's event log says which: a learner stopped early, by a
  // signal or its loop, did not finish the job.)
  const std::string reason =
      options_.total_steps > 0 && stats_.steps < options_.total_steps
          ? fmt::format("stopped at step {} of {}", stats_.steps, options_.total_steps)
          : "training finished";
  // A goodbye the lighthouse does not get (it is down or out of reach) is
  // said, not raised: the learner is done either way, and the lighthouse
  // leaves it out once its heartbeats stop. Raised, it stopped the
  // caller's next line (saving the model).
  if (Status left = flights_->services().Leave(reason); !left.ok()) {
    spdlog::warn(
        "learner '{}' could not tell the lighthouse it left ({}); the lighthouse leaves it out "
        "once its heartbeats stop",
        flights_->services().learner_id(), left);
  }
  policy_->Forget();
  return finished;
}

// A rank of this group is gone: no collective of the group can complete,
// so the rounds in flight are called off, not waited for.
Status RoundDriverImpl::ShutdownBroken(Status why) {
  if (Status broken = policy_->broken(); !broken.ok()) why = broken;
  flights_->CallOffAll();
  shut_down_ = true;
  policy_->Stop(/*done=*/false);
  (void)flights_->services().Leave(std::string(why.message()));
  return why;
}

// The join in flight at shutdown waits for the round of the job's last
// boundary (the last within a fragment period of this final step). Once
// that closed without it, it would wait for a round that never comes: it is
// called off, and the steps since its boundary are not merged, nor is there
// a final merge for it (the others have merged, or will without it). So is
// one that is short of a quorum: the others have left, and none may ever
// come back. Whether it was called off, and whether the round that closed
// without it was the job's final one while this learner is at the job's
// end (final_merge: it then takes the job's final model, or fails).
StatusOr<RoundDriverImpl::Settled> RoundDriverImpl::SettleAtShutdown() {
  if (Ask({Event::kShutdown}).action != Action::kAwaitLast) return Settled::kNothing;
  // The older rounds formed (none is launched beside a join that did not): taken up first.
  while (flights_->size() > 1) MEND_RETURN_IF_ERROR(flights_->TakeUp());
  if (flights_->empty()) return Settled::kNothing;
  InFlight& in_flight = flights_->head();
  const uint64_t last_boundary = options_.LastBoundary(stats_.steps);
  MEND_ASSIGN_OR_RETURN(
      Verdict verdict,
      flights_->AwaitVerdict(in_flight, std::max(in_flight.boundary_step, last_boundary), false));
  if (Ask(VerdictEvent(verdict, /*ending=*/true)).action != Action::kCallOff) {
    return Settled::kNothing;
  }
  spdlog::warn("fragment {}: {}; its join for step {} is called off ({} step(s) not merged)",
               in_flight.fragment,
               verdict == Verdict::kShortOfQuorum
                   ? "too few learners are left to form its round"
                   : "the job's last round closed without this learner",
               in_flight.boundary_step, stats_.steps - in_flight.boundary_step);
  flights_->CallOff(in_flight);
  const uint64_t end = options_.final_merge_step;
  const bool at_the_end = end > 0 && stats_.steps >= end;
  return verdict == Verdict::kPassedOver && at_the_end &&
                 flights_->services().News().latest_round_step >= end
             ? Settled::kLeftOutOfTheEnd
             : Settled::kCalledOff;
}

// A learner that resumed from the job's final state (a checkpoint of its
// final round: the job had finished) and whose loop trained on past it ends
// with that state, the job's final model: the steps past the end had no
// round to go into, and would leave it with a model of its own.
void RoundDriverImpl::DropStepsPastTheFinalState() {
  const uint64_t end = options_.final_merge_step;
  if (end == 0 || stats_.steps <= end || outer_.restored_step() < end) return;
  for (const Fragment& fragment : outer_.book().fragments()) {
    if (fragment.last_round_boundary != 0) return;  // (a round since: not the resumed state)
  }
  spdlog::warn(
      "learner '{}' resumed from the job's final state (step {}) and trained on to step {}: it "
      "ends with the job's final model, those steps dropped (stop the loop at "
      "runtime.finished, which holds from the start)",
      flights_->services().learner_id(), outer_.restored_step(), stats_.steps);
  outer_.ParametersToGlobal();
}

// The job's final round (at total_steps, with final_merge) closed without
// this learner: at the job's end (it got there after the others had merged
// and left) it takes the job's final model from the checkpoint that round
// wrote in checkpoint_dir, or fails saying so, rather than end with a model
// of its own that nothing tells apart from the job's. Before the end (a
// learner restarted after the job finished) it fails with what the
// lighthouse said.
Status RoundDriverImpl::TakeTheJobsFinalModel() {
  const Status job_finished = flights_->services().fatal_status();
  const uint64_t end = options_.final_merge_step;
  if (end == 0 || stats_.steps < end) {
    // (A step raised it; said again here in case none came after it.)
    spdlog::error("{}; this learner leaves", job_finished.message());
    return OkStatus();
  }
  const LighthouseNews news = flights_->services().News();
  MEND_ASSIGN_OR_RETURN(std::optional<Restored> restored, outer_.TakeFinal(end));
  if (restored) {
    spdlog::warn(
        "learner '{}': the job's final round closed without this learner (it reached step {} "
        "after the others had merged and left); it takes the job's final model from that "
        "round's checkpoint (round {}, step {}), its steps since dropped",
        flights_->services().learner_id(), stats_.steps, restored->round_id, restored->step);
    stats_.steps_moved += static_cast<int64_t>(restored->step) - static_cast<int64_t>(stats_.steps);
    MoveTo(*restored);
    return OkStatus();
  }
  const std::string why =
      job_finished.code() == StatusCode::kOutOfRange
          ? std::string(job_finished.message())
          : fmt::format("learner '{}': the job's final round {} (step {}) closed without it",
                        flights_->services().learner_id(), news.latest_round_id,
                        news.latest_round_step);
  return FailedPreconditionError(fmt::format(
      "{}. This learner reached the job's end (step {}) after the final round: its model is its "
      "own, not the job's final model. Set checkpoint_dir and checkpoint_every_rounds, so that a "
      "learner late "
      "to the end takes the job's final model from that round's checkpoint, or let the others "
      "wait longer for it (the final round waits half of quorum_timeout_ms)",
      why, stats_.steps));
}

}  // namespace mend::reducer
