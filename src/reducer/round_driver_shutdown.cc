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
  StatusOr<bool> called_off = SettleAtShutdown();
  if (!called_off.ok()) return ShutdownBroken(called_off.status());
  Status finished = flights_->TakeUp();
  // Nothing is in flight now: the shutdown event's Idle row, the final merge.
  if (finished.ok() && policy_->broken().ok() && !*called_off)
    finished = RunFinalMerge(*flights_, outer_, options_, stats_, clock_,
                             [this](Event event) { return Ask(event); });
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
// come back. Whether it was called off.
StatusOr<bool> RoundDriverImpl::SettleAtShutdown() {
  if (Ask({Event::kShutdown}).action != Action::kAwaitLast) return false;
  // The older rounds formed (none is launched beside a join that did not): taken up first.
  while (flights_->size() > 1) MEND_RETURN_IF_ERROR(flights_->TakeUp());
  if (flights_->empty()) return false;
  InFlight& in_flight = flights_->head();
  const uint64_t last_boundary = options_.LastBoundary(stats_.steps);
  MEND_ASSIGN_OR_RETURN(
      Verdict verdict,
      flights_->AwaitVerdict(in_flight, std::max(in_flight.boundary_step, last_boundary), false));
  if (Ask(VerdictEvent(verdict, /*ending=*/true)).action != Action::kCallOff) {
    return false;
  }
  spdlog::warn("fragment {}: {}; its join for step {} is called off ({} step(s) not merged)",
               in_flight.fragment,
               verdict == Verdict::kShortOfQuorum
                   ? "too few learners are left to form its round"
                   : "the job's last round closed without this learner",
               in_flight.boundary_step, stats_.steps - in_flight.boundary_step);
  flights_->CallOff(in_flight);
  return true;
}

}  // namespace mend::reducer
