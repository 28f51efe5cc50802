// The end of a learner's rounds: shutdown() takes up what is in flight,
// settles a join that will not be formed, and runs the job's final merge;
// a broken group calls its rounds off.
#include <algorithm>

#include "core/status_format.h"
#include "fmt/format.h"
#include "reducer/round_driver_impl.h"
#include "spdlog/spdlog.h"

namespace mend::reducer {

Status RoundDriverImpl::shutdown() {
  if (shut_down_) return OkStatus();
  if (!group_broken_.ok()) return ShutdownBroken();
  StatusOr<bool> called_off = SettleAtShutdown();
  if (!called_off.ok()) {
    (void)BreakGroup(called_off.status());
    return ShutdownBroken();
  }
  Status finished = FinishInFlight();
  // Nothing is in flight now: the shutdown event's Idle row, the final merge.
  if (finished.ok() && group_broken_.ok() && !*called_off) finished = FinalMerge();
  if (!group_broken_.ok()) return ShutdownBroken();
  checkpoint_writer_.Join();
  shut_down_ = true;
  policy_->Stop(/*done=*/true);
  Status left = agent_.Leave("training finished");
  policy_->Forget();
  MEND_RETURN_IF_ERROR(finished);
  return left;
}

// A rank of this group is gone: no collective of the group can complete,
// so the round in flight is called off, not waited for.
Status RoundDriverImpl::ShutdownBroken() {
  CallOffAll();
  shut_down_ = true;
  policy_->Stop(/*done=*/false);
  (void)agent_.Leave(std::string(group_broken_.message()));
  return group_broken_;
}

// The join in flight at shutdown waits for the round of the job's last
// boundary (the last within a fragment period of this final step). Once
// that closed without it, it would wait for a round that never comes: it is
// called off, and the steps since its boundary are not merged, nor is there
// a final merge for it (the others have merged, or will without it). So is
// one that is short of a quorum: the others have left, and none may ever
// come back. Whether it was called off.
StatusOr<bool> RoundDriverImpl::SettleAtShutdown() {
  if (Next(View(stats_.steps, CurrentPhase()), {Event::kShutdown}).action != Action::kAwaitLast)
    return false;
  // The older rounds formed (none is launched beside a join that did not): taken up first.
  while (flights_.size() > 1) MEND_RETURN_IF_ERROR(FinishInFlight());
  if (flights_.empty()) return false;
  InFlight* const in_flight = flights_.front().get();
  // (None was launched in the job's last period, when known.)
  const auto total = static_cast<uint64_t>(config_.total_steps);
  const uint64_t end =
      !InFinalPeriod(stats_.steps) ? stats_.steps : total - std::min(total, FinalPeriod());
  const uint64_t last_boundary = end + 1 - std::min(end + 1, book_.period());
  MEND_ASSIGN_OR_RETURN(
      Verdict verdict,
      AwaitVerdict(*in_flight, std::max(in_flight->boundary_step, last_boundary), false));
  if (Next(View(stats_.steps, CurrentPhase()), VerdictEvent(verdict, /*ending=*/true)).action !=
      Action::kCallOff) {
    return false;
  }
  spdlog::warn("fragment {}: {}; its join for step {} is called off ({} step(s) not merged)",
               in_flight->fragment,
               verdict == Verdict::kShortOfQuorum
                   ? "too few learners are left to form its round"
                   : "the job's last round closed without this learner",
               in_flight->boundary_step, stats_.steps - in_flight->boundary_step);
  CallOff(*in_flight);
  return true;
}

// The final merge (final_merge, at shutdown after the job's last step): one
// round per fragment whose state is of an earlier step, taken up at once, so
// that every member ends with the members' average model, global and local
// alike. A join whose round closed without it (it came too late: the others
// merged and left) is called off; it keeps its own model, and says so.
Status RoundDriverImpl::FinalMerge() {
  if (FinalMergeStep(config_) == 0 || stats_.steps != FinalMergeStep(config_)) return OkStatus();
  std::vector<int> due;
  for (int f = 0; f < static_cast<int>(book_.size()); ++f) {
    // (A learner restored at this step from a checkpoint holds its merged state.)
    if (std::max(book_.at(f).last_round_boundary, restored_step_) < stats_.steps) due.push_back(f);
  }
  const Micros begin = clock_.NowMicros();
  int merged = 0;
  for (int f : due) {
    MEND_RETURN_IF_ERROR(Launch(f, /*final_merge=*/true));
    // The job's last checkpoint (checkpoint_dir with checkpoint_every_rounds) holds the merged
    // model.
    flights_.front()->checkpoint = f == due.back();
    StatusOr<Verdict> verdict = AwaitVerdict(*flights_.front(), stats_.steps, false);
    if (!verdict.ok()) return BreakGroup(verdict.status());
    if (Next(View(stats_.steps, CurrentPhase()), VerdictEvent(*verdict, /*ending=*/true)).action ==
        Action::kCallOff) {
      spdlog::warn("fragment {}: the final merge at step {} {}; it keeps its own parameters", f,
                   stats_.steps,
                   *verdict == Verdict::kShortOfQuorum
                       ? "has too few learners left to form its round"
                       : "closed without this learner (the others merged and left)");
      CallOff(*flights_.front());
      return FinishInFlight();
    }
    const uint64_t rounds = stats_.rounds;
    MEND_RETURN_IF_ERROR(FinishInFlight());
    if (stats_.rounds == rounds) {
      spdlog::warn("fragment {}: the final merge failed; this learner keeps its own parameters", f);
      return OkStatus();
    }
    stats_.final_rounds++;
    merged++;
  }
  if (merged > 0) {
    spdlog::info(
        "final merge: {} round(s) at step {} in {:.3f} s; every member holds the same model",
        merged, stats_.steps, static_cast<double>(clock_.NowMicros() - begin) / kMicrosPerSecond);
  }
  return OkStatus();
}

}  // namespace mend::reducer
