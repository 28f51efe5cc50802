#include "reducer/round_runner.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "core/phase_timer.h"
#include "core/round_keys.h"
#include "fmt/format.h"
#include "learner/lighthouse_rendezvous.h"
#include "reducer/healing.h"
#include "reducer/unreachable_peers.h"
#include "spdlog/spdlog.h"

namespace mend::reducer {

uint64_t CrossRackBytes(const CommunicatorStats& before, const CommunicatorStats& after,
                        const std::vector<std::string>& racks, uint32_t me) {
  if (racks.size() <= me || racks[me].empty()) return after.bytes_sent - before.bytes_sent;
  uint64_t bytes = 0;
  for (size_t p = 0; p < after.bytes_sent_to.size(); ++p) {
    if (p < racks.size() && racks[p] == racks[me]) continue;
    bytes +=
        after.bytes_sent_to[p] - (p < before.bytes_sent_to.size() ? before.bytes_sent_to[p] : 0);
  }
  return bytes;
}

RoundRunner::RoundRunner(const RoundOptions& options, const FragmentSchedule& schedule,
                         RoundServices& services, FragmentBook& book, const RoundSlices& policy,
                         size_t moment_values)
    : options_(options),
      schedule_(schedule),
      services_(services),
      book_(book),
      policy_(policy),
      moment_values_(moment_values) {}

Status FlightOrder::Await(bool join, uint64_t seq, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  MutexLock lock(mu_);
  while (!stopped_ && Done(join) + 1 < seq) {
    if (!changed_.WaitUntil(mu_, deadline) && !stopped_ && Done(join) + 1 < seq) {
      return DeadlineExceededError(
          fmt::format("round launched {}th: the rounds launched before it {} within {} ms", seq,
                      join ? "did not join" : "were not taken up", timeout.count()));
    }
  }
  if (Done(join) + 1 < seq) return AbortedError("the rounds in flight were called off");
  return OkStatus();
}

Status FlightOrder::AwaitJoinTurn(uint64_t seq, std::chrono::milliseconds timeout) {
  return Await(/*join=*/true, seq, timeout);
}

Status FlightOrder::AwaitEarlierTakenUp(uint64_t seq, std::chrono::milliseconds timeout) {
  return Await(/*join=*/false, seq, timeout);
}

void FlightOrder::Joined(uint64_t seq) {
  {
    MutexLock lock(mu_);
    joined_ = std::max(joined_, seq);
  }
  changed_.NotifyAll();
}

void FlightOrder::TakenUp(uint64_t seq) {
  {
    MutexLock lock(mu_);
    taken_up_ = std::max(taken_up_, seq);
  }
  changed_.NotifyAll();
}

void FlightOrder::Stop() {
  {
    MutexLock lock(mu_);
    stopped_ = true;
  }
  changed_.NotifyAll();
}

// The flight's join, in its turn among the rounds in flight.
StatusOr<QuorumResult> RoundRunner::Join(InFlight& flight) {
  const Micros timeout = options_.quorum_timeout;
  if (flight.seq == 0) {
    return services_.Quorum(flight.previous_round_id, flight.tokens, timeout, flight.boundary_step);
  }
  struct Turn {
    FlightOrder& order;
    uint64_t seq;
    ~Turn() { order.Joined(seq); }
  } turn{order_, flight.seq};
  // The earlier join's own timeout bounds the wait; twice it, to be safe.
  MEND_RETURN_IF_ERROR(order_.AwaitJoinTurn(
      flight.seq, std::chrono::milliseconds(2 * options_.quorum_timeout / kMicrosPerMilli)));
  return services_.Quorum(flight.previous_round_id, flight.tokens, timeout, flight.boundary_step);
}

StatusOr<Outcome> RoundRunner::Run(InFlight& flight, const std::function<uint64_t()>& step_now) {
  Outcome outcome;
  std::optional<PhaseTimer> joining(&outcome.phases.join);
  MEND_ASSIGN_OR_RETURN(QuorumResult round, Join(flight));
  const int exchanged = ExchangedFragment(round, flight);
  // A round of no state yet, or of another fragment than the flight's, may heal.
  const bool may_heal = round.heal_round_id() == 0 || round.has_heal_from() ||
                        !round.heal_to().empty() || exchanged != flight.fragment;
  flight.Formed(step_now(), round.round_id(), may_heal);
  const std::shared_ptr<RendezvousStore> store = services_.OpenRendezvous(round);
  CommunicatorOptions options;
  MEND_ASSIGN_OR_RETURN(auto comm, Connect(store, round, &options));
  if (may_heal && flight.seq > 1) {
    MEND_RETURN_IF_ERROR(order_.AwaitEarlierTakenUp(
        flight.seq, std::chrono::milliseconds(2 * (options_.quorum_timeout + options.timeout) /
                                              kMicrosPerMilli)));
  }
  const CommunicatorStats connected = comm->stats();
  services_.WatchAbort(round, comm.get(),
                       [c = comm.get()](const std::string& why) { c->Abort(why); });
  struct Unwatch {
    RoundServices& services;
    Communicator* comm;
    ~Unwatch() { services.Unwatch(comm); }
  } unwatch{services_, comm.get()};
  joining.reset();
  auto reported = [&](Status status) { return Reported(*store, round, std::move(status)); };
  flight.AwaitSnapped();  // (the training thread takes it while the round joins)
  outcome.fragment = exchanged;
  outcome.round_id = round.round_id();
  outcome.round_step = round.step();
  outcome.rank = round.rank();
  outcome.members = round.world_size();
  {
    const PhaseTimer timer(&outcome.phases.agree_or_heal);
    MEND_RETURN_IF_ERROR(
        reported(HealOrAgree(*comm, *store, round, flight, options.timeout, &outcome)));
  }
  // Past the heal, a learner of one rank that took no state (it agreed, or
  // only sent its state) has a round like any other: its merge touches its own
  // fragment only. (A group's slices may differ: there it stays as formed,
  // decided by rank 0's view.) The job's first round lets the next
  // fragment's boundary launch beside it.
  if (may_heal && !outcome.healed && exchanged == flight.fragment && policy_.DecidesAlone())
    flight.HealedNothing();
  const CommunicatorStats before_merge = comm->stats();
  MEND_RETURN_IF_ERROR(Reported(*store, round, Merge(*comm, round, flight, &outcome)));
  const CommunicatorStats merged = comm->stats();
  outcome.phases.encode = merged.encode_seconds - before_merge.encode_seconds;
  outcome.phases.transfer = merged.wait_seconds - before_merge.wait_seconds;
  outcome.phases.reduce = merged.reduce_seconds - before_merge.reduce_seconds;
  {
    const PhaseTimer timer(&outcome.phases.moments_and_buffers);
    MEND_RETURN_IF_ERROR(reported(AverageMoments(*comm, round.round_id(), flight, &outcome)));
    MEND_RETURN_IF_ERROR(reported(SyncBuffers(*comm, round.rank(), flight, &outcome)));
  }
  outcome.cross_rack_bytes =
      CrossRackBytes(connected, comm->stats(), options.member_racks, round.rank());
  return outcome;
}

// The round's options: the lighthouse's prefix (its abort key is there),
// this slice's own rendezvous in a group; the fp32 merge sums by rack, as
// the rack-aware one does: the same bits with rack_aware or without. The
// connect runs on a thread of its own (ConnectThreads), watched from the
// start: a member that died after the rendezvous holds the others in Gloo's
// connect until connect_timeout_ms, but the lighthouse calls the round off
// once it declares that member dead, and the round ends then.
StatusOr<std::unique_ptr<Communicator>> RoundRunner::Connect(
    const std::shared_ptr<RendezvousStore>& store, const QuorumResult& round,
    CommunicatorOptions* options) {
  *options = CommunicatorOptionsForRound(options_.communicator, round);
  options->prefix = policy_.SlicePrefix(round.rendezvous_prefix());
  options->member_racks.clear();
  for (const RoundMember& member : round.members()) options->member_racks.push_back(member.rack());
  // Whom it could not reach goes to the lighthouse (read at the next join)
  // from the connect's own thread: also when the round was called off
  // (another member's connect failed first) and the connect ran on.
  const std::shared_ptr<ConnectThreads::Pending> pending = connects_.Start(
      [&services = services_, store, options = *options, rack_aware = options_.rack_aware,
       members = round.members(), prefix = round.rendezvous_prefix()]() {
        StatusOr<std::unique_ptr<Communicator>> comm =
            services.Connect(*store, options, rack_aware);
        if (!comm.ok()) {
          ReportUnreachable(*store, prefix, members, services.learner_id(), comm.status());
        }
        return comm;
      });
  services_.WatchAbort(round, pending.get(),
                       [pending](const std::string& why) { pending->CallOff(why); });
  StatusOr<std::unique_ptr<Communicator>> comm =
      pending->Await(fmt::format("round {}", round.round_id()));
  services_.Unwatch(pending.get());
  // Every member connects to every other: without this one the round cannot
  // complete, and the others learn it from the round's abort key now, not
  // when collective_timeout_ms runs out (a data plane that cannot come up
  // would otherwise hold the whole job that long at every round). A round
  // called off (ABORTED) has its abort key already.
  if (!comm.ok() && comm.status().code() != absl::StatusCode::kAborted) {
    (void)store->Set(round.rendezvous_prefix() + kRoundAbortKey,
                     fmt::format("learner '{}' could not connect: {}", services_.learner_id(),
                                 std::string(comm.status().message())));
  }
  return comm;
}

// The fragment the round exchanges, the same on every member: the one whose
// boundary is the round's step (its members' largest boundary). Members at
// one boundary exchange their own fragment; one whose boundary was a
// fragment period or more behind the others' (stopped, slow, or a join
// passed over that heals) is at another fragment's: exchanging its own would
// meet pieces of another size, so it takes part without a pseudo-gradient.
// A final merge's fragments are each learner's own, launched in turn at the
// last step (a healed member's, its source's).
Status RoundRunner::Reported(RendezvousStore& store, const QuorumResult& round, Status status) {
  ReportUnreachable(store, round.rendezvous_prefix(), round.members(), services_.learner_id(),
                    status);
  return status;
}

int RoundRunner::ExchangedFragment(const QuorumResult& round, const InFlight& flight) const {
  if (flight.final_merge || options_.IsFinalMerge(schedule_, round.step(), flight.fragment))
    return flight.fragment;
  for (int64_t f = 0; f < schedule_.fragments(); ++f) {
    if (schedule_.StartsAt(f, static_cast<int64_t>(round.step()))) return static_cast<int>(f);
  }
  return flight.fragment;
}

void RoundRunner::Stop() {
  order_.Stop();
  connects_.Stop("the learner's rounds were called off");
}

// On a fresh start (no round of the job completed yet) every member takes
// rank 0's state, unless all of them hold it already (the usual case: the
// same seed or checkpoint), which they learn through the round's store: then
// no model crosses the link. Otherwise the lighthouse named a source when a
// member is behind.
Status RoundRunner::HealOrAgree(Communicator& comm, RendezvousStore& store,
                                const QuorumResult& round, InFlight& flight, Micros timeout,
                                Outcome* outcome) {
  if (round.heal_round_id() == 0) {
    MEND_ASSIGN_OR_RETURN(bool agree, StatesAgree(store, round, flight, timeout));
    if (agree) return OkStatus();
  }
  HealOffer offer;
  offer.boundary_step = flight.boundary_step;
  offer.fragment = flight.fragment;
  offer.send_moments = options_.heal_inner_optimizer;
  offer.moment_values = moment_values_;
  offer.moments[0] = &flight.moments[0];
  offer.moments[1] = &flight.moments[1];
  offer.moment_step = flight.moment_step;
  // A learner that joins with nothing of the job's state (a new or
  // restarted process, no checkpoint) trained from its own initial
  // parameters: its pseudo-gradient is not one the job can use, and its
  // state none the job needs. While its training thread waits for the
  // round (InFlight::training_waits) nothing else reads that state: the
  // heal writes into it as it arrives, with no copy of the whole (a failure
  // halfway resets it: Flights::GiveBack).
  const bool fresh_join = flight.previous_round_id == 0 && round.heal_round_id() > 0;
  MEND_ASSIGN_OR_RETURN(
      Healed healed,
      HealRound(comm, round, book_.fragments(), offer, services_.clock(),
                fresh_join && flight.training_waits ? &flight.state_written : nullptr));
  outcome->heal_seconds = healed.seconds;
  if (!healed.healed) return OkStatus();
  outcome->healed = true;
  outcome->healed_state = std::move(healed.state);
  outcome->heal_bytes = healed.bytes;
  outcome->heal_source = healed.source;
  outcome->heal_step = healed.step;
  // (Otherwise the round's step's fragment, the source's own when it is ahead.)
  if (flight.final_merge) outcome->fragment = healed.fragment;
  outcome->healed_moments[0] = std::move(healed.moments[0]);
  outcome->healed_moments[1] = std::move(healed.moments[1]);
  outcome->healed_moment_step = healed.moment_step;
  outcome->fresh_join = fresh_join;
  return OkStatus();
}

// Whether every member of `round` holds the same global state at the same
// boundary step and fragment: each publishes its digest under the round's
// prefix and reads all the others' (so all decide alike).
StatusOr<bool> RoundRunner::StatesAgree(RendezvousStore& store, const QuorumResult& round,
                                        const InFlight& flight, Micros timeout) const {
  if (round.world_size() == 1) return true;  // one member agrees with itself
  const std::string prefix = policy_.SlicePrefix(round.rendezvous_prefix());
  auto key = [&](uint32_t rank) { return fmt::format("{}state/{}", prefix, rank); };
  const std::string mine =
      fmt::format("{} {} {}", book_.AgreementDigest(), flight.boundary_step, flight.fragment);
  MEND_RETURN_IF_ERROR(store.Set(key(round.rank()), mine));
  bool agree = true;
  for (uint32_t r = 0; r < round.world_size(); ++r) {
    if (r == round.rank()) continue;
    MEND_ASSIGN_OR_RETURN(std::string theirs, store.Get(key(r), timeout));
    agree = agree && theirs == mine;
  }
  return agree;
}

// The pseudo-gradient exchange and outer step. The round's step is the
// lighthouse's (its members' largest), the same for every member, so all
// take the same kind of outer step. A join passed over in streaming mode
// may form a round of the others' next fragment (the lighthouse does not
// know fragments): it healed (it was behind), takes part in that
// fragment's round without a pseudo-gradient, and keeps its own fragment's
// progress for that fragment's next round.
Status RoundRunner::Merge(Communicator& comm, const QuorumResult& round, InFlight& flight,
                          Outcome* outcome) {
  const bool adopted = outcome->fragment != flight.fragment;
  OuterSyncOptions sync_options = options_.sync;
  sync_options.contributes = !outcome->fresh_join && !adopted;
  sync_options.warmup = round.step() > 0 && round.step() <= options_.outer_warmup_steps;
  outcome->outer_warmup = sync_options.warmup;
  outcome->final_merge = options_.IsFinalMerge(schedule_, round.step(), outcome->fragment);
  if (outcome->final_merge) {
    // The members' models averaged exactly: lossless, and no error
    // feedback (what a sparse codec held back stays this learner's).
    sync_options.warmup = true;
    sync_options.codec = nullptr;
  }
  // The merge runs on the healed base when this learner was behind. The
  // exchange reads a state's size and error feedback only, and a healed
  // base has none of the latter: a state of the size, its (zero) pages never
  // touched, stands for it, not a copy of the healed values.
  const FragmentState* state = book_.at(outcome->fragment).state.get();
  std::unique_ptr<FragmentState> healed_state;
  if (outcome->healed) {
    healed_state = std::make_unique<FragmentState>(state->size());
    state = healed_state.get();
  }
  // Merged in place: the flight's buffer, or the outcome's for a round of
  // another fragment (taking part with zeros).
  std::span<float> delta = flight.delta;
  std::optional<double> norm = flight.norm;
  if (adopted) {
    outcome->adopted_merged.assign(state->size(), 0.0f);
    delta = outcome->adopted_merged;
    norm = 0.0;
    spdlog::info(
        "round {}: exchanges fragment {} (its step {}), not this learner's fragment {} (its "
        "boundary {} was behind); taking part without a pseudo-gradient",
        round.round_id(), outcome->fragment, round.step(), flight.fragment, flight.boundary_step);
  }
  const auto weight = static_cast<double>(policy_.MergeWeight(flight.tokens));
  // A deferred snapshot's pieces are made as the merge reaches them.
  Communicator::MakeValues make;
  if (flight.deferred && !adopted) {
    make = [&](size_t begin, size_t end) {
      const PhaseTimer timer(&outcome->phases.snapshot);
      flight.made = true;
      return flight.deferred->Make(begin, end);
    };
  }
  MEND_ASSIGN_OR_RETURN(outcome->result,
                        OuterRound::Exchange(comm, *state, delta, weight, sync_options,
                                             make ? std::nullopt : norm, make ? &make : nullptr));
  return OkStatus();
}

// DES-LOC: every (K_u / H)-th round the first moments, every (K_v / H)-th
// the second, averaged with the round's weights. The round id decides, so
// every member of a round agrees. A learner without optimizer state yet
// takes part with weight 0.
Status RoundRunner::AverageMoments(Communicator& comm, uint64_t round_id, const InFlight& flight,
                                   Outcome* outcome) {
  if (!options_.desloc) return OkStatus();
  for (auto which : {FlatMoments::kFirst, FlatMoments::kSecond}) {
    if (round_id % options_.desloc_rounds[which] != 0) continue;
    std::vector<float>& average = outcome->averaged_moments[which];
    // A learner that took its source's moments in this round's heal
    // (heal_inner_optimizer) has none of its own to add: it takes the
    // average as every member does, and gives it nothing.
    const bool have = !flight.moments[which].empty() && outcome->healed_moments[which].empty();
    average = have ? flight.moments[which] : std::vector<float>(moment_values_, 0.0f);
    const double weight =
        have ? (options_.sync.token_weighted ? static_cast<double>(flight.tokens) : 1.0) : 0.0;
    MEND_RETURN_IF_ERROR(comm.WeightedAllReduce(average, weight));
  }
  return OkStatus();
}

// sync_buffers: the model's floating-point buffers averaged with the
// round's weights, its integer ones (carried as floats) taken from the
// round's first member; every member then holds the same values.
Status RoundRunner::SyncBuffers(Communicator& comm, uint32_t rank, const InFlight& flight,
                                Outcome* outcome) {
  constexpr int kAveraged = 0, kFirstMembers = 1;
  if (!flight.buffers[kAveraged].empty()) {
    outcome->synced_buffers[kAveraged] = flight.buffers[kAveraged];
    const double weight = options_.sync.token_weighted
                              ? static_cast<double>(std::max<uint64_t>(flight.tokens, 1))
                              : 1.0;
    MEND_RETURN_IF_ERROR(comm.WeightedAllReduce(outcome->synced_buffers[kAveraged], weight));
  }
  if (!flight.buffers[kFirstMembers].empty()) {
    outcome->synced_buffers[kFirstMembers] = flight.buffers[kFirstMembers];
    MEND_RETURN_IF_ERROR(
        comm.WeightedAllReduce(outcome->synced_buffers[kFirstMembers], rank == 0 ? 1.0 : 0.0));
  }
  return OkStatus();
}

}  // namespace mend::reducer
