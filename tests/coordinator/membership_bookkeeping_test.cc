// Membership's running bookkeeping (the counts and the newest round ids the
// quorum rules read in O(1)) against a brute-force scan of every record,
// after each of thousands of seeded random operations: registrations and
// re-registrations, joins, cancelled joins, deaths, revivals, leaves, round
// closes, doubted rounds and forgotten records.
#include <random>
#include <string>
#include <vector>

#include "coordinator/membership.h"
#include "coordinator/quorum.h"
#include "fmt/format.h"
#include "gtest/gtest.h"

namespace mend::coordinator {
namespace {

struct Scanned {
  uint64_t newest_alive = 0;
  uint64_t newest_pending = 0;
  size_t alive = 0;
  size_t pending = 0;
  size_t eligible_missing = 0;
  size_t slow_missing = 0;
  size_t eligible = 0;
  size_t slow = 0;
  size_t previous_missing = 0;
  size_t previous_joined = 0;
};

Scanned Scan(const Membership& membership) {
  Scanned s;
  for (const auto& [id, record] : membership.records()) {
    if (record->alive) {
      s.alive++;
      if (!record->unreachable) s.newest_alive = std::max(s.newest_alive, record->last_round_id);
      if (record->eligible() && !record->join) s.eligible_missing++;
      if (record->slow && !record->unreachable && !record->join) s.slow_missing++;
      if (record->slow) s.slow++;
    }
    if (record->eligible()) s.eligible++;
    if (membership.InPreviousRound(*record))
      (record->join ? s.previous_joined : s.previous_missing)++;
    if (record->join) {
      s.pending++;
      s.newest_pending = std::max(s.newest_pending, record->join->last_round_id);
    }
  }
  return s;
}

TEST(MembershipBookkeepingTest, RunningCountsMatchAScanAfterEveryRandomOperation) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(fmt::format("seed {}", seed));
    std::mt19937_64 random(seed);
    Membership membership(FailSlowOptions{});
    QuorumOptions options;
    options.min_learners = 2;
    options.grace_window = 0;  // rounds close as soon as the rules allow
    QuorumMachine quorum(options);
    std::vector<std::string> ids;
    for (int i = 0; i < 12; ++i) ids.push_back(fmt::format("learner-{}", i));
    uint64_t session = 1;
    uint64_t waiter = 1;
    Micros now = 0;
    for (int op = 0; op < 4000; ++op) {
      now += 1000;
      const std::string& id = ids[random() % ids.size()];
      LearnerRecord* record = membership.FindAny(id);
      switch (random() % 9) {
        case 0: {  // (re-)registration, reporting some last round
          std::optional<PendingJoin> replaced;
          uint64_t last =
              quorum.latest_round_id() > 0 ? random() % (quorum.latest_round_id() + 1) : 0;
          membership.Register(id, session++, "", "", 0, last, now, &replaced);
          break;
        }
        case 1:
        case 2: {  // a join, reporting the record's round or an older one
          if (!record || record->join || record->left) break;
          if (!record->alive) membership.RecordHeartbeat(*record, now, 0, 0, 0, {});
          PendingJoin join;
          join.waiter_id = waiter++;
          join.last_round_id = random() % 4 == 0 && record->last_round_id > 0
                                   ? record->last_round_id - 1
                                   : record->last_round_id;
          join.joined_at = now;
          join.deadline = now + 1'000'000;
          quorum.AddJoin(membership, *record, std::move(join));
          break;
        }
        case 3:  // a cancelled or timed-out join
          if (record) quorum.RemoveJoin(membership, *record);
          break;
        case 4:  // declared dead (its join aborted first), doubting its round
          if (record && record->alive) {
            quorum.RemoveJoin(membership, *record);
            quorum.DoubtLatestRound(membership, *record);
            membership.MarkGone(*record, now, random() % 4 == 0);
          }
          break;
        case 5:  // a heartbeat (revives a dead learner)
          if (record && !record->left) membership.RecordHeartbeat(*record, now, 0, 0, 0, {50.0});
          break;
        case 6:
          membership.ForgetGone(now, 5000);
          break;
        case 7:  // flagged slow or unreachable, or no longer (as the scans do)
          if (record && record->alive) {
            const bool slow = random() % 2 == 0;
            membership.Mutate(*record, [slow](LearnerRecord& r) {
              (slow ? r.slow : r.unreachable) = !(slow ? r.slow : r.unreachable);
            });
          }
          break;
        default:
          break;
      }
      quorum.MaybeClose(membership, now);  // closes whatever the rules allow
      const Scanned scanned = Scan(membership);
      ASSERT_EQ(membership.newest_alive_round(), scanned.newest_alive) << "after operation " << op;
      ASSERT_EQ(membership.newest_pending_round(), scanned.newest_pending)
          << "after operation " << op;
      ASSERT_EQ(membership.counts().alive, scanned.alive) << "after operation " << op;
      ASSERT_EQ(membership.counts().pending, scanned.pending) << "after operation " << op;
      ASSERT_EQ(membership.counts().eligible_missing, scanned.eligible_missing)
          << "after operation " << op;
      ASSERT_EQ(membership.counts().slow_missing, scanned.slow_missing) << "after operation " << op;
      ASSERT_EQ(membership.counts().eligible, scanned.eligible) << "after operation " << op;
      ASSERT_EQ(membership.counts().slow, scanned.slow) << "after operation " << op;
      ASSERT_EQ(membership.counts().previous_missing, scanned.previous_missing)
          << "after operation " << op;
      ASSERT_EQ(membership.counts().previous_joined, scanned.previous_joined)
          << "after operation " << op;
    }
    EXPECT_GT(quorum.latest_round_id(), 20u);  // the walk formed rounds, not just joins
  }
}

}  // namespace
}  // namespace mend::coordinator
