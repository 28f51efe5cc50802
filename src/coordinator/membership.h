// The lighthouse's table of learners: registration, heartbeats, liveness,
// step-time windows and slow flags, and each learner's pending quorum join.
//
// It keeps running counts of the learners in each class the quorum rules ask
// about (alive, eligible = alive and not slow, pending, eligible but not yet
// joined, previous-round members not yet joined), so that every rule is O(1)
// per event even with 10,000 learners. Every change to a record's liveness,
// slow flag, pending join or previous-round flag goes through Mutate(), which
// keeps those counts exact, as well as the newest round id held by an alive
// learner and by a pending join (the close rule that a round includes the
// newest state).
//
// Thread-safety: none; LighthouseCore serializes access under its mutex.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "coordinator/failslow_detector.h"
#include "coordinator/round.h"
#include "mend/clock.h"
#include "mend/status.h"

namespace mend::coordinator {

// A learner's outstanding Quorum call.
struct PendingJoin {
  uint64_t waiter_id = 0;
  uint64_t last_round_id = 0;
  uint64_t step = 0;
  uint64_t tokens_since_last_round = 0;
  Micros joined_at = 0;
  Micros deadline = 0;
  bool give_up_short_of_quorum = false;  // QuorumArgs's
  // A learner of a job that has finished (its final round closed), joining
  // without that round's state: it may not form a round alone (LighthouseCore).
  bool after_finished = false;
  QuorumCallback done;
};

struct LearnerRecord {
  std::string id;
  uint64_t session_id = 0;
  std::string rack;
  std::string address;
  std::vector<std::string> rank_addresses;  // every rank's data-plane host (groups)
  // The host its registration came from ("" unknown, "local" the
  // lighthouse's own), and a data-plane host it gave that is loopback.
  std::string peer_host;
  uint32_t host = 0;  // peer_host interned (Membership::HostIndex); 0: not known
  std::string loopback_host;
  uint64_t job_epoch = 0;  // LighthouseCore's, when it registered
  Micros registered_at = 0;
  uint64_t step = 0;
  uint64_t tokens_total = 0;
  uint64_t tokens_since_last_round = 0;
  uint64_t last_round_id = 0;
  uint64_t rounds_joined = 0;

  StepTimeWindow window{16};
  bool slow = false;

  double tokens_per_s = 0;
  Micros rate_sample_at = 0;
  uint64_t rate_sample_tokens = 0;

  bool alive = true;
  bool left = false;
  // Left out of rounds for a while: other learners could not connect to its
  // data plane (LighthouseCore::NoteUnreachableLocked). Not eligible, and
  // not counted for the newest-state rule, until it is let back in.
  bool unreachable = false;
  Micros gone_since = 0;           // when it died or left
  uint64_t last_member_round = 0;  // the newest round it was a member of
  // The rounds it was a member of before that, newest first (0: none): with
  // several rounds in flight (rounds_in_flight) they may still be running
  // when it dies or restarts, and are called off with the newest.
  using MemberRounds = std::array<uint64_t, 7>;
  MemberRounds earlier_member_rounds{};
  std::optional<PendingJoin> join;
  size_t vitals_index = 0;  // this record's entry in Membership's vitals

  bool eligible() const { return alive && !slow && !unreachable; }
  bool slow_but_reachable() const { return alive && slow && !unreachable; }
  std::string_view state() const;
};

// Orders records by learner id (ids are unique).
struct ById {
  bool operator()(const LearnerRecord* a, const LearnerRecord* b) const { return a->id < b->id; }
};

// What the periodic scans (liveness, fail-slow) read of a learner, kept in
// one dense array so that scanning 10,000 learners walks 10,000 small
// entries instead of 10,000 hash nodes and records (a scan holds the
// lighthouse mutex, so its length is every call's latency).
struct LearnerVitals {
  LearnerRecord* record = nullptr;
  Micros last_heartbeat = 0;
  double median_step_ms = 0;  // of the step-time window, updated on each heartbeat
  double slow_zscore = 0;     // as of the last fail-slow scan
  size_t samples = 0;         // step times in the window
  bool alive = true;          // mirrors the record's, kept by Mutate
  bool slow = false;          // mirrors the record's, kept by Mutate
};

struct MembershipCounts {
  size_t alive = 0;
  size_t eligible = 0;
  size_t pending = 0;
  size_t slow = 0;
  // Eligible learners with no pending join: the grace window waits for them.
  size_t eligible_missing = 0;
  // Slow learners (alive, reachable) with no pending join: only the job's
  // last round waits for them (QuorumMachine::MaybeClose).
  size_t slow_missing = 0;
  // Members of the previous round with no pending join (dead or slow ones too:
  // the fast path needs every one of them).
  size_t previous_missing = 0;
  // Members of the previous round with a pending join.
  size_t previous_joined = 0;
};

struct SlowFlagChange {
  std::string learner_id;
  bool slow = false;
  double zscore = 0;
  double median_step_ms = 0;
  double all_median_step_ms = 0;
};

class Membership {
 public:
  explicit Membership(FailSlowOptions failslow) : failslow_(failslow) {}

  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  // Adds or replaces the record of `id` with a fresh session. A replaced
  // record's pending join is returned to the caller to complete.
  LearnerRecord& Register(const std::string& id, uint64_t session_id, std::string rack,
                          std::string address, uint64_t step, uint64_t last_round_id, Micros now,
                          std::optional<PendingJoin>* replaced_join);

  // NOT_FOUND when the id is unknown, ALREADY_EXISTS when `session_id` is
  // not the current session (a newer registration took the id: the process
  // holding it must stop, not register again), FAILED_PRECONDITION when the
  // learner left.
  [[nodiscard]] StatusOr<LearnerRecord*> Find(const std::string& id, uint64_t session_id);
  // Whether `session_id` was replaced by a newer registration of its learner
  // id (the newest kMaxSupersededKept such sessions are remembered).
  bool WasSuperseded(uint64_t session_id) const { return superseded_.contains(session_id); }
  static constexpr size_t kMaxSupersededKept = 4096;
  LearnerRecord* FindAny(const std::string& id);
  // The record whose current session is `session_id`, or nullptr.
  LearnerRecord* FindSession(uint64_t session_id);

  // Applies `change` to `record`, keeping the counts and the pending set exact.
  template <typename Change>
  void Mutate(LearnerRecord& record, Change&& change) {
    Uncount(record);
    change(record);
    Count(record);
  }

  const LearnerVitals& vitals(const LearnerRecord& record) const {
    return vitals_[record.vitals_index];
  }
  // Any sign of life (a heartbeat, a Quorum call) at `now`.
  void Touch(const LearnerRecord& record, Micros now) {
    vitals_[record.vitals_index].last_heartbeat = now;
  }

  // Every alive learner's last sign of life moved up to `now` (a fresh
  // heartbeat timeout). Returns how many; a scan, counted.
  size_t TouchAlive(Micros now);

  // A heartbeat: liveness (a dead learner comes back), progress, step times.
  void RecordHeartbeat(LearnerRecord& record, Micros now, uint64_t step, uint64_t tokens_total,
                       uint64_t tokens_since_last_round, const std::vector<double>& step_ms);

  // Learners silent for longer than `timeout` are returned; the caller removes
  // their pending joins and then calls MarkGone.
  std::vector<LearnerRecord*> FindSilent(Micros now, Micros timeout);
  void MarkGone(LearnerRecord& record, Micros now, bool left);

  // Recomputes every judged learner's z-score and returns the flag changes.
  std::vector<SlowFlagChange> EvaluateFailSlow();

  // Drops records of learners gone for longer than `retention`.
  size_t ForgetGone(Micros now, Micros retention);

  // Takes every pending join, sorted by learner id, for round `round_id`
  // (above every earlier round): the learners become that round's members,
  // and the only previous-round members from now on; each is taken to hold
  // that round's state (last_round_id) until its next join says otherwise.
  // O(members), with no work for the learners that did not join.
  std::vector<std::pair<LearnerRecord*, PendingJoin>> TakePendingForRound(uint64_t round_id);
  bool InPreviousRound(const LearnerRecord& record) const {
    return previous_round_id_ != 0 && record.last_member_round == previous_round_id_;
  }

  const MembershipCounts& counts() const { return counts_; }
  // Whether an alive learner other than `except` (an id) registered from
  // another host than `host`; with `loopback_only`, one that gave a loopback
  // data-plane host. O(hosts).
  bool AliveOnAnotherHost(const std::string& host, const std::string& except,
                          bool loopback_only) const;
  // `host` interned: a small number for LearnerRecord::host (0 for "").
  uint32_t HostIndex(const std::string& host);
  // The newest global state known here: the highest last round id of an
  // alive, reachable learner (reported at registration and join, or the last round it
  // was made a member of), and of a pending join. O(1).
  uint64_t newest_alive_round() const { return Highest(alive_by_round_); }
  uint64_t newest_pending_round() const { return Highest(pending_by_round_); }

  // Learners with a pending join, in learner-id order. A scan: counted as a
  // visit to each of them (records_visited).
  const absl::btree_set<LearnerRecord*, ById>& pending() const {
    records_visited_ += pending_.size();
    return pending_;
  }
  // Every record. A scan: counted as a visit to each of them.
  const absl::flat_hash_map<std::string, std::unique_ptr<LearnerRecord>>& records() const {
    records_visited_ += records_.size();
    return records_;
  }
  size_t size() const { return records_.size(); }

  // How many records the scans have visited since construction (pending(),
  // records(), the liveness, fail-slow and forget scans, round closes). Tests
  // guard the cost of each operation with it: work counted, not time.
  uint64_t records_visited() const { return records_visited_; }
  void CountVisits(size_t records) const { records_visited_ += records; }
  const FailSlowOptions& failslow_options() const { return failslow_; }

 private:
  void Count(LearnerRecord& record) { Tally(record, +1, true); }
  void Uncount(LearnerRecord& record) { Tally(record, -1, true); }
  // Adds (+1) or removes (-1) `record` from the counts and, when
  // `update_pending`, from the pending set.
  void Tally(LearnerRecord& record, int sign, bool update_pending);
  // Removes `record` from the maps and the vitals; its counts must be zero.
  void Erase(LearnerRecord& record);
  // Learners counted by last round id: the newest is the map's last key, and
  // the maps hold as many keys as there are distinct round ids in play (a few).
  using RoundHistogram = std::map<uint64_t, size_t>;
  static void Histogram(RoundHistogram& histogram, uint64_t round_id, int sign);
  static void HostCount(size_t& count, int sign) {
    count = static_cast<size_t>(static_cast<long>(count) + sign);
  }
  static uint64_t Highest(const RoundHistogram& histogram) {
    return histogram.empty() ? 0 : histogram.rbegin()->first;
  }

  FailSlowOptions failslow_;
  // Open addressing: a heartbeat's lookup is one probe into a flat array, not
  // a walk to a separately allocated node (100,000 lookups a second at
  // 10,000 learners; measured with perf, node lookups were the lighthouse's
  // largest user-space cost).
  absl::flat_hash_map<std::string, std::unique_ptr<LearnerRecord>> records_;
  absl::flat_hash_map<uint64_t, LearnerRecord*> by_session_;
  // Sessions replaced by a newer registration, oldest first in the deque.
  absl::flat_hash_set<uint64_t> superseded_;
  std::deque<uint64_t> superseded_order_;
  // A B-tree: a join's insertion and a close's walk over 10,000 of them
  // touch a few hundred nodes, not one allocation each.
  absl::btree_set<LearnerRecord*, ById> pending_;
  std::vector<LearnerVitals> vitals_;  // one per record, in no particular order
  uint64_t previous_round_id_ = 0;
  MembershipCounts counts_;
  RoundHistogram alive_by_round_;    // alive learners (not unreachable), by last_round_id
  RoundHistogram pending_by_round_;  // pending joins, by the join's last_round_id
  // Alive learners by the host they registered from (peer_host set), and
  // those of them with a loopback data-plane host.
  // (By interned host: a round's close mutates every member, and these
  // counts then cost two array updates each, not string hashes.)
  absl::flat_hash_map<std::string, uint32_t> host_index_;
  std::vector<std::string> hosts_ = {""};
  std::vector<size_t> alive_by_host_ = {0};
  std::vector<size_t> loopback_by_host_ = {0};
  mutable uint64_t records_visited_ = 0;
};

}  // namespace mend::coordinator
