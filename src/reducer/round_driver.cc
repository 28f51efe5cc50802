// The training thread's side of the rounds: at each step the driver observes
// the round in flight (its phase), asks the round plan what the step's
// events call for (round_plan.h) and carries the action out.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <utility>

#include "core/phase_timer.h"
#include "core/status_format.h"
#include "fmt/format.h"
#include "reducer/round_driver_impl.h"
#include "spdlog/spdlog.h"

namespace mend::reducer {
namespace {

// How often a learner waiting at boundary + tau looks whether the lighthouse
// reported its round closed without it.
constexpr auto kPassedOverPoll = std::chrono::milliseconds(20);

}  // namespace

RoundDriverImpl::~RoundDriverImpl() {
  CallOffAll();
  checkpoint_writer_.Join();
}

// Every round in flight called off and its thread joined; their results dropped.
void RoundDriverImpl::CallOffAll() {
  if (flights_.empty()) return;
  services_->Interrupt();
  runner_->order().Stop();
  for (auto& flight : flights_) flight->thread.join();
  flights_.clear();
}

RoundView RoundDriverImpl::View(uint64_t step, Phase phase) const {
  RoundView view;
  view.phase = phase;
  view.step = step;
  view.apply_at_step = !flights_.empty() ? flights_.front()->apply_at_step : 0;
  view.group = policy_->group();
  view.concurrent = concurrent_;
  view.launch_blocked = !flights_.empty();  // AtBoundary asks LaunchBlocked
  view.join_waits = flights_.size() > 1 && flights_.back()->passed_over;
  return view;
}

// The newest round this learner holds or takes part in: its last round
// taken up, then each round in flight that formed, oldest first, up to one
// that failed (the lighthouse then heals it). What its next join reports.
uint64_t RoundDriverImpl::HeldRoundId() const {
  uint64_t held = last_round_id_;
  for (const auto& flight : flights_) {
    const FlightStatus status = flight->Status();
    if (!status.formed || (status.done && !status.ok)) break;
    held = status.round_id;
  }
  return held;
}

// Whether fragment f's boundary must take up the oldest round before it
// launches: one round at a time, or as many in flight as allowed, or one of
// the same fragment (its base would change under it), a join not formed (the
// lighthouse holds one join per learner) or passed over, or a round that may
// heal (its result rewrites every fragment). A group follows rank 0's view.
StatusOr<bool> RoundDriverImpl::LaunchBlocked(int f) {
  if (flights_.empty()) return false;
  if (flights_.size() >= rounds_in_flight_) return true;
  // What every rank of a group sees alike decides at once; its round threads' reports, rank 0.
  bool blocked = false;
  for (const auto& flight : flights_) {
    if (flight->fragment == f || flight->final_merge || flight->passed_over) return true;
    const FlightStatus status = PlannedStatus(*flight);
    blocked = blocked || (!status.formed && !status.done) || status.may_heal;
  }
  return policy_->AgreeLaunch(blocked);
}

// A step that waits for `flight` (not arrived yet), counted once per round.
void RoundDriverImpl::CountWait(InFlight& flight) {
  if (flight.waited || flight.done.load(std::memory_order_acquire)) return;
  flight.waited = true;
  stats_.round_waits++;
}

// `arrived`: whether the round had arrived as a planned step saw it (so that
// a front end that staged the parameters for the step's plan is not
// overtaken by a late arrival); null: now.
Phase RoundDriverImpl::CurrentPhase(const bool* arrived) const {
  if (flights_.empty()) return Phase::kIdle;
  return PhaseOf(flights_.front()->Status(arrived), policy_->group());
}

Status RoundDriverImpl::step(uint64_t tokens) {
  if (shut_down_) return FailedPreconditionError("reducer: step() after shutdown()");
  MEND_RETURN_IF_ERROR(group_broken_);
  MEND_RETURN_IF_ERROR(agent_.fatal_status());
  RecordStep(policy_->LearnerTokens(tokens));
  MEND_RETURN_IF_ERROR(TakeUpFlight());
  Phase phase = CurrentPhase();
  MEND_RETURN_IF_ERROR(LookAtGroupJoin(&phase));
  for (int64_t f = 0; f < schedule_.fragments(); ++f) {
    if (!schedule_.StartsAt(f, static_cast<int64_t>(stats_.steps))) continue;
    MEND_RETURN_IF_ERROR(AtBoundary(static_cast<int>(f), &phase));
  }
  // The inner step's own time (from here to the next call) is what tau counts in.
  last_return_ = clock_.NowMicros();
  planned_step_ = 0;
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
  step_now_.store(stats_.steps, std::memory_order_relaxed);
  tokens_total_ += tokens;
  for (Fragment& fragment : book_.fragments()) fragment.tokens_since_round += tokens;
  agent_.RecordStep(stats_.steps, tokens_total_, policy_->ReportedStepTime(step_time));
  if (diagnostics_->enabled()) {
    diagnostics_->Step({{"step", stats_.steps},
                        {"tokens", tokens},
                        {"step_ms", static_cast<double>(step_time) / kMicrosPerMilli}});
  }
}

// A round's result is applied as soon as it has arrived; at step boundary +
// tau at the latest (waiting for it there), unless the round for that
// boundary closed without this learner, or the lighthouse is unreachable:
// then its join waits for the next round (or for the lighthouse) while it
// trains on.
// With several rounds in flight, they are taken up oldest first.
Status RoundDriverImpl::TakeUpFlight() {
  const bool planned = planned_step_ == stats_.steps;
  for (size_t taken = 0; !flights_.empty(); ++taken) {
    const bool arrived_then = taken < planned_arrivals_;
    const Decision decision =
        Next(View(stats_.steps, CurrentPhase(planned ? &arrived_then : nullptr)), {Event::kStep});
    if (decision.action == Action::kApply) {
      MEND_RETURN_IF_ERROR(FinishInFlight());
      continue;
    }
    if (decision.action != Action::kAwait) return OkStatus();
    InFlight& head = *flights_.front();
    CountWait(head);
    StatusOr<Verdict> verdict =
        AwaitVerdict(head, head.boundary_step, config_.train_through_lighthouse_outage);
    if (!verdict.ok()) return BreakGroup(verdict.status());
    const Decision then = Next(View(stats_.steps, CurrentPhase()), VerdictEvent(*verdict));
    if (then.action == Action::kApply) {
      MEND_RETURN_IF_ERROR(FinishInFlight());
      continue;
    }
    if (then.action == Action::kTrainOn && MarkPassedOver(head)) SayTrainingOn(*verdict);
    return OkStatus();
  }
  return OkStatus();
}

void RoundDriverImpl::SayTrainingOn(Verdict verdict) const {
  const int f = flights_.front()->fragment;
  const uint64_t boundary = flights_.front()->boundary_step;
  if (verdict == Verdict::kPassedOver) {
    spdlog::info(
        "fragment {}: the round for step {} closed without this learner; training on, its join "
        "waits for the next round",
        f, boundary);
  } else if (verdict == Verdict::kShortOfQuorum) {
    spdlog::info(
        "fragment {}: fewer learners are alive than the quorum's minimum; training on, the join "
        "for step {} waits for them",
        f, boundary);
  } else {
    spdlog::info(
        "fragment {}: the lighthouse is unreachable; training on, the join for step {} waits for "
        "it",
        f, boundary);
  }
}

// A group's join passed over: its ranks agree at every step whether all
// slices of its round have arrived (then all apply it now), and whether rank
// 0's join formed a round yet (a boundary meanwhile is skipped).
Status RoundDriverImpl::LookAtGroupJoin(Phase* phase) {
  if (Next(View(stats_.steps, *phase), {Event::kStep}).action != Action::kAskGroup)
    return OkStatus();
  const FlightStatus flight = flights_.front()->Status();
  StatusOr<std::pair<bool, bool>> answer =
      policy_->AllArrived(flight.done, flight.done || flight.formed);
  if (!answer.ok()) return BreakGroup(answer.status());
  const Decision decision =
      Next(View(stats_.steps, *phase), GroupAnswerEvent(answer->first, answer->second));
  *phase = decision.next;
  return decision.action == Action::kApply ? FinishInFlight() : OkStatus();
}

// Fragment f's boundary at this step. A learner of one rank looks at its
// join as it is now; a group's ranks at what they agreed this step.
Status RoundDriverImpl::AtBoundary(int f, Phase* phase) {
  while (true) {
    if (!policy_->group()) *phase = CurrentPhase();
    // A heal may have moved this learner's step off the boundary, or onto
    // one whose round it just took part in.
    const bool still_due = schedule_.StartsAt(f, static_cast<int64_t>(stats_.steps)) &&
                           stats_.steps > book_.at(f).last_round_boundary;
    const Event event = BoundaryEvent(InFinalPeriod(stats_.steps), still_due);
    RoundView view = View(stats_.steps, *phase);
    if (ReadsLaunchBlocked(view, event)) {
      StatusOr<bool> blocked = LaunchBlocked(f);
      if (!blocked.ok()) return BreakGroup(blocked.status());
      view.launch_blocked = *blocked;
    }
    const Decision decision = Next(view, event);
    *phase = decision.next;
    switch (decision.action) {
      case Action::kSkipFinalPeriod:
        spdlog::info(
            "fragment {}: no round at step {}: it could not be taken up before the job's last "
            "step {}",
            f, stats_.steps, config_.total_steps);
        return OkStatus();
      case Action::kSkipJoinWaits:
        // The others may be far ahead, or done. The steps since go into the next join.
        spdlog::info(
            "fragment {}: boundary at step {} skipped; the join for step {} still waits for a "
            "round",
            f, stats_.steps, flights_.back()->boundary_step);
        return OkStatus();
      case Action::kApply:
        CountWait(*flights_.front());
        MEND_RETURN_IF_ERROR(FinishInFlight());
        *phase = CurrentPhase();  // the next oldest (never one passed over: see LaunchBlocked)
        continue;
      case Action::kLaunch:
        return Launch(f);
      case Action::kLaunchAndApply:  // synchronous DiLoCo: wait here
        MEND_RETURN_IF_ERROR(Launch(f));
        return FinishInFlight();
      default:
        return OkStatus();
    }
  }
}

ReducerStats RoundDriverImpl::stats() const {
  ReducerStats stats = stats_;
  stats.checkpoints = checkpoint_writer_.written();
  stats.checkpoint_failures = checkpoint_writer_.failed();
  return stats;
}

bool RoundDriverImpl::LaunchesAt(uint64_t step) const {
  for (int64_t f = 0; f < schedule_.fragments(); ++f) {
    if (schedule_.StartsAt(f, static_cast<int64_t>(step)) && !InFinalPeriod(step)) return true;
  }
  return false;
}

// Whether `step` lies in the job's last fragment period (total_steps known,
// concurrent rounds): a round launched there could be taken up only after
// the last step (the tuned tau is below a fragment period), so every learner
// would wait for it at shutdown; none is launched. The rule follows from the
// configuration alone, so that every learner skips the same boundaries.
bool RoundDriverImpl::InFinalPeriod(uint64_t step) const {
  if (!concurrent_ || config_.total_steps <= 0) return false;
  const auto total = static_cast<uint64_t>(config_.total_steps);
  return step <= total && step + FinalPeriod() > total;
}

// Waits for the round in flight (kDone); a round that may be passed over (a
// concurrent learner's, or a final merge's) returns without waiting longer
// once TrainOnBecause says so. A group's ranks cannot each decide this on
// their own timing: rank 0 decides for them (the policy's AgreeVerdict),
// and kDone then means that its join formed: FinishInFlight waits for every
// slice, the ranks together.
StatusOr<Verdict> RoundDriverImpl::AwaitVerdict(InFlight& flight, uint64_t give_up_step,
                                                bool train_on_if_lost) {
  if (!concurrent_ && !flight.final_merge) return Verdict::kDone;  // joined when applied
  return policy_->AgreeVerdict([&]() -> std::optional<Verdict> {
    if (PollDone(flight)) return Verdict::kDone;
    if (flight.Status().formed) return Verdict::kDone;
    return TrainOnBecause(flight, give_up_step, train_on_if_lost);
  });
}

// Why a learner whose join in `flight` has not formed a round trains on at
// step `give_up_step` instead of waiting: the lighthouse reports that a
// round of that step or a later one closed without it (at boundary + tau:
// it was passed over; its join waits for the next round and the result is
// applied when it arrives); with `train_on_if_lost`, the lighthouse is
// unreachable (no round can form before it is back, and the others train on
// likewise); or fewer learners are alive than the quorum's minimum.
// nullopt: it waits.
std::optional<Verdict> RoundDriverImpl::TrainOnBecause(const InFlight& flight,
                                                       uint64_t give_up_step,
                                                       bool train_on_if_lost) const {
  if (ClosedWithout(flight, give_up_step)) return Verdict::kPassedOver;
  if (train_on_if_lost && agent_.lighthouse_lost()) return Verdict::kLighthouseLost;
  if (agent_.short_of_quorum()) return Verdict::kShortOfQuorum;
  return std::nullopt;
}

// Whether the lighthouse reported a round of step `step` or later that is
// newer than this learner's last round when `flight` was launched. The id
// matters for a final merge's second fragment: the first one's round is of
// the same step.
bool RoundDriverImpl::ClosedWithout(const InFlight& flight, uint64_t step) const {
  return agent_.latest_round_step() >= step && agent_.latest_round_id() > flight.previous_round_id;
}

// Waits up to kPassedOverPoll for `flight` to end; whether it has.
bool RoundDriverImpl::PollDone(InFlight& flight) {
  std::unique_lock lock(flight.mu);
  return flight.changed.wait_for(lock, kPassedOverPoll,
                                 [&]() { return flight.done.load(std::memory_order_acquire); });
}

// At shutdown: gives up `flight`'s join (counted as passed over, not as a
// failed round) and interrupts it.
void RoundDriverImpl::CallOff(InFlight& flight) {
  MarkPassedOver(flight);
  flight.called_off = true;
  services_->Interrupt();
}

bool RoundDriverImpl::MarkPassedOver(InFlight& flight) {
  if (flight.passed_over) return false;
  flight.passed_over = true;
  stats_.passed_over++;
  return true;
}

Status RoundDriverImpl::BreakGroup(Status status) {
  spdlog::error("{}; this rank stops (the group is restarted as a whole)", status);
  group_broken_ = status;
  return status;
}

// At fragment f's boundary: snapshot, and start the exchange on a
// background thread (one round in flight at a time). A final merge's is
// taken up at once (shutdown waits for it).
Status RoundDriverImpl::Launch(int f, bool final_merge) {
  if (final_merge) MEND_RETURN_IF_ERROR(FinishAll());
  book_.AwaitPrefault();  // (before the round's thread reads the fragments' state)
  auto flight = std::make_unique<InFlight>();
  // One at a time, a round is on its own; beside others, it joins in its turn.
  if (rounds_in_flight_ > 1) flight->seq = ++launched_;
  flight->in_flight = flights_.size() + 1;
  flight->fragment = f;
  flight->boundary_step = stats_.steps;
  flight->previous_round_id = HeldRoundId();
  flight->launched = clock_.NowMicros();
  flight->final_merge = final_merge;
  if (!final_merge) {
    stats_.overlap_steps = overlap_.Tau();
    if (concurrent_) {
      StatusOr<uint64_t> tau = policy_->AgreeTau(stats_.overlap_steps);
      if (!tau.ok()) return BreakGroup(tau.status());
      stats_.overlap_steps = *tau;
    }
  }
  flight->apply_at_step = stats_.steps + (final_merge ? 0 : stats_.overlap_steps);
  // Taken up in the order launched: never before an older round.
  if (!flights_.empty())
    flight->apply_at_step = std::max(flight->apply_at_step, flights_.back()->apply_at_step);
  Fragment& fragment = book_.at(f);
  flight->tokens = fragment.tokens_since_round;
  fragment.tokens_since_round = 0;
  // The round's thread asks for its quorum and connects while this one
  // takes the snapshot; it reads the snapshot once told (Snapped).
  InFlight* raw = flight.get();
  flight->thread = std::thread([this, raw]() {
    StatusOr<Outcome> outcome =
        runner_->Run(*raw, [this]() { return step_now_.load(std::memory_order_relaxed); });
    raw->Finish(std::move(outcome), clock_.NowMicros());  // the time after the round
  });
  stats_.rounds_started++;
  flights_.push_back(std::move(flight));
  stats_.most_rounds_in_flight = std::max<uint64_t>(stats_.most_rounds_in_flight, flights_.size());
  Snap(fragment, *raw);
  raw->Snapped();
  // A group's ranks each took the provisional step on their slice: into every replica.
  if (!raw->eager.empty()) {
    if (Status shared = policy_->ShareCommitted(false); !shared.ok()) return BreakGroup(shared);
  }
  return OkStatus();
}

// The boundary snapshot: the fragment's tokens, base and pseudo-gradient,
// the optimizer's moments and the model's buffers.
// outer_apply = eager: a concurrent round past the outer warm-up (which
// averages) takes the provisional step at launch. Its steps are the same on
// every rank of a group (each takes it on its slice).
bool RoundDriverImpl::EagerAt(const InFlight& flight) const {
  return apply_mode_ == OuterApply::kEager && concurrent_ && !flight.final_merge &&
         flight.boundary_step > static_cast<uint64_t>(config_.outer_warmup_steps);
}

void RoundDriverImpl::Snap(Fragment& fragment, InFlight& flight) {
  const size_t n = fragment.state->size();
  const PhaseTimer timer(&stats_.phases.snapshot);
  // The fragment's own buffers (allocated after the start).
  flight.delta = Borrow(fragment.spare, n);
  // Taken up at a later step, the result keeps what was trained since: it
  // needs its own part (and, with the provisional step, that step).
  if (concurrent_) flight.own = Borrow(fragment.spare_own, n);
  if (EagerAt(flight)) flight.eager = Borrow(fragment.spare_step, n);
  flight.norm =
      std::sqrt(book_.Snapshot(fragment, flight.delta, flight.own, flight.eager, options_.outer));
  if (moments_) {
    flight.moment_step = moments_->step();
    for (auto which : {FlatMoments::kFirst, FlatMoments::kSecond}) {
      flight.moments[which].resize(moments_->size());
      if (!moments_->Read(which, flight.moments[which])) flight.moments[which].clear();
    }
  }
  for (int kind = 0; kind < 2; ++kind) {
    if (buffers_[kind]) flight.buffers[kind] = ReadAll(*buffers_[kind]);
  }
}

// Joins the round in flight (if any) and brings its result in (Commit). A
// failed round changes nothing: the local progress goes into the next one.
// In a group the round commits only when every rank's slice succeeded; an
// error is the group's own (a rank is gone): the group is the unit of
// failure.
Status RoundDriverImpl::FinishInFlight() {
  if (flights_.empty()) return OkStatus();
  std::unique_ptr<InFlight> flight = std::move(flights_.front());
  flights_.pop_front();
  // A later round that heals waits for this one to be taken up, whatever came of it.
  struct TakenUp {
    FlightOrder& order;
    uint64_t seq;
    ~TakenUp() { order.TakenUp(seq); }
  } taken_up{runner_->order(), flight->seq};
  // Its buffers go back to its fragment for the next round.
  struct GiveBackBuffers {
    Fragment& fragment;
    InFlight& flight;
    ~GiveBackBuffers() {
      GiveBackBuffer(fragment.spare, flight.delta);
      GiveBackBuffer(fragment.spare_own, flight.own);
      GiveBackBuffer(fragment.spare_step, flight.eager);
    }
  } give_back{book_.at(flight->fragment), *flight};
  MEND_RETURN_IF_ERROR(JoinFlight(*flight));
  if (flight->outcome.ok()) return Commit(*flight);
  RecordRound(*flight);
  book_.at(flight->fragment).tokens_since_round += flight->tokens;
  if (!flight->eager.empty()) {
    UndoEager(book_, *flight);
    if (Status shared = policy_->ShareCommitted(false); !shared.ok()) return BreakGroup(shared);
  }
  if (flight->called_off) return OkStatus();  // (said when it was called off)
  stats_.failed_rounds++;
  spdlog::warn("fragment {}: round failed, training on: {}", flight->fragment,
               flight->outcome.status());
  return OkStatus();
}

// Every round in flight, oldest first.
Status RoundDriverImpl::FinishAll() {
  while (!flights_.empty()) MEND_RETURN_IF_ERROR(FinishInFlight());
  return OkStatus();
}

// A group's ranks meet every kPassedOverPoll until every slice has ended, so
// that no group collective waits on a rank that still waits for its slice;
// then whether all succeeded.
Status RoundDriverImpl::JoinFlight(InFlight& flight) {
  if (Status all = policy_->AwaitAllSlices([&]() { return PollDone(flight); }); !all.ok()) {
    services_->Interrupt();
    flight.thread.join();
    return BreakGroup(all);
  }
  flight.thread.join();
  StatusOr<bool> all_ok = policy_->AllOk(flight);
  if (!all_ok.ok()) return BreakGroup(all_ok.status());
  if (!*all_ok && flight.outcome.ok()) {
    flight.outcome = AbortedError(fmt::format(
        "round {}: another rank of this group failed its slice", flight.outcome->round_id));
  }
  return OkStatus();
}

// A round that succeeded, applied: heal, commit, moments, buffers, the step
// (a heal may move it), then into every replica of a group.
Status RoundDriverImpl::Commit(InFlight& flight) {
  Outcome& outcome = *flight.outcome;
  if (outcome.healed.empty()) {  // a heal's transfer says nothing about the next rounds
    overlap_.RecordRound(static_cast<double>(flight.finished - flight.launched) / kMicrosPerSecond);
  }
  Fragment& fragment = book_.at(flight.fragment);
  const bool adopted = outcome.fragment != flight.fragment;
  if (!outcome.healed.empty()) {
    // (The commit adds the provisional step where one was taken, else its own part.)
    ApplyHeal(book_, outcome, adopted ? nullptr : &fragment,
              flight.eager.empty() ? std::span<float>(flight.own) : std::span<float>(flight.eager));
    stats_.heals++;
  }
  stats_.bytes_sent += outcome.result.bytes_sent;
  stats_.cross_rack_bytes_sent += outcome.cross_rack_bytes;
  RoundPhases& phases = stats_.phases;
  phases.join += outcome.phases.join;
  phases.agree_or_heal += outcome.phases.agree_or_heal;
  phases.encode += outcome.phases.encode;
  phases.transfer += outcome.phases.transfer;
  phases.reduce += outcome.phases.reduce;
  phases.moments_and_buffers += outcome.phases.moments_and_buffers;
  phases.round += static_cast<double>(std::max<Micros>(0, flight.finished - flight.launched)) /
                  kMicrosPerSecond;
  {
    const PhaseTimer timer(&stats_.phases.outer_step);
    CommitRound(book_, outcome, flight, stats_.steps, apply_mode_,
                static_cast<float>(config_.mixing_alpha), options_.outer);
  }
  MomentsApplied moments;
  if (moments_) moments = ApplyMoments(moments_.get(), outcome, flight, stats_.steps);
  stats_.moment_syncs += moments.synced;
  for (int kind = 0; kind < 2; ++kind) {
    if (!outcome.synced_buffers[kind].empty())
      WriteAll(*buffers_[kind], outcome.synced_buffers[kind]);
  }
  fragment.last_round_boundary = flight.boundary_step;
  if (adopted) book_.at(outcome.fragment).last_round_boundary = outcome.heal_step;
  if (std::optional<uint64_t> step =
          RebasedStep(outcome, flight, stats_.steps, book_.period(), stats_.rounds == 0)) {
    spdlog::info("healed from {}: step {} becomes the job's step {}", outcome.heal_source,
                 stats_.steps, *step);
    stats_.steps = *step;
    step_now_.store(stats_.steps, std::memory_order_relaxed);
    book_.at(outcome.fragment).last_round_boundary = outcome.heal_step;
  }
  stats_.rounds++;
  stats_.last_round_id = outcome.round_id;
  last_round_id_ = outcome.round_id;
  if (Status shared = policy_->ShareCommitted(moments.changed); !shared.ok())
    return BreakGroup(shared);
  RecordRound(flight);  // after the commit: its digest is of the new global state
  return MaybeCheckpoint(outcome.round_id, outcome.rank, outcome.members, flight.checkpoint);
}

}  // namespace mend::reducer
