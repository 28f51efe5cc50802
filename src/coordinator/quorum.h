// The quorum rules of one outer round (docs/architecture.md, "A round"):
//
//  1. A learner ready for a round joins (Quorum call) and waits.
//  2. Quorum is reached when at least K learners joined and they are at least
//     half of the learners that heartbeat (split-brain guard). From then on the
//     grace window runs: at most G more for the eligible (alive, not slow)
//     learners that have not joined yet.
//  3. The round closes at once, before the window ends, when
//       - every member of the previous round has joined ("fast_path"),
//       - or every eligible learner has joined ("all_joined"),
//       - or the window is zero ("min_quorum");
//     otherwise when the window ends ("grace").
//  4. Members are every learner with a pending join at the close, sorted by id;
//     round ids only grow, also across lighthouse restarts (a round's id is
//     above every member's reported last round).
//  5. A member whose last round is older than the newest any member holds is
//     behind, and is told which up-to-date member to heal from.
//
// The adaptive grace window is 2 x what the recent rounds needed, clamped to
// [grace_window_min_ms, grace_window_ms]. A round needed the latest arrival
// after its quorum was reached: of its members, and, for a round that closed
// by "grace", of the eligible learners it left out that joined within
// grace_window_ms after all (they would have been members with a wider
// window). "Recent" is the maximum over the last 8 rounds, so one late
// arrival widens the window at once and it shrinks back after 8 punctual rounds.
//
// Thread-safety: none; LighthouseCore serializes access under its mutex.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "coordinator/membership.h"
#include "coordinator/round.h"
#include "mend/clock.h"

namespace mend::coordinator {

struct QuorumOptions {
  std::string job_id = "mend";
  std::string incarnation;  // in the rounds' prefixes (see RendezvousPrefix)
  size_t min_learners = 2;
  Micros grace_window = 2000 * kMicrosPerMilli;
  Micros grace_window_min = 50 * kMicrosPerMilli;
  bool adaptive = true;
  bool rack_aware = false;
  // Recent rounds kept for the status page: at most this many, and at most
  // history_members member entries in all (10,000-member rounds are large).
  size_t history_size = 64;
  size_t history_members = 50'000;
};

class QuorumMachine {
 public:
  explicit QuorumMachine(QuorumOptions options);

  QuorumMachine(const QuorumMachine&) = delete;
  QuorumMachine& operator=(const QuorumMachine&) = delete;

  // Records `join` as `record`'s pending join. The record must have none.
  void AddJoin(Membership& membership, LearnerRecord& record, PendingJoin join);

  // Takes `record`'s pending join away (timeout, cancel, death, leave).
  std::optional<PendingJoin> RemoveJoin(Membership& membership, LearnerRecord& record);

  struct Closed {
    std::shared_ptr<const Round> round;
    // Each member's join with its rank, to be completed by the caller.
    std::vector<std::pair<PendingJoin, uint32_t>> joins;
  };
  // Closes a round when the rules above say so at `now`.
  std::optional<Closed> MaybeClose(Membership& membership, Micros now);

  // `record` was declared dead in or after its latest round, which may not
  // have completed for it: it is no longer taken to hold that round's state,
  // but what it reported when it joined. Otherwise, should it come back (a
  // learner stopped and continued), learners a round behind it, the round it
  // died in having failed for them, could form no round without it
  // (IncludesNewestState) until it joined again. The other members keep
  // theirs: the round may have completed for them.
  void DoubtLatestRound(Membership& membership, LearnerRecord& record) const;

  // Learners whose pending join's deadline is at or before `now`.
  std::vector<std::string> ExpiredJoins(Membership& membership, Micros now);

  // The earliest time at which MaybeClose or ExpiredJoins may change their
  // answer without any other event; INT64_MAX when none.
  Micros NextDeadline() const;

  // The job's last step when it ends with a final merge (total_steps with
  // final_merge; 0: none, or not known). A round with a join of that step
  // or later is the job's last: it waits for every learner alive and
  // reachable, slow ones too, rather than closing by the fast path, the grace window or the
  // minimum, so that every learner still training ends with the same model,
  // but at most half of that join's timeout (then "final_wait"), so that
  // the join itself does not time out.
  void set_final_step(uint64_t step) { final_step_ = step; }
  uint64_t final_step() const { return final_step_; }

  Micros grace_window() const { return grace_window_; }
  uint64_t latest_round_id() const { return next_round_id_ - 1; }
  // The newest round's step (history() always keeps it); 0 before the first.
  uint64_t latest_round_step() const { return history_.empty() ? 0 : history_.back()->step; }
  std::optional<Micros> quorum_reached_at() const { return quorum_reached_at_; }
  const std::deque<std::shared_ptr<const Round>>& history() const { return history_; }
  const QuorumOptions& options() const { return options_; }
  // The store prefix under which round `round_id` rendezvouses.
  std::string RoundPrefix(uint64_t round_id) const {
    return RendezvousPrefix(options_.job_id, options_.incarnation, round_id);
  }

 private:
  std::shared_ptr<Round> Close(Membership& membership, Micros now, std::string closed_by,
                               std::vector<std::pair<PendingJoin, uint32_t>>* joins);
  void AssignHealSources(Round& round) const;
  // The round member that `record`'s `join` makes.
  static MemberInfo MemberOf(const LearnerRecord& record, const PendingJoin& join);
  // Keeps `round` in history_, dropping the oldest past history_size rounds
  // or history_members members.
  void Remember(std::shared_ptr<Round> round);
  // A round may close only if a pending learner holds the newest global
  // state among the live learners (the highest last round id known here:
  // reported at registration and join, or the last round a learner was made
  // a member of). Otherwise learners that are all behind (e.g. one that
  // restarted from scratch) would form a round of their own, and its new id
  // would later make their state look newer than everyone else's. O(1):
  // Membership keeps the newest round id of the alive learners and of the
  // pending joins as it counts them.
  bool IncludesNewestState(const Membership& membership) const;
  struct LateWatch {
    Micros quorum_reached_at = 0;
    std::unordered_set<std::string> missing;
  };
  void RecordNeed(Micros need);
  // Call before the members' joins are taken: the eligible learners not joined.
  std::optional<LateWatch> WatchLateArrivals(const Membership& membership,
                                             const Round& round) const;

  bool IsFinal(const PendingJoin& join) const {
    return final_step_ > 0 && join.step >= final_step_;
  }

  QuorumOptions options_;
  uint64_t next_round_id_ = 1;
  uint64_t final_step_ = 0;
  // The pending joins of the job's last step, and when the round they are
  // in closes with whoever joined (the earliest such join's half timeout).
  size_t final_joins_ = 0;
  Micros final_close_at_ = INT64_MAX;
  // The pending joins with after_finished: a round of one of them alone
  // never closes (it would start a new job alone after the job finished).
  size_t after_finished_joins_ = 0;
  std::optional<Micros> quorum_reached_at_;
  Micros grace_window_;
  // What each recent round needed (newest last).
  std::deque<Micros> recent_needs_;
  // After a "grace" close: the eligible learners it left out, watched for a late join.
  std::optional<LateWatch> late_watch_;
  // Join deadlines as a min-heap, lazily deleted: an entry whose waiter is
  // gone (its round closed, or it was aborted) is skipped when it surfaces,
  // and all such entries are dropped once they outnumber the pending joins,
  // so the heap stays in proportion to the joins that are waiting.
  struct JoinDeadline {
    Micros deadline = 0;
    uint64_t session_id = 0;
    uint64_t waiter_id = 0;
    bool operator>(const JoinDeadline& other) const { return deadline > other.deadline; }
  };
  bool IsWaiting(Membership& membership, const JoinDeadline& entry) const;
  void DropStaleDeadlines(Membership& membership);
  std::vector<JoinDeadline> join_deadlines_;
  std::deque<std::shared_ptr<const Round>> history_;
  size_t history_member_count_ = 0;
};

}  // namespace mend::coordinator
