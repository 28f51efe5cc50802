// The lighthouse's cost at scale, guarded by counting work instead of timing
// it: 2,000 simulated learners against LighthouseCore on a fake clock. A rule
// that scans the learner table on every join (as the newest-state close rule
// once did) turns a round into O(n^2) work and, at 10,000 learners, holds
// rounds until the grace window ends; this test fails on either.
#include <string>
#include <vector>

#include "coordinator/core_harness.h"
#include "core/status_format.h"
#include "fmt/format.h"
#include "gtest/gtest.h"

namespace mend::coordinator {
namespace {

using testing::CoreHarness;
using testing::JoinOutcome;

constexpr size_t kLearners = 2000;
constexpr int kRounds = 4;
// Records a join or a heartbeat that does not close a round may visit: a
// constant, whatever the number of learners (today it is 0).
constexpr uint64_t kPerCallVisits = 8;

TEST(LighthouseScaleTest, TwoThousandLearnersCloseEveryRoundWhenAllJoinedWithO1Joins) {
  LighthouseOptions options = CoreHarness::Options(2, 2000, /*adaptive=*/true);
  options.quorum.grace_window_min = 200 * kMicrosPerMilli;
  CoreHarness h(options);
  std::vector<std::string> ids;
  for (size_t i = 0; i < kLearners; ++i) {
    ids.push_back(fmt::format("learner-{:05d}", i));
    h.Register(ids.back());
  }
  LighthouseCore& core = h.core();
  uint64_t last_round = 0;
  for (int round = 1; round <= kRounds; ++round) {
    SCOPED_TRACE(fmt::format("round {}", round));
    std::vector<std::shared_ptr<JoinOutcome>> outcomes;
    uint64_t max_join_visits = 0;
    uint64_t max_heartbeat_visits = 0;
    uint64_t closing_join_visits = 0;
    for (size_t i = 0; i < kLearners; ++i) {
      // Joins arrive over 100 ms of fake time, well inside the grace window;
      // AdvanceMs runs the periodic scans, which are not counted against a call.
      if (i % 20 == 0) h.AdvanceMs(1);
      uint64_t before = core.RecordsVisited();
      outcomes.push_back(
          h.Join(ids[i], last_round, 1024, 60000, 10 * static_cast<uint64_t>(round)));
      uint64_t visits = core.RecordsVisited() - before;
      if (i + 1 < kLearners) {
        ASSERT_FALSE(outcomes.back()->done()) << "closed before " << ids.back() << " joined";
        max_join_visits = std::max(max_join_visits, visits);
      } else {
        closing_join_visits = visits;
      }
      // A heartbeat from a learner that is waiting (or, on the last join, done).
      const std::string& beating = ids[(i * 7919) % kLearners];
      before = core.RecordsVisited();
      ASSERT_TRUE(h.Heartbeat(beating, {50.0}).ok());
      max_heartbeat_visits = std::max(max_heartbeat_visits, core.RecordsVisited() - before);
    }
    for (const auto& outcome : outcomes) ASSERT_TRUE(outcome->ok());
    const Round& closed = outcomes.front()->round();
    EXPECT_EQ(closed.members.size(), kLearners);
    EXPECT_EQ(closed.closed_by, round == 1 ? "all_joined" : "fast_path");
    for (const auto& outcome : outcomes) EXPECT_EQ(&outcome->round(), &closed);
    EXPECT_LE(max_join_visits, kPerCallVisits);
    EXPECT_LE(max_heartbeat_visits, kPerCallVisits);
    // Closing takes each member once (and the bookkeeping around it), not
    // every learner once per member.
    EXPECT_LE(closing_join_visits, 2 * kLearners);
    last_round = closed.id;
  }
  StatusSnapshot snapshot = core.Snapshot(0, kRounds);
  EXPECT_EQ(snapshot.counters.rounds_by_closed_by["all_joined"], 1u);
  EXPECT_EQ(snapshot.counters.rounds_by_closed_by["fast_path"], static_cast<uint64_t>(kRounds - 1));
  EXPECT_EQ(snapshot.counters.rounds_by_closed_by.count("grace"), 0u);
}

// The O(1) bookkeeping keeps the rule it replaced: with 2,000 learners a
// round of learners that are all behind still waits for the one holding the
// newest state, and closes as soon as it joins.
TEST(LighthouseScaleTest, NewestStateRuleHoldsAtScale) {
  CoreHarness h(CoreHarness::Options(2, 2000));
  std::vector<std::string> ids;
  for (size_t i = 0; i < kLearners; ++i) {
    ids.push_back(fmt::format("learner-{:05d}", i));
    // learner-00000 restarted holding round 5; the others are fresh.
    h.Register(ids.back(), "", i == 0 ? 5 : 0);
  }
  std::vector<std::shared_ptr<JoinOutcome>> outcomes;
  for (size_t i = 1; i < kLearners; ++i) outcomes.push_back(h.Join(ids[i]));
  for (int i = 0; i < 4; ++i) {  // 2 s, past the grace window; all stay alive
    h.AdvanceMs(500);
    h.HeartbeatAll(ids);
  }
  EXPECT_FALSE(outcomes.front()->done());
  auto holder = h.Join(ids[0], 5);
  ASSERT_TRUE(holder->ok());
  EXPECT_EQ(holder->round().members.size(), kLearners);
  EXPECT_EQ(holder->round().heal_round_id, 5u);
  EXPECT_EQ(holder->round().id, 6u);
  EXPECT_EQ(holder->round().closed_by, "all_joined");
}

}  // namespace
}  // namespace mend::coordinator
