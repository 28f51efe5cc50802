// LighthouseCore: the whole state of the coordinator (membership, quorum
// rules, fail-slow detector, events, counters) behind one mutex, and the
// rendezvous store (a store::StoreCore, locked after it), driven by calls
// and by Tick(). It knows nothing of gRPC or HTTP; the
// service and the HTTP side are thin shells over it, and tests drive it with
// a FakeClock.
//
// Waiting calls (Quorum, store waits) never block: they take a callback that
// runs exactly once, on the calling thread or on the thread whose event (a
// join, a Set, a Tick) completed them, always after the mutex is released.
//
// Time-based rules (grace windows, heartbeat timeouts, call deadlines) advance
// in Tick(). The owner calls Tick() at NextDeadline(); SetWakeup() tells it
// when that may have moved earlier.
//
// Thread-safety: every public method may be called from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "coordinator/event_log.h"
#include "coordinator/membership.h"
#include "coordinator/quorum.h"
#include "coordinator/status_snapshot.h"
#include "core/mutex.h"
#include "mend/clock.h"
#include "mend/status.h"
#include "store/store_core.h"

namespace mend::coordinator {

using store::Completions;
using store::KvStoreLimits;

struct LighthouseOptions {
  std::string job_id = "mend";
  QuorumOptions quorum;
  FailSlowOptions failslow;
  Micros heartbeat_interval = 100 * kMicrosPerMilli;
  Micros heartbeat_timeout = 2000 * kMicrosPerMilli;
  // The heartbeat stream answers at least this often.
  Micros ack_interval = 500 * kMicrosPerMilli;
  // Dead and departed learners stay on the status page this long.
  Micros gone_retention = 600 * kMicrosPerSecond;
  KvStoreLimits store;
  // Rendezvous keys of rounds older than this many rounds are deleted.
  uint64_t keep_round_prefixes = 16;
  size_t event_capacity = 512;
};

struct RegisterArgs {
  std::string learner_id;
  std::string job_id;
  std::string rack;
  std::string address;
  uint64_t step = 0;
  uint64_t last_round_id = 0;
  uint32_t group_size = 1;
  std::vector<std::string> rank_addresses;  // by group rank; empty, or group_size
  // "key=value" of the keys every learner of the job must agree on, sorted
  // (SharedSettings); empty: not checked.
  std::vector<std::string> job_settings;
  // A data-plane host it gave (address, rank_addresses) that is loopback
  // ("" none), and the host the registration came from (PeerHost; "" not
  // known).
  std::string loopback_host;
  std::string peer_host;
};

struct RegisterResult {
  uint64_t session_id = 0;
  uint64_t lighthouse_instance = 0;
  Micros heartbeat_interval = 0;
  Micros heartbeat_timeout = 0;
  Micros ack_interval = 0;
};

struct HeartbeatArgs {
  std::string learner_id;
  uint64_t session_id = 0;
  uint64_t step = 0;
  uint64_t tokens_total = 0;
  uint64_t tokens_since_last_round = 0;
  std::vector<double> step_ms;
};

struct HeartbeatResult {
  bool slow = false;
  double slow_zscore = 0;
  uint64_t latest_round_id = 0;
  uint64_t latest_round_step = 0;  // its members' largest step; 0 unless `waiting`
  bool waiting = false;            // the learner has a join pending
  // `waiting`, and fewer learners alive than the quorum's minimum, once this
  // instance has been up for a heartbeat timeout (every live learner has
  // had time to reach it): that join cannot form a round for now.
  bool short_of_quorum = false;
};

struct QuorumArgs {
  std::string learner_id;
  uint64_t session_id = 0;
  uint64_t last_round_id = 0;
  uint64_t step = 0;
  uint64_t tokens_since_last_round = 0;
  Micros timeout = 0;
  bool give_up_short_of_quorum = false;  // QuorumRequest's
};

class LighthouseCore {
 public:
  LighthouseCore(LighthouseOptions options, const Clock* clock, uint64_t instance_id);

  LighthouseCore(const LighthouseCore&) = delete;
  LighthouseCore& operator=(const LighthouseCore&) = delete;

  // INVALID_ARGUMENT when job_id names another job.
  [[nodiscard]] StatusOr<RegisterResult> Register(const RegisterArgs& args);
  // NOT_FOUND for an unknown learner, ALREADY_EXISTS for a superseded
  // session, FAILED_PRECONDITION for a learner that left.
  [[nodiscard]] StatusOr<HeartbeatResult> Heartbeat(const HeartbeatArgs& args);
  [[nodiscard]] Status Leave(const std::string& learner_id, uint64_t session_id,
                             const std::string& reason);
  // The learner whose current session is `session_id` (not left);
  // ALREADY_EXISTS for a session a newer registration replaced, NOT_FOUND for
  // any other.
  StatusOr<std::string> SessionLearner(uint64_t session_id);
  // Removes from `sessions` those SessionLearner would find (one lock for all).
  void KeepEndedSessions(std::vector<uint64_t>& sessions);

  // Joins the next round. `done` gets the assignment, or DEADLINE_EXCEEDED
  // after args.timeout, or ABORTED when the learner is replaced, leaves or is
  // declared dead, or CANCELLED by CancelQuorum. Returns the waiter id.
  uint64_t Quorum(const QuorumArgs& args, QuorumCallback done);
  void CancelQuorum(const std::string& learner_id, uint64_t waiter_id);

  // The rendezvous store (the gRPC store service answers over it).
  store::StoreCore& store() { return store_; }

  // Advances the time-based rules to the clock's now.
  void Tick();
  // When Tick() next has something to do (INT64_MAX: nothing scheduled).
  Micros NextDeadline();
  // `wakeup` is called, without the mutex, when NextDeadline may have moved
  // earlier. Set once, before any other call.
  void SetWakeup(std::function<void()> wakeup) {
    wakeup_ = wakeup;
    store_.SetWakeup(std::move(wakeup));
  }
  // Records a refused call (bad token, bad request) in the events and counters.
  void RecordRejection(std::string_view code, std::string_view peer, std::string_view why);

  StatusSnapshot Snapshot(size_t max_learners, size_t max_rounds);
  // Learner records visited by scans and round closes so far (see
  // Membership::records_visited): what tests use to keep joins and heartbeats O(1).
  uint64_t RecordsVisited();
  uint64_t instance_id() const { return instance_id_; }
  const LighthouseOptions& options() const { return options_; }
  const Clock* clock() const { return clock_; }

 private:
  void Finish(Completions& completions);
  void MaybeCloseLocked(Micros now, Completions* completions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `record`'s join of a round, pending (Quorum); returns its waiter id.
  uint64_t AddJoinLocked(LearnerRecord& record, const QuorumArgs& args, Micros now,
                         QuorumCallback done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives every alive learner a fresh heartbeat timeout after a gap in the
  // lighthouse's own ticks (lighthouse_core.cc says when).
  void NoticeStallLocked(Micros now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `args`'s learner may join the job: its group size and shared
  // settings are the alive learners' (or, with none alive, become the
  // job's), and a loopback data-plane host only while all run on one host.
  // `previous`: its record from an earlier registration, if any.
  Status AdmitLocked(const RegisterArgs& args, const LearnerRecord* previous)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Refuses the alive learners on other hosts than `record`'s that gave a
  // loopback data-plane host: they could connect in no round with it.
  void RefuseStrandedLocked(const LearnerRecord& record, Micros now, Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends what a learner registering again leaves of its old session: the
  // join it `replaced` (ABORTED) and the rounds it was a member of.
  void EndOldSessionLocked(const std::string& learner_id, std::optional<PendingJoin> replaced,
                           const std::vector<uint64_t>& old_rounds, Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops what others reported they could not reach of `learner_id` (a new
  // process of it registered).
  void ForgiveLocked(const std::string& learner_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An alive learner other than `except` registered from another host than
  // `host` (with `loopback_only`, one that gave a loopback data-plane
  // host); nullptr when none or `host` is not known.
  const LearnerRecord* AliveOnAnotherHostLocked(const std::string& host, const std::string& except,
                                                bool loopback_only) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why a learner with a loopback data-plane host cannot be in a job with
  // `other`, a learner on another host.
  static std::string LoopbackRefusal(const std::string& learner_id, const std::string& peer_host,
                                     const std::string& loopback_host, const LearnerRecord& other);
  void ScanLivenessLocked(Micros now, Completions* completions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the synchronous joins (give_up_short_of_quorum) that no round can
  // answer: a learner of the job is gone and fewer are alive than the
  // quorum's minimum, for a heartbeat timeout since each joined.
  void GiveUpShortJoinsLocked(Micros now, Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ScanFailSlowLocked(Micros now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Micros NextDeadlineLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells the members of round `round_id` (0: none) that it cannot
  // complete, through the key <round prefix>abort in the store, which their
  // rendezvous watches: a member died or restarted after the round closed.
  std::vector<uint64_t> MemberRoundsLocked(const LearnerRecord& record) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AbortRoundLocked(uint64_t round_id, const std::string& why, Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Completes `record`'s pending join, if any, with `status`; true if there was one.
  bool AbortJoinLocked(LearnerRecord& record, Status status, Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string QuorumShortfallLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads (once) which members `record` could not connect to in its recent
  // rounds (core/round_keys.h), and leaves out of the next rounds a learner
  // that two or more others could not reach, more than any other.
  void LogRoundLocked(const Round& round) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NoteUnreachableLocked(const LearnerRecord& record, Micros now, Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LeaveOutLocked(LearnerRecord& record, const std::vector<std::string>& reporters, Micros now,
                      Completions* completions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Lets a learner left out back in once its rounds have closed without it.
  void LetBackInLocked(Micros now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReinstateLocked(LearnerRecord& record, Micros now, std::string_view why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // At the join of `record`, left out: it is let back in at once when the
  // others (alive, not left out) cannot form a round without it but can
  // with it.
  void ReinstateIfNeededLocked(LearnerRecord& record, Micros now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // membership_.Find, and NOT_FOUND ("register again") for a learner
  // registered under an earlier job configuration (job_epoch_): one that was
  // dead while a learner of another group size or settings started the job
  // anew comes back through Register, which checks it.
  StatusOr<LearnerRecord*> FindCurrentLocked(const std::string& learner_id, uint64_t session_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const LighthouseOptions options_;
  const Clock* const clock_;  // not owned; outlives this
  const uint64_t instance_id_;
  const Micros started_at_;
  std::function<void()> wakeup_;
  store::StoreCore store_;  // locked after mu_ where both are

  Mutex mu_;
  Membership membership_ ABSL_GUARDED_BY(mu_);
  QuorumMachine quorum_ ABSL_GUARDED_BY(mu_);
  EventLog events_ ABSL_GUARDED_BY(mu_);
  Micros next_liveness_scan_ ABSL_GUARDED_BY(mu_) = 0;
  Micros last_tick_ ABSL_GUARDED_BY(mu_) = 0;
  // Rounds up to this id closed before the alive learners registered (the
  // last time one registered with no other alive): not news to them.
  uint64_t news_after_round_ ABSL_GUARDED_BY(mu_) = 0;
  Micros next_failslow_scan_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_waiter_id_ ABSL_GUARDED_BY(mu_) = 1;
  Counters counters_ ABSL_GUARDED_BY(mu_);
  Micros last_rejection_event_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t suppressed_rejections_ ABSL_GUARDED_BY(mu_) = 0;
  // The job's ranks per learner, and who registered first with it.
  uint32_t group_size_ ABSL_GUARDED_BY(mu_) = 1;
  std::string group_size_set_by_ ABSL_GUARDED_BY(mu_);
  // The settings of the alive learners (RegisterArgs::job_settings), and the
  // first of them to register since none was alive.
  std::vector<std::string> job_settings_ ABSL_GUARDED_BY(mu_);
  std::string job_settings_set_by_ ABSL_GUARDED_BY(mu_);
  // Counts the times the group size or the settings were set anew (no
  // learner alive); each record holds the one it registered under.
  uint64_t job_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // Learners others could not connect to, or whose pieces they could not
  // authenticate: each report in the last kSuspectRounds rounds; how often
  // each was left out (its next time out is twice as long, up to 64
  // rounds); and, while it is, the round whose close lets it back in and
  // what its joins are told.
  struct SuspectReport {
    uint64_t round_id = 0;
    std::string reporter;
    bool unauthenticated = false;  // its pieces failed authentication (else: a connect timed out)
  };
  struct Suspect {
    std::vector<SuspectReport> reports;
    uint32_t times_left_out = 0;
    uint64_t until_round = 0;  // 0: not left out
    // Reports of rounds up to this one are not counted: it was left out
    // for them already, or registered anew after them.
    uint64_t ignore_through_round = 0;
    std::string why;
  };
  std::map<std::string, Suspect> suspects_ ABSL_GUARDED_BY(mu_);
  // The job's final round, once it closed (a round at total_steps with
  // final_merge), with every learner the job had then. A learner of the job
  // that joins later without that round's state cannot form a round alone,
  // and its join ends with OUT_OF_RANGE saying the job finished (rather than
  // train a new job alone). Cleared once a round of an earlier step closes
  // (the job runs again) or a learner that was not the job's joins (a new
  // job), and with the job's settings when they are set anew.
  struct FinishedJob {
    uint64_t round_id = 0;
    uint64_t step = 0;
    std::vector<std::string> members;  // the final round's (as many as a message names)
    size_t member_count = 0;
    absl::flat_hash_set<std::string> learners;
  };
  std::optional<FinishedJob> finished_ ABSL_GUARDED_BY(mu_);
  void NoteFinishedLocked(const Round& round) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What a join of `id` that may not form a round alone after the job
  // finished is told when it ends (finished_ holds the job).
  Status JobFinishedLocked(const std::string& id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

}  // namespace mend::coordinator
