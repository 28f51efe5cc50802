// The quorum rules (docs/architecture.md, "A round"), each against a fake clock.
#include "coordinator/core_harness.h"
#include "core/round_keys.h"
#include "fmt/format.h"
#include "gmock/gmock.h"

namespace mend::coordinator {
namespace {

using testing::CoreHarness;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(QuorumRulesTest, AllJoinedClosesAtOnceWithSortedMembersAndRanks) {
  CoreHarness h(CoreHarness::Options(2, 5000));
  for (const char* id : {"c", "a", "b"}) h.Register(id);
  auto c = h.Join("c");
  auto a = h.Join("a");
  EXPECT_FALSE(a->done());
  auto b = h.Join("b");
  ASSERT_TRUE(a->ok() && b->ok() && c->ok());
  EXPECT_EQ(a->round().closed_by, "all_joined");
  EXPECT_THAT(CoreHarness::MemberIds(a->round()), ElementsAre("a", "b", "c"));
  EXPECT_EQ(a->rank(), 0u);
  EXPECT_EQ(b->rank(), 1u);
  EXPECT_EQ(c->rank(), 2u);
  EXPECT_EQ(a->round().id, 1u);
  EXPECT_EQ(a->round().rendezvous_prefix,
            "job/round/0000000000000007/1/");  // the harness core is instance 7
  EXPECT_EQ(&a->round(), &c->round());         // one shared decision
}

TEST(QuorumRulesTest, GraceWindowClosesWithoutTheMissingLearner) {
  CoreHarness h(CoreHarness::Options(2, 1000));
  for (const char* id : {"a", "b", "c"}) h.Register(id);
  auto a = h.Join("a");
  auto b = h.Join("b");
  h.HeartbeatAll({"a", "b", "c"});
  h.AdvanceMs(999);
  EXPECT_FALSE(a->done());
  h.AdvanceMs(1);
  ASSERT_TRUE(a->ok());
  EXPECT_EQ(a->round().closed_by, "grace");
  EXPECT_THAT(CoreHarness::MemberIds(a->round()), ElementsAre("a", "b"));
  EXPECT_EQ(a->round().waited(), 1000 * kMicrosPerMilli);
}

TEST(QuorumRulesTest, LateJoinerWithinGraceWindowIsIncluded) {
  CoreHarness h(CoreHarness::Options(2, 1000));
  for (const char* id : {"a", "b", "c"}) h.Register(id);
  auto a = h.Join("a");
  h.Join("b");
  h.AdvanceMs(600);
  auto c = h.Join("c");
  ASSERT_TRUE(c->ok());
  EXPECT_EQ(c->round().closed_by, "all_joined");
  EXPECT_EQ(c->round().members.size(), 3u);
  EXPECT_EQ(c->round().waited(), 600 * kMicrosPerMilli);
}

TEST(QuorumRulesTest, FastPathClosesWhenPreviousMembersRejoined) {
  CoreHarness h(CoreHarness::Options(2, 5000));
  h.Register("a");
  h.Register("b");
  h.Join("a");
  auto first = h.Join("b");
  ASSERT_TRUE(first->ok());
  h.Register("c");  // new learner, not in the previous round
  auto a = h.Join("a", 1);
  EXPECT_FALSE(a->done());
  auto b = h.Join("b", 1);
  ASSERT_TRUE(b->ok());
  EXPECT_EQ(b->round().closed_by, "fast_path");
  EXPECT_THAT(CoreHarness::MemberIds(b->round()), ElementsAre("a", "b"));
  EXPECT_EQ(b->round().id, 2u);
}

TEST(QuorumRulesTest, ZeroGraceWindowClosesAtMinimumQuorum) {
  CoreHarness h(CoreHarness::Options(2, 0));
  for (const char* id : {"a", "b", "c"}) h.Register(id);
  auto a = h.Join("a");
  EXPECT_FALSE(a->done());
  h.Join("b");
  ASSERT_TRUE(a->ok());
  EXPECT_EQ(a->round().closed_by, "min_quorum");
  EXPECT_EQ(a->round().members.size(), 2u);
}

TEST(QuorumRulesTest, NeverClosesBelowMinimumAndTimesOutNamingTheShortfall) {
  CoreHarness h(CoreHarness::Options(3, 100));
  for (const char* id : {"a", "b", "c"}) h.Register(id);
  auto a = h.Join("a", 0, 0, /*timeout_ms=*/800);
  auto b = h.Join("b", 0, 0, /*timeout_ms=*/5000);
  for (int i = 0; i < 7; ++i) {
    h.HeartbeatAll({"a", "b", "c"});
    h.AdvanceMs(100);
  }
  EXPECT_FALSE(a->done());
  h.AdvanceMs(100);
  ASSERT_TRUE(a->done());
  EXPECT_EQ(a->code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(a->result->status().message()), HasSubstr("2 joined, quorum needs 3"));
  EXPECT_FALSE(b->done());
}

TEST(QuorumRulesTest, SplitBrainGuardNeedsHalfOfAliveLearners) {
  CoreHarness h(CoreHarness::Options(1, 200));
  for (const char* id : {"a", "b", "c", "d"}) h.Register(id);
  auto a = h.Join("a");
  h.AdvanceMs(500);
  EXPECT_FALSE(a->done()) << "1 of 4 alive must not close a round";
  auto b = h.Join("b");
  EXPECT_FALSE(b->done());
  h.HeartbeatAll({"a", "b", "c", "d"});
  h.AdvanceMs(200);
  ASSERT_TRUE(a->ok());
  EXPECT_EQ(a->round().closed_by, "grace");
  EXPECT_EQ(a->round().members.size(), 2u);
}

TEST(QuorumRulesTest, DeadLearnerIsNotWaitedForAfterHeartbeatTimeout) {
  CoreHarness h(CoreHarness::Options(2, 60000));
  for (const char* id : {"a", "b", "c"}) h.Register(id);
  auto a = h.Join("a");
  auto b = h.Join("b");
  // c stops heartbeating; a and b keep on. Timeout is 1000 ms.
  for (int i = 0; i < 10; ++i) {
    h.HeartbeatAll({"a", "b"});
    h.AdvanceMs(100);
    EXPECT_FALSE(a->done()) << i;
  }
  h.HeartbeatAll({"a", "b"});
  h.AdvanceMs(100);
  ASSERT_TRUE(a->ok());
  EXPECT_EQ(a->round().closed_by, "all_joined");
  EXPECT_THAT(CoreHarness::MemberIds(a->round()), ElementsAre("a", "b"));
}

// Registers `ids` with a job's shared settings (SharedSettings).
void RegisterWithSettings(CoreHarness& h, std::vector<std::string> settings,
                          std::initializer_list<const char*> ids) {
  for (const char* id : ids) {
    RegisterArgs args;
    args.learner_id = id;
    args.job_settings = settings;
    ASSERT_TRUE(h.RegisterWith(args).ok()) << id;
  }
}

// Advances `ms` in steps of 100 ms, every one of `ids` heartbeating (alive).
void AdvanceAlive(CoreHarness& h, int64_t ms, const std::vector<std::string>& ids) {
  for (int64_t t = 0; t < ms; t += 100) {
    h.HeartbeatAll(ids);
    h.AdvanceMs(std::min<int64_t>(100, ms - t));
  }
}

// Quorum 1 of 2: b missed round 1 (the grace window), so round 1's members
// (a) rejoining would close the next round by the fast path. a's join at the
// job's last step (its final merge) is not closed so: it waits for b, still
// training a few steps behind, and both end with the same model. (Before, a
// merged alone and left, and b ended with a model of its own.)
TEST(QuorumRulesTest, TheJobsLastRoundWaitsForEveryLearnerStillTraining) {
  CoreHarness h(CoreHarness::Options(1, 1000));
  RegisterWithSettings(h, {"final_merge=true", "total_steps=20"}, {"a", "b"});
  auto a1 = h.Join("a", 0, 0, 60000, /*step=*/10);
  AdvanceAlive(h, 1000, {"a", "b"});
  ASSERT_TRUE(a1->ok());
  EXPECT_EQ(a1->round().closed_by, "grace");
  auto a2 = h.Join("a", a1->round().id, 0, 60000, /*step=*/20);
  AdvanceAlive(h, 20000, {"a", "b"});
  EXPECT_FALSE(a2->done());
  auto b = h.Join("b", 0, 0, 60000, /*step=*/10);
  ASSERT_TRUE(a2->ok() && b->ok());
  EXPECT_NE(a2->round().closed_by, "final_wait");  // (closed at b's join)
  EXPECT_THAT(CoreHarness::MemberIds(a2->round()), ElementsAre("a", "b"));
  EXPECT_EQ(a2->round().step, 20u);
}

// A learner flagged fail-slow is not waited for by the rounds in between,
// but the job's last round waits for it too: waiting stalls no later round,
// and left out it would end with a model of its own (a fault-free chaos
// reference run on a loaded machine ended so, its late learner refused).
TEST(QuorumRulesTest, TheJobsLastRoundWaitsForASlowLearnerToo) {
  CoreHarness h(CoreHarness::Options(2, 60000));
  RegisterWithSettings(h, {"final_merge=true", "total_steps=20"}, {"a", "b", "c"});
  ASSERT_TRUE(h.Heartbeat("a", {100, 100, 100, 100}).ok());
  ASSERT_TRUE(h.Heartbeat("b", {101, 99, 100, 102}).ok());
  ASSERT_TRUE(h.Heartbeat("c", {300, 310, 305, 300}).ok());
  h.AdvanceMs(100);  // runs the detector
  auto status = h.Heartbeat("c");
  ASSERT_TRUE(status.ok() && status->slow);
  auto a = h.Join("a", 0, 0, 60000, /*step=*/20);
  auto b = h.Join("b", 0, 0, 60000, /*step=*/20);
  AdvanceAlive(h, 20000, {"a", "b", "c"});
  EXPECT_FALSE(a->done()) << "the last round closed without the slow learner c";
  auto c = h.Join("c", 0, 0, 60000, /*step=*/20);
  ASSERT_TRUE(a->ok() && c->ok());
  EXPECT_THAT(CoreHarness::MemberIds(a->round()), ElementsAre("a", "b", "c"));
}

TEST(QuorumRulesTest, TheJobsLastRoundClosesWithWhoeverJoinedAtHalfItsJoinsTimeout) {
  CoreHarness h(CoreHarness::Options(1, 1000));
  RegisterWithSettings(h, {"final_merge=true", "total_steps=20"}, {"a", "b"});
  auto a = h.Join("a", 0, 0, /*timeout_ms=*/10000, /*step=*/20);
  AdvanceAlive(h, 4900, {"a", "b"});
  EXPECT_FALSE(a->done());
  AdvanceAlive(h, 100, {"a", "b"});
  ASSERT_TRUE(a->ok());
  EXPECT_EQ(a->round().closed_by, "final_wait");
  EXPECT_THAT(CoreHarness::MemberIds(a->round()), ElementsAre("a"));
}

// After the job's final round closed and its learners left, a learner of
// the job that joins without that round's state (restarted from scratch)
// does not start a new job alone: its join never forms a round, and ends,
// at its deadline or at once at the job's last step, with OUT_OF_RANGE
// saying the job finished. Two of them together run the job again, and a
// learner the job did not have starts a new one.
TEST(QuorumRulesTest, ALearnerOfAFinishedJobAloneWithoutItsStateIsToldTheJobFinished) {
  CoreHarness h(CoreHarness::Options(1, 1000));
  const std::vector<std::string> settings = {"final_merge=true", "total_steps=20"};
  RegisterWithSettings(h, settings, {"a", "b"});
  auto a = h.Join("a", 0, 0, 60000, /*step=*/20);
  auto b = h.Join("b", 0, 0, 60000, /*step=*/20);
  ASSERT_TRUE(a->ok() && b->ok());
  const uint64_t final_round = a->round().id;
  for (const char* id : {"a", "b"}) ASSERT_TRUE(h.core().Leave(id, h.session(id), "done").ok());
  RegisterWithSettings(h, settings, {"b"});  // restarted, with nothing of the job's state
  auto early = h.Join("b", 0, 0, /*timeout_ms=*/5000, /*step=*/5);
  AdvanceAlive(h, 4900, {"b"});
  EXPECT_FALSE(early->done()) << "a round of one learner of the finished job formed";
  AdvanceAlive(h, 200, {"b"});
  ASSERT_TRUE(early->done());
  EXPECT_EQ(early->code(), StatusCode::kOutOfRange) << early->message();
  EXPECT_THAT(
      early->message(),
      HasSubstr(fmt::format("the job finished at step 20: its final round {} closed with a, b",
                            final_round)));
  auto at_the_end = h.Join("b", 0, 0, 60000, /*step=*/20);
  ASSERT_TRUE(at_the_end->done());  // (at once: no one will ever come)
  EXPECT_EQ(at_the_end->code(), StatusCode::kOutOfRange);
  // The job's learners started together again: a round of two forms.
  RegisterWithSettings(h, settings, {"a"});
  auto a_again = h.Join("a", 0, 0, 60000, /*step=*/5);
  auto b_again = h.Join("b", 0, 0, 60000, /*step=*/5);
  ASSERT_TRUE(a_again->ok() && b_again->ok()) << a_again->message();
  EXPECT_THAT(CoreHarness::MemberIds(a_again->round()), ElementsAre("a", "b"));
}

TEST(QuorumRulesTest, ALearnerTheFinishedJobDidNotHaveStartsANewJob) {
  CoreHarness h(CoreHarness::Options(1, 1000));
  const std::vector<std::string> settings = {"final_merge=true", "total_steps=20"};
  RegisterWithSettings(h, settings, {"a"});
  ASSERT_TRUE(h.Join("a", 0, 0, 60000, /*step=*/20)->ok());
  ASSERT_TRUE(h.core().Leave("a", h.session("a"), "done").ok());
  RegisterWithSettings(h, settings, {"c"});
  auto c = h.Join("c", 0, 0, 60000, /*step=*/5);
  AdvanceAlive(h, 1000, {"c"});
  ASSERT_TRUE(c->ok()) << c->message();
  EXPECT_THAT(CoreHarness::MemberIds(c->round()), ElementsAre("c"));
}

TEST(QuorumRulesTest, WithoutAFinalMergeTheLastStepsRoundClosesAsAnyOther) {
  CoreHarness h(CoreHarness::Options(1, 1000));
  RegisterWithSettings(h, {"final_merge=false", "total_steps=20"}, {"a", "b"});
  auto a1 = h.Join("a", 0, 0, 60000, 10);
  AdvanceAlive(h, 1000, {"a", "b"});
  ASSERT_TRUE(a1->ok());
  auto a2 = h.Join("a", a1->round().id, 0, 60000, 20);
  ASSERT_TRUE(a2->ok());
  EXPECT_EQ(a2->round().closed_by, "fast_path");
}

TEST(QuorumRulesTest, DeadPreviousMemberTurnsFastPathIntoAllJoined) {
  CoreHarness h(CoreHarness::Options(2, 60000));
  for (const char* id : {"a", "b", "c"}) h.Register(id);
  h.Join("a");
  h.Join("b");
  ASSERT_TRUE(h.Join("c")->ok());
  auto a = h.Join("a", 1);
  h.Join("b", 1);
  EXPECT_FALSE(a->done()) << "c, a previous member, is still alive";
  for (int i = 0; i < 11; ++i) {
    h.HeartbeatAll({"a", "b"});
    h.AdvanceMs(100);
  }
  ASSERT_TRUE(a->ok());
  EXPECT_EQ(a->round().closed_by, "all_joined");
  // The next round has a and b as previous members: fast path again.
  h.Join("a", 2);
  auto b = h.Join("b", 2);
  ASSERT_TRUE(b->ok());
  EXPECT_EQ(b->round().closed_by, "fast_path");
}

TEST(QuorumRulesTest, DeadLearnersPendingJoinIsAbortedAndNotAMember) {
  CoreHarness h(CoreHarness::Options(2, 60000));
  for (const char* id : {"a", "b", "c"}) h.Register(id);
  auto c = h.Join("c");
  for (int i = 0; i < 11; ++i) {
    h.HeartbeatAll({"a", "b"});
    h.AdvanceMs(100);
  }
  ASSERT_TRUE(c->done());
  EXPECT_EQ(c->code(), StatusCode::kAborted);
  EXPECT_THAT(std::string(c->result->status().message()), HasSubstr("declared dead"));
  auto a = h.Join("a");
  auto b = h.Join("b");
  ASSERT_TRUE(a->ok());
  EXPECT_THAT(CoreHarness::MemberIds(a->round()), ElementsAre("a", "b"));
}

TEST(QuorumRulesTest, SlowLearnerIsNotWaitedFor) {
  CoreHarness h(CoreHarness::Options(2, 60000));
  for (const char* id : {"a", "b", "c"}) h.Register(id);
  ASSERT_TRUE(h.Heartbeat("a", {100, 100, 100, 100}).ok());
  ASSERT_TRUE(h.Heartbeat("b", {101, 99, 100, 102}).ok());
  ASSERT_TRUE(h.Heartbeat("c", {300, 310, 305, 300}).ok());
  h.AdvanceMs(100);  // runs the detector
  auto status = h.Heartbeat("c");
  ASSERT_TRUE(status.ok());
  EXPECT_TRUE(status->slow);
  EXPECT_GT(status->slow_zscore, 3.5);
  auto a = h.Join("a");
  auto b = h.Join("b");
  ASSERT_TRUE(a->ok());
  EXPECT_EQ(a->round().closed_by, "all_joined");
  EXPECT_THAT(CoreHarness::MemberIds(a->round()), ElementsAre("a", "b"));
}

TEST(QuorumRulesTest, SlowLearnerThatJoinedIsStillAMember) {
  CoreHarness h(CoreHarness::Options(2, 60000));
  for (const char* id : {"a", "b", "c"}) h.Register(id);
  ASSERT_TRUE(h.Heartbeat("a", {100, 100, 100, 100}).ok());
  ASSERT_TRUE(h.Heartbeat("b", {100, 100, 100, 100}).ok());
  ASSERT_TRUE(h.Heartbeat("c", {300, 300, 300, 300}).ok());
  h.AdvanceMs(100);
  auto c = h.Join("c");
  h.Join("a");
  h.Join("b");
  ASSERT_TRUE(c->ok());
  EXPECT_EQ(c->round().members.size(), 3u);
}

TEST(QuorumRulesTest, RoundIdsGrowPastEveryMembersLastRound) {
  CoreHarness h(CoreHarness::Options(2, 5000));
  h.Register("a");
  h.Register("b");
  h.Join("a", 41);  // e.g. after a lighthouse restart
  auto b = h.Join("b", 40);
  ASSERT_TRUE(b->ok());
  EXPECT_EQ(b->round().id, 42u);
  EXPECT_EQ(b->round().heal_round_id, 41u);
  h.Join("a", 42);
  auto next = h.Join("b", 42);
  ASSERT_TRUE(next->ok());
  EXPECT_EQ(next->round().id, 43u);
}

TEST(QuorumRulesTest, BehindMemberIsToldWhomToHealFrom) {
  CoreHarness h(CoreHarness::Options(2, 5000));
  for (const char* id : {"a", "b", "c", "d"}) h.Register(id);
  h.Join("a", 5);
  h.Join("b", 5);
  h.Join("c", 0);
  auto d = h.Join("d", 3);
  ASSERT_TRUE(d->ok());
  const Round& round = d->round();
  EXPECT_EQ(round.heal_round_id, 5u);
  EXPECT_EQ(round.members[0].heal_from, "");
  EXPECT_EQ(round.members[1].heal_from, "");
  EXPECT_EQ(round.members[2].heal_from, "a");  // round-robin over a, b
  EXPECT_EQ(round.members[3].heal_from, "b");
  EXPECT_THAT(round.heal_to.at("a"), ElementsAre("c"));
  EXPECT_THAT(round.heal_to.at("b"), ElementsAre("d"));
}

TEST(QuorumRulesTest, LearnersThatAreAllBehindWaitForOneWithTheNewestState) {
  // Minimum quorum 1. Round 1 has a and b; then b restarts from scratch and
  // joins alone. It must not form a round of its own (its new round id would
  // make its fresh state look newer than a's): it waits for a, and heals.
  CoreHarness h(CoreHarness::Options(1, 1000));
  h.Register("a");
  h.Register("b");
  h.Join("a");
  auto first = h.Join("b");
  ASSERT_TRUE(first->ok());
  const uint64_t round1 = first->round().id;
  h.Register("b");  // restarted: last round 0
  auto b = h.Join("b", 0);
  for (int i = 0; i < 50; ++i) {  // 5 s, both alive, far past the 1 s grace window
    h.HeartbeatAll({"a", "b"});
    h.AdvanceMs(100);
  }
  EXPECT_FALSE(b->done()) << "b formed a round without the newest state";
  auto a = h.Join("a", round1);
  ASSERT_TRUE(b->ok());
  EXPECT_THAT(CoreHarness::MemberIds(b->round()), ElementsAre("a", "b"));
  EXPECT_EQ(b->round().heal_round_id, round1);
  EXPECT_EQ(b->round().members[1].heal_from, "a");
}

TEST(QuorumRulesTest, BehindLearnersGoOnOnceTheNewestStateIsDead) {
  CoreHarness h(CoreHarness::Options(1, 1000));
  h.Register("a");
  h.Register("b");
  h.Join("a");
  ASSERT_TRUE(h.Join("b")->ok());
  h.Register("b");
  auto b = h.Join("b", 0);
  // a stops heartbeating: once it is dead, b is the newest that is alive.
  for (int i = 0; i < 40 && !b->done(); ++i) {
    h.HeartbeatAll({"b"});
    h.AdvanceMs(100);
  }
  ASSERT_TRUE(b->ok());
  EXPECT_THAT(CoreHarness::MemberIds(b->round()), ElementsAre("b"));
}

TEST(QuorumRulesTest, RoundIsCalledOffWhenAMemberDiesOrRestartsAfterItClosed) {
  CoreHarness h(CoreHarness::Options(2, 1000));
  for (const char* id : {"a", "b", "c"}) h.Register(id);
  h.Join("a");
  h.Join("b");
  auto c = h.Join("c");
  ASSERT_TRUE(c->ok());
  const std::string abort_key = c->round().rendezvous_prefix + kRoundAbortKey;
  EXPECT_FALSE(h.core().store().Get(abort_key).has_value());
  // c dies before the members have met: its round is called off, naming it.
  for (int i = 0; i < 12; ++i) {
    h.HeartbeatAll({"a", "b"});
    h.AdvanceMs(100);
  }
  auto why = h.core().store().Get(abort_key);
  ASSERT_TRUE(why.has_value());
  EXPECT_THAT(*why, HasSubstr("learner 'c' declared dead"));
  // A member that registers again (a new process) calls its round off too.
  h.Join("a", c->round().id);
  auto next = h.Join("b", c->round().id);
  ASSERT_TRUE(next->ok());
  const std::string next_key = next->round().rendezvous_prefix + kRoundAbortKey;
  h.Register("b");
  why = h.core().store().Get(next_key);
  ASSERT_TRUE(why.has_value());
  EXPECT_THAT(*why, HasSubstr("learner 'b' restarted"));
}

TEST(QuorumRulesTest, FreshStartHasNobodyBehind) {
  CoreHarness h(CoreHarness::Options(2, 5000));
  h.Register("a");
  h.Register("b");
  h.Join("a");
  auto b = h.Join("b");
  ASSERT_TRUE(b->ok());
  EXPECT_TRUE(b->round().heal_to.empty());
}

TEST(QuorumRulesTest, RackAwareHealPrefersSameRack) {
  auto options = CoreHarness::Options(2, 5000);
  options.quorum.rack_aware = true;
  CoreHarness h(options);
  h.Register("a", "r1");
  h.Register("b", "r2");
  h.Register("c", "r2");
  h.Join("a", 7);
  h.Join("b", 7);
  auto c = h.Join("c", 2);
  ASSERT_TRUE(c->ok());
  EXPECT_EQ(c->round().members[2].heal_from, "b");
}

TEST(QuorumRulesTest, TokensAreSummedForTheWeightedMerge) {
  CoreHarness h(CoreHarness::Options(2, 5000));
  h.Register("a");
  h.Register("b");
  h.Join("a", 0, 3000);
  auto b = h.Join("b", 0, 1000);
  ASSERT_TRUE(b->ok());
  EXPECT_EQ(b->round().total_tokens, 4000u);
  EXPECT_EQ(b->round().members[0].tokens_since_last_round, 3000u);
}

double GraceWindowMs(CoreHarness& h) { return h.core().Snapshot(0, 0).grace_window_ms; }

TEST(QuorumRulesTest, AdaptiveGraceWindowFollowsWhatRecentRoundsNeeded) {
  auto options = CoreHarness::Options(2, 4000, /*adaptive=*/true);
  options.quorum.grace_window_min = 50 * kMicrosPerMilli;
  CoreHarness h(options);
  for (const char* id : {"a", "b", "c"}) h.Register(id);
  EXPECT_EQ(GraceWindowMs(h), 4000);
  auto tick = [&](int times) {
    for (int i = 0; i < times; ++i) {
      h.HeartbeatAll({"a", "b", "c"});
      h.AdvanceMs(50);
    }
  };
  // c arrives 100 ms after the quorum is reached: the window becomes 2 x 100 ms.
  uint64_t round = 0;
  for (int i = 0; i < 3; ++i) {
    h.Join("a", round);
    h.Join("b", round);
    tick(2);
    auto c = h.Join("c", round);
    ASSERT_TRUE(c->ok()) << i;
    EXPECT_EQ(c->round().members.size(), 3u);
    round = c->round().id;
  }
  EXPECT_EQ(GraceWindowMs(h), 200);

  // c is now 300 ms late: the round closes by grace at 200 ms without it, and
  // its late arrival widens the window to 600 ms at once.
  auto a = h.Join("a", round);
  h.Join("b", round);
  tick(4);
  ASSERT_TRUE(a->ok());
  EXPECT_EQ(a->round().closed_by, "grace");
  EXPECT_EQ(a->round().members.size(), 2u);
  uint64_t round_a = a->round().id;
  tick(2);
  auto late_c = h.Join("c", round);
  EXPECT_EQ(GraceWindowMs(h), 600);
  // Next round: c was already waiting; a and b complete the fast path.
  h.Join("a", round_a);
  auto b = h.Join("b", round_a);
  ASSERT_TRUE(b->ok() && late_c->ok());
  EXPECT_EQ(b->round().closed_by, "fast_path");
  EXPECT_EQ(b->round().members.size(), 3u);
  round = b->round().id;
  // With the wider window a 300 ms late c is a member again.
  a = h.Join("a", round);
  h.Join("b", round);
  tick(6);
  auto c = h.Join("c", round);
  ASSERT_TRUE(c->ok());
  EXPECT_EQ(c->round().members.size(), 3u);
  EXPECT_EQ(c->round().waited(), 300 * kMicrosPerMilli);
  round = c->round().id;

  // Eight punctual rounds and the window shrinks to its floor.
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(GraceWindowMs(h), 600) << i;
    h.Join("a", round);
    h.Join("b", round);
    auto punctual = h.Join("c", round);
    ASSERT_TRUE(punctual->ok());
    round = punctual->round().id;
  }
  EXPECT_EQ(GraceWindowMs(h), 50);
}

TEST(QuorumRulesTest, AdaptiveGraceWindowNeverExceedsConfiguredCap) {
  auto options = CoreHarness::Options(2, 300, /*adaptive=*/true);
  CoreHarness h(options);
  for (const char* id : {"a", "b", "c"}) h.Register(id);
  uint64_t round = 0;
  for (int i = 0; i < 5; ++i) {
    auto a = h.Join("a", round);
    h.Join("b", round);
    while (!a->done()) {
      h.HeartbeatAll({"a", "b", "c"});
      h.AdvanceMs(50);
    }
    round = a->round().id;
    EXPECT_LE(a->round().grace_window, 300 * kMicrosPerMilli);
  }
}

TEST(QuorumRulesTest, LeavingLearnerIsNotWaitedFor) {
  CoreHarness h(CoreHarness::Options(2, 60000));
  for (const char* id : {"a", "b", "c"}) h.Register(id);
  auto a = h.Join("a");
  h.Join("b");
  EXPECT_FALSE(a->done());
  ASSERT_TRUE(h.core().Leave("c", h.session("c"), "done training").ok());
  ASSERT_TRUE(a->ok());
  EXPECT_EQ(a->round().closed_by, "all_joined");
}

TEST(QuorumRulesTest, CancelledJoinIsNotAMember) {
  CoreHarness h(CoreHarness::Options(2, 60000));
  for (const char* id : {"a", "b", "c"}) h.Register(id);
  auto a = h.Join("a");
  auto c = h.Join("c");
  h.core().CancelQuorum("c", c->waiter_id);
  EXPECT_EQ(c->code(), StatusCode::kCancelled);
  auto b = h.Join("b");
  EXPECT_FALSE(b->done());
  auto c2 = h.Join("c");
  ASSERT_TRUE(c2->ok());
  EXPECT_EQ(c2->round().members.size(), 3u);
}

TEST(QuorumRulesTest, SecondJoinReplacesTheFirst) {
  CoreHarness h(CoreHarness::Options(2, 60000));
  h.Register("a");
  h.Register("b");
  auto first = h.Join("a");
  auto second = h.Join("a");
  ASSERT_TRUE(first->done());
  EXPECT_EQ(first->code(), StatusCode::kAborted);
  EXPECT_FALSE(second->done());
  h.Join("b");
  EXPECT_TRUE(second->ok());
}

}  // namespace
}  // namespace mend::coordinator
