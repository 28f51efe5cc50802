#include "reducer/flights.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <utility>

#include "core/phase_timer.h"
#include "core/status_format.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace mend::reducer {
namespace {

// How often a learner waiting for a round looks whether the lighthouse
// reported it closed without it, and a group's ranks meet while they wait.
constexpr auto kPassedOverPoll = std::chrono::milliseconds(20);

double Seconds(Micros from, Micros to) {
  return static_cast<double>(std::max<Micros>(0, to - from)) / kMicrosPerSecond;
}

// What a round that succeeded adds to the learner's counters.
void Count(const InFlight& flight, const Outcome& outcome, ReducerStats* stats) {
  stats->bytes_sent += outcome.result.bytes_sent;
  stats->cross_rack_bytes_sent += outcome.cross_rack_bytes;
  if (outcome.result.made_in_merge) stats->rounds_made_in_merge++;
  RoundPhases& phases = stats->phases;
  phases.snapshot += outcome.phases.snapshot;  // (made in the merge: DeferredSnapshot)
  phases.join += outcome.phases.join;
  phases.agree_or_heal += outcome.phases.agree_or_heal;
  phases.encode += outcome.phases.encode;
  phases.transfer += outcome.phases.transfer;
  phases.reduce += outcome.phases.reduce;
  phases.moments_and_buffers += outcome.phases.moments_and_buffers;
  phases.round += Seconds(flight.launched, flight.finished);
}

}  // namespace

Flights::Flights(const FlightsContext& context, std::unique_ptr<RoundServices> services)
    : context_(context),
      options_(context.options),
      stats_(context.stats),
      policy_(context.policy),
      clock_(context.clock),
      services_(std::move(services)),
      runner_(context.options, context.schedule, *services_, context.outer.book(), context.policy,
              context.moments ? context.moments->size() : 0) {
  step_now_.store(stats_.steps);
}

Flights::~Flights() { CallOffAll(); }

// Every round in flight called off and its thread joined; their results dropped.
void Flights::CallOffAll() {
  if (flights_.empty()) return;
  services_->Interrupt();
  runner_.Stop();
  for (auto& flight : flights_) flight->thread.join();
  flights_.clear();
}

// The newest round this learner holds or takes part in: its last round
// taken up, then each round in flight that formed, oldest first, up to one
// that failed (the lighthouse then heals it). What its next join reports.
uint64_t Flights::HeldRoundId() const {
  uint64_t held = stats_.last_round_id;
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
StatusOr<bool> Flights::LaunchBlocked(int f) {
  if (flights_.empty()) return false;
  if (flights_.size() >= options_.rounds_in_flight) return true;
  // What every rank of a group sees alike decides at once; its round threads' reports, rank 0.
  bool blocked = false;
  for (const auto& flight : flights_) {
    if (flight->fragment == f || flight->final_merge || flight->passed_over) return true;
    const FlightStatus status = PlannedStatus(*flight);
    blocked = blocked || (!status.formed && !status.done) || status.may_heal;
  }
  return policy_.AgreeLaunch(blocked);
}

void Flights::CountWait(InFlight& flight) {
  if (flight.waited || flight.done.load(std::memory_order_acquire)) return;
  flight.waited = true;
  stats_.round_waits++;
}

bool Flights::MarkPassedOver(InFlight& flight) {
  if (flight.passed_over) return false;
  flight.passed_over = true;
  stats_.passed_over++;
  return true;
}

// At boundary + tau, the learner trains on without `flight` (said once).
void Flights::TrainOn(InFlight& flight, Verdict verdict) {
  if (!MarkPassedOver(flight)) return;
  if (verdict == Verdict::kPassedOver) {
    spdlog::info(
        "fragment {}: the round for step {} closed without this learner; training on, its join "
        "waits for the next round",
        flight.fragment, flight.boundary_step);
  } else if (verdict == Verdict::kShortOfQuorum) {
    spdlog::info(
        "fragment {}: fewer learners are alive than the quorum's minimum; training on, the join "
        "for step {} waits for them",
        flight.fragment, flight.boundary_step);
  } else {
    spdlog::info(
        "fragment {}: the lighthouse is unreachable; training on, the join for step {} waits for "
        "it",
        flight.fragment, flight.boundary_step);
  }
}

// At shutdown: gives up `flight`'s join (counted as passed over, not as a
// failed round) and interrupts it.
void Flights::CallOff(InFlight& flight) {
  MarkPassedOver(flight);
  flight.called_off = true;
  services_->Interrupt();
}

// At fragment f's boundary: snapshot, and start the exchange on a
// background thread. The round's thread asks for its quorum and connects
// while this one takes the snapshot; it reads the snapshot once told (Snapped).
Status Flights::Launch(int f, uint64_t tau, bool final_merge) {
  if (final_merge) MEND_RETURN_IF_ERROR(TakeUpAll());
  FragmentBook& book = context_.outer.book();
  book.AwaitPrefault();  // (before the round's thread reads the fragments' state)
  auto flight = std::make_unique<InFlight>();
  // One at a time, a round is on its own; beside others, it joins in its turn.
  if (options_.rounds_in_flight > 1) flight->seq = ++launched_;
  flight->in_flight = flights_.size() + 1;
  flight->fragment = f;
  flight->boundary_step = stats_.steps;
  flight->previous_round_id = HeldRoundId();
  flight->launched = clock_.NowMicros();
  flight->final_merge = final_merge;
  // The training thread waits for a synchronous round (AwaitVerdict), and
  // in concurrent mode for the first round of a learner of one rank that
  // joins a job in progress with none of its state (a new or restarted
  // process): that round heals it, and what it would train meanwhile is on
  // a model the heal replaces. It is taken up at its boundary
  // (RoundDriverImpl::AtBoundary), and the heal writes into the state in
  // place (HealRound's written_in_place): nothing else reads it meanwhile.
  const bool joins_in_progress = !final_merge && JoinsInProgress(stats_.steps);
  flight->training_waits = (!options_.concurrent && !final_merge) || joins_in_progress;
  flight->apply_at_step = stats_.steps + (joins_in_progress ? 0 : tau);
  // Taken up in the order launched: never before an older round.
  if (!flights_.empty())
    flight->apply_at_step = std::max(flight->apply_at_step, flights_.back()->apply_at_step);
  Fragment& fragment = book.at(f);
  flight->tokens = fragment.tokens_since_round;
  fragment.tokens_since_round = 0;
  InFlight& started = Start(std::move(flight));
  Snap(fragment, started);
  started.Snapped();
  // A group's ranks each took the provisional step on their slice: into every replica.
  return started.eager.empty() ? OkStatus() : policy_.ShareCommitted(false);
}

InFlight& Flights::Start(std::unique_ptr<InFlight> flight) {
  InFlight* raw = flight.get();
  flight->thread = std::thread([this, raw]() {
    StatusOr<Outcome> outcome =
        runner_.Run(*raw, [this]() { return step_now_.load(std::memory_order_relaxed); });
    raw->Finish(std::move(outcome), clock_.NowMicros());  // the time after the round
  });
  stats_.rounds_started++;
  flights_.push_back(std::move(flight));
  stats_.most_rounds_in_flight = std::max<uint64_t>(stats_.most_rounds_in_flight, flights_.size());
  return *raw;
}

// outer_apply = eager: a concurrent round past the outer warm-up (which
// averages) takes the provisional step at launch. Its steps are the same on
// every rank of a group (each takes it on its slice).
bool Flights::EagerAt(const InFlight& flight) const {
  return !flight.final_merge && EagerAtBoundary(flight.boundary_step);
}

bool Flights::EagerAtBoundary(uint64_t step) const {
  return options_.apply == OuterApply::kEager && options_.concurrent &&
         step > options_.outer_warmup_steps;
}

// The boundary snapshot: the fragment's tokens, base and pseudo-gradient,
// the optimizer's moments and the model's buffers.
void Flights::Snap(Fragment& fragment, InFlight& flight) {
  const size_t n = fragment.state->size();
  const PhaseTimer timer(&stats_.phases.snapshot);
  // The fragment's own buffers (allocated after the start).
  flight.delta = Borrow(fragment.spare, n);
  // Taken up at a later step, the result keeps what was trained since: it
  // needs its own part (and, with the provisional step, that step).
  if (options_.concurrent) flight.own = Borrow(fragment.spare_own, n);
  if (EagerAt(flight)) flight.eager = Borrow(fragment.spare_step, n);
  FragmentBook& book = context_.outer.book();
  // A synchronous round's pseudo-gradient is made by the round as its merge
  // reaches each piece, where the parameters are in place: this thread
  // waits for the round meanwhile (and a final merge's call-off joins it),
  // so the parameters stay as they are. (A group's ranks take their
  // slices' snapshots here; so does a learner's first round, which compares
  // the members' states or heals before its merge: the snapshot is taken
  // meanwhile.)
  if (!options_.concurrent && policy_.SnapshotsAtMerge() && flight.own.empty() &&
      flight.eager.empty() && flight.previous_round_id != 0) {
    flight.deferred = book.DeferSnapshot(fragment, flight.delta);
  }
  if (!flight.deferred) {
    flight.norm = std::sqrt(
        book.Snapshot(fragment, flight.delta, flight.own, flight.eager, options_.sync.outer));
  }
  if (FlatMoments* moments = context_.moments) {
    flight.moment_step = moments->step();
    for (auto which : {FlatMoments::kFirst, FlatMoments::kSecond}) {
      flight.moments[which].resize(moments->size());
      if (!moments->Read(which, flight.moments[which])) flight.moments[which].clear();
    }
  }
  for (int kind = 0; kind < 2; ++kind) {
    if (buffers_[kind]) flight.buffers[kind] = ReadAll(*buffers_[kind]);
  }
}

// Waits for the round in flight (kDone); a round that may be passed over (a
// concurrent learner's, or a final merge's) returns without waiting longer
// once TrainOnBecause says so. A group's ranks cannot each decide this on
// their own timing: rank 0 decides for them (the policy's AgreeVerdict),
// and kDone then means that its join formed: TakeUp waits for every slice,
// the ranks together.
StatusOr<Verdict> Flights::AwaitVerdict(InFlight& flight, uint64_t give_up_step,
                                        bool train_on_if_lost) {
  if (!options_.concurrent && !flight.final_merge) return Verdict::kDone;  // joined when applied
  return policy_.AgreeVerdict([&]() -> std::optional<Verdict> {
    if (PollDone(flight)) return Verdict::kDone;
    if (flight.Status().formed) return Verdict::kDone;
    return TrainOnBecause(flight, give_up_step, train_on_if_lost);
  });
}

// Why a learner whose join in `flight` has not formed a round trains on at
// step `give_up_step` instead of waiting: the lighthouse reports that a
// round of that step or a later one, newer than the learner's last round
// when it launched `flight` (a final merge's second fragment: the first
// one's round is of the same step), closed without it (at boundary + tau:
// it was passed over; its join waits for the next round and the result is
// applied when it arrives); with `train_on_if_lost`, the lighthouse is
// unreachable (no round can form before it is back, and the others train on
// likewise); or fewer learners are alive than the quorum's minimum.
// nullopt: it waits.
std::optional<Verdict> Flights::TrainOnBecause(const InFlight& flight, uint64_t give_up_step,
                                               bool train_on_if_lost) const {
  const LighthouseNews news = services_->News();
  if (news.latest_round_step >= give_up_step && news.latest_round_id > flight.previous_round_id)
    return Verdict::kPassedOver;
  if (train_on_if_lost && news.lost) return Verdict::kLighthouseLost;
  if (news.short_of_quorum) return Verdict::kShortOfQuorum;
  return std::nullopt;
}

// Waits up to kPassedOverPoll for `flight` to end; whether it has.
bool Flights::PollDone(InFlight& flight) {
  std::unique_lock lock(flight.mu);
  return flight.changed.wait_for(lock, kPassedOverPoll,
                                 [&]() { return flight.done.load(std::memory_order_acquire); });
}

// Joins the oldest round and brings its result in (Commit). A failed round
// changes nothing: the local progress goes into the next one. In a group
// the round commits only when every rank's slice succeeded; an error is the
// group's own (a rank is gone): the group is the unit of failure.
Status Flights::TakeUp() {
  if (flights_.empty()) return OkStatus();
  std::unique_ptr<InFlight> flight = std::move(flights_.front());
  flights_.pop_front();
  // A later round that heals waits for this one to be taken up, whatever came of it.
  struct TakenUp {
    FlightOrder& order;
    uint64_t seq;
    ~TakenUp() { order.TakenUp(seq); }
  } taken_up{runner_.order(), flight->seq};
  // Its buffers go back to its fragment for the next round.
  struct GiveBackBuffers {
    Fragment& fragment;
    InFlight& flight;
    ~GiveBackBuffers() {
      GiveBackBuffer(fragment.spare, flight.delta);
      GiveBackBuffer(fragment.spare_own, flight.own);
      GiveBackBuffer(fragment.spare_step, flight.eager);
    }
  } give_back{context_.outer.book().at(flight->fragment), *flight};
  MEND_RETURN_IF_ERROR(Join(*flight));
  if (flight->made) context_.outer.book().CountDeferred();
  return flight->outcome.ok() ? Commit(*flight) : GiveBack(*flight);
}

Status Flights::TakeUpAll() {
  while (!flights_.empty()) MEND_RETURN_IF_ERROR(TakeUp());
  return OkStatus();
}

// A group's ranks meet every kPassedOverPoll until every slice has ended, so
// that no group collective waits on a rank that still waits for its slice;
// then whether all succeeded.
Status Flights::Join(InFlight& flight) {
  if (Status all = policy_.AwaitAllSlices([&]() { return PollDone(flight); }); !all.ok()) {
    services_->Interrupt();
    flight.thread.join();
    return all;
  }
  flight.thread.join();
  MEND_ASSIGN_OR_RETURN(bool all_ok, policy_.AllOk(flight));
  if (!all_ok && flight.outcome.ok()) {
    flight.outcome = AbortedError(fmt::format(
        "round {}: another rank of this group failed its slice", flight.outcome->round_id));
  }
  return OkStatus();
}

// A round that failed: its tokens go into the next, its provisional step is undone.
Status Flights::GiveBack(InFlight& flight) {
  Record(flight);
  FragmentBook& book = context_.outer.book();
  book.at(flight.fragment).tokens_since_round += flight.tokens;
  if (flight.state_written) {
    // Its state was none of the job's (a fresh join) and is now part the
    // source's: it starts again from its own parameters, and its next
    // round heals it again.
    spdlog::warn(
        "fragment {}: the heal into this learner's state failed halfway: its outer "
        "state starts again from its parameters",
        flight.fragment);
    book.BaseFromParameters();
  }
  if (!flight.eager.empty()) {
    UndoEager(book, flight);
    MEND_RETURN_IF_ERROR(policy_.ShareCommitted(false));
  }
  if (flight.called_off) return OkStatus();  // (said when it was called off)
  stats_.failed_rounds++;
  // Failures in a row (a lighthouse gone for good fails every boundary's
  // join): the 1st, 2nd, 4th, 8th, ... said, not one line per boundary.
  const uint64_t in_a_row = ++failed_in_a_row_;
  if ((in_a_row & (in_a_row - 1)) == 0) {
    spdlog::warn(
        "fragment {}: round failed, training on{}: {}", flight.fragment,
        in_a_row > 2 ? fmt::format(" ({} in a row; those between not logged)", in_a_row) : "",
        flight.outcome.status());
  }
  return OkStatus();
}

// A round that succeeded, applied, then into every replica of a group,
// recorded (its digest is of the new global state) and checkpointed when due.
Status Flights::Commit(InFlight& flight) {
  const Outcome& outcome = *flight.outcome;
  // A heal's transfer says nothing about the next rounds.
  if (!outcome.healed) context_.overlap.RecordRound(Seconds(flight.launched, flight.finished));
  Count(flight, outcome, &stats_);
  if (failed_in_a_row_ > 2) {
    spdlog::info("round {}: a round again, after {} failed in a row", outcome.round_id,
                 failed_in_a_row_);
  }
  failed_in_a_row_ = 0;
  const bool moments_changed = Apply(flight);
  stats_.rounds++;
  stats_.last_round_id = outcome.round_id;
  MEND_RETURN_IF_ERROR(policy_.ShareCommitted(moments_changed));
  Record(flight);
  // The round at the job's last step (with final_merge) is always written:
  // a learner that reaches the end after it takes the job's final model from
  // it (RoundDriverImpl::TakeTheJobsFinalModel).
  const bool job_end = options_.final_merge_step > 0 && !flight.final_merge &&
                       flight.boundary_step >= options_.final_merge_step;
  return context_.outer.MaybeCheckpoint({stats_.steps, outcome.round_id, stats_.tokens},
                                        outcome.rank, outcome.members,
                                        flight.checkpoint || job_end);
}

// The outcome into the learner's state: heal, commit, moments, buffers,
// the step (a heal may move it). Whether the moments changed.
bool Flights::Apply(InFlight& flight) {
  Outcome& outcome = *flight.outcome;
  FragmentBook& book = context_.outer.book();
  Fragment& fragment = book.at(flight.fragment);
  const bool adopted = outcome.fragment != flight.fragment;
  if (outcome.healed) {
    // (The commit adds the provisional step where one was taken, else its own part.)
    ApplyHeal(book, outcome, adopted ? nullptr : &fragment,
              flight.eager.empty() ? std::span<float>(flight.own) : std::span<float>(flight.eager));
    stats_.heals++;
  }
  {
    const PhaseTimer timer(&stats_.phases.outer_step);
    CommitRound(book, outcome, flight, stats_.steps, options_.apply, options_.mixing_alpha,
                options_.sync.outer);
  }
  const MomentsApplied moments = context_.moments
                                     ? ApplyMoments(context_.moments, outcome, flight, stats_.steps)
                                     : MomentsApplied{};
  stats_.moment_syncs += moments.synced;
  for (int kind = 0; kind < 2; ++kind) {
    if (!outcome.synced_buffers[kind].empty())
      WriteAll(*buffers_[kind], outcome.synced_buffers[kind]);
  }
  // (Of another fragment's round, its own fragment had no round.)
  if (adopted) {
    book.at(outcome.fragment).last_round_boundary = JobStep(outcome);
  } else {
    fragment.last_round_boundary = flight.boundary_step;
  }
  if (std::optional<uint64_t> step =
          RebasedStep(outcome, flight, stats_.steps, book.period(), stats_.rounds == 0)) {
    if (outcome.healed) {
      spdlog::info("healed from {}: step {} becomes the job's step {}", outcome.heal_source,
                   stats_.steps, *step);
    } else {
      spdlog::info(
          "round {}: its step is {}, this learner's boundary {}: step {} becomes the job's step {}",
          outcome.round_id, outcome.round_step, flight.boundary_step, stats_.steps, *step);
    }
    stats_.steps_moved += static_cast<int64_t>(*step) - static_cast<int64_t>(stats_.steps);
    stats_.steps = *step;
    // The source's optimizer step count came with its moments: it goes on
    // from the source's boundary as the job's step does, so that the two
    // stay apart by what they were on the source (Adam's bias correction at
    // each job step, the others').
    if (context_.moments != nullptr && outcome.healed && outcome.healed_moment_step > 0 &&
        !outcome.healed_moments[0].empty()) {
      context_.moments->set_step(outcome.healed_moment_step + (*step - JobStep(outcome)));
    }
    StepNow(stats_.steps);
    book.at(outcome.fragment).last_round_boundary = JobStep(outcome);
  }
  return moments.changed;
}

void Flights::Record(const InFlight& flight) {
  if (!context_.diagnostics.enabled()) return;
  nlohmann::json record = RoundRecord(flight, stats_.steps, clock_.NowMicros());
  if (flight.outcome.ok()) {
    record["global_sha256"] = context_.outer.book().GlobalDigest();  // in a group: of this slice
    policy_.AddToRecord(record);
  }
  context_.diagnostics.Round(std::move(record));
}

RoundView Flights::View(uint64_t step, Phase phase) const {
  RoundView view;
  view.phase = phase;
  view.step = step;
  view.apply_at_step = !flights_.empty() ? flights_.front()->apply_at_step : 0;
  view.group = policy_.group();
  view.concurrent = options_.concurrent;
  view.launch_blocked = !flights_.empty();  // the driver asks LaunchBlocked where it is read
  view.join_waits = flights_.size() > 1 && flights_.back()->passed_over;
  return view;
}

Phase Flights::HeadPhase(const bool* arrived) const {
  if (flights_.empty()) return Phase::kIdle;
  return PhaseOf(flights_.front()->Status(arrived), policy_.group());
}

// A planned step sees the rounds in flight as Plan saw them (a first round
// that agreed since still holds the next launch back); else as they are.
FlightStatus Flights::PlannedStatus(InFlight& flight) const {
  if (planned_step_ == stats_.steps) {
    for (const auto& [planned, status] : planned_status_) {
      if (planned == &flight) return status;
    }
  }
  return flight.Status();
}

void Flights::Plan(uint64_t step) {
  planned_step_ = step;
  planned_joins_in_progress_ = JoinsInProgressNow();
  planned_arrivals_ = 0;
  planned_status_.clear();
  for (const auto& flight : flights_) planned_status_.emplace_back(flight.get(), flight->Status());
  for (const auto& flight : flights_) {
    if (!flight->done.load(std::memory_order_acquire)) break;
    planned_arrivals_++;
  }
}

bool Flights::LaunchOnlyReads(uint64_t next, Action action) const {
  return options_.concurrent && flights_.empty() && action == Action::kNone &&
         !EagerAtBoundary(next) && !JoinsInProgress(next);
}

bool Flights::JoinsInProgress(uint64_t step) const {
  return Planned(step) ? planned_joins_in_progress_ : JoinsInProgressNow();
}

bool Flights::JoinsInProgressNow() const {
  return options_.concurrent && flights_.empty() && policy_.JoinWaitsForItsHeal() &&
         HeldRoundId() == 0 && services_->News().latest_round_id > 0;
}

// The fragments whose parameters step `next` may read or write: those it
// launches a round of, and for each round it may take up, what its result
// touches (its fragment; an adopted one's too; every fragment for a heal).
// A round not in yet that it may wait for touches its own fragment when it
// formed with no member to heal. Every fragment where that is not known
// yet: a synchronous round (launched and taken up in one step), a round
// that has not formed, a group (its ranks decide together, and share the
// whole replica: the policy's TouchedFragments).
std::vector<uint8_t> Flights::PlannedFragments(uint64_t next, std::vector<uint8_t> launches) const {
  const std::vector<uint8_t> all(launches.size(), 1);
  if (!options_.concurrent) return all;
  std::vector<uint8_t> fragments = std::move(launches);
  const bool launching = std::find(fragments.begin(), fragments.end(), 1) != fragments.end();
  for (size_t k = 0; k < flights_.size(); ++k) {
    const InFlight& flight = *flights_[k];
    if (k >= planned_arrivals_) {
      // Not in: waited for when due (or to make room for a launch).
      if (!launching && flight.apply_at_step > next) break;
      const FlightStatus& status = planned_status_[k].second;
      if (!status.formed || status.may_heal) return all;
      fragments[static_cast<size_t>(flight.fragment)] = 1;
      continue;
    }
    fragments[static_cast<size_t>(flight.fragment)] = 1;  // (a failed round's undone step too)
    if (!flight.outcome.ok()) continue;
    if (flight.outcome->healed) return all;
    fragments[static_cast<size_t>(flight.outcome->fragment)] = 1;
  }
  return policy_.TouchedFragments(std::move(fragments));
}

}  // namespace mend::reducer
