// Sessions, liveness, fail-slow flags, the store through the core, and what
// the status renderers make of it.
#include <map>

#include "coordinator/core_harness.h"
#include "coordinator/status_snapshot.h"
#include "core/round_keys.h"
#include "gmock/gmock.h"
#include "mend/lighthouse_client.h"
#include "nlohmann/json.hpp"
#include "wire/protocol_rules.h"

namespace mend::coordinator {
namespace {

using testing::CoreHarness;
using ::testing::HasSubstr;
using testing::JoinOutcome;

std::vector<std::string> EventKinds(LighthouseCore& core, const std::string& learner) {
  std::vector<std::string> kinds;
  for (const auto& e : core.Snapshot(100, 100).events) {
    if (e.learner_id == learner) kinds.push_back(e.kind);
  }
  return kinds;
}

TEST(LighthouseCoreTest, UnknownLearnerMustRegisterAndStaleSessionIsRefused) {
  CoreHarness h(CoreHarness::Options(2, 1000));
  HeartbeatArgs args;
  args.learner_id = "ghost";
  EXPECT_EQ(h.core().Heartbeat(args).status().code(), StatusCode::kNotFound);
  uint64_t first = h.Register("a");
  uint64_t second = h.Register("a");
  EXPECT_NE(first, second);
  args.learner_id = "a";
  args.session_id = first;
  auto stale = h.core().Heartbeat(args);
  // Not "register again" (that would replace the newer process in turn).
  EXPECT_EQ(stale.status().code(), StatusCode::kAlreadyExists);
  EXPECT_FALSE(wire::NeedsRegistration(stale.status().code()));
  EXPECT_THAT(std::string(stale.status().message()),
              HasSubstr("another process registered as learner 'a'"));
  EXPECT_EQ(h.core().SessionLearner(first).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(h.core().SessionLearner(12345).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(*h.core().SessionLearner(second), "a");
  args.session_id = second;
  EXPECT_TRUE(h.core().Heartbeat(args).ok());
}

TEST(LighthouseCoreTest, ReRegistrationAbortsTheOldSessionsJoin) {
  CoreHarness h(CoreHarness::Options(2, 1000));
  h.Register("a");
  auto old_join = h.Join("a");
  h.Register("a");
  ASSERT_TRUE(old_join->done());
  EXPECT_EQ(old_join->code(), StatusCode::kAborted);
}

RegisterArgs FromHost(const std::string& id, const std::string& peer_host, bool loopback) {
  RegisterArgs args;
  args.learner_id = id;
  args.peer_host = peer_host;
  args.rank_addresses = {loopback ? "127.0.0.1" : "10.9.9.9"};
  args.loopback_host = loopback ? "127.0.0.1" : "";
  return args;
}

// The default dataplane_host (127.0.0.1) works while every learner runs on
// one host. Learners on two hosts with a loopback one among them could
// connect in no round: the lighthouse refuses the loopback one, whichever
// registered first, naming the key, instead of every round failing.
TEST(LighthouseCoreTest, ALoopbackDataPlaneHostIsRefusedOnceLearnersRunOnTwoHosts) {
  CoreHarness h(CoreHarness::Options(2, 1000));
  ASSERT_TRUE(h.RegisterWith(FromHost("a", "local", true)).ok());
  ASSERT_TRUE(h.RegisterWith(FromHost("b", "local", true)).ok());  // one host: fine
  ASSERT_TRUE(h.RegisterWith(FromHost("c", "", true)).ok());       // host not known: not judged
  // A learner on another host with a loopback data-plane host is refused.
  auto refused = h.core().Register(FromHost("d", "10.0.0.6", true));
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("dataplane_host = \"127.0.0.1\": learner 'd' (on 10.0.0.6) gave a "
                        "loopback data-plane host, but learner '"));
  // One with a routable host is taken, and the loopback ones on the other
  // host are refused: a's join ends with the reason, b finds itself gone.
  auto a_join = h.Join("a");
  ASSERT_TRUE(h.RegisterWith(FromHost("e", "10.0.0.6", false)).ok());
  ASSERT_TRUE(a_join->done());
  EXPECT_EQ(a_join->code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(a_join->message(), HasSubstr("learner 'a' (on the lighthouse's host)"));
  EXPECT_THAT(a_join->message(), HasSubstr("learner 'e' runs on another host (10.0.0.6)"));
  EXPECT_EQ(h.Heartbeat("b").status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(h.Heartbeat("c").ok());
  EXPECT_EQ(EventKinds(h.core(), "b"), (std::vector<std::string>{"registered", "refused"}));
  // b registers again (as its agent does) and is refused now.
  EXPECT_EQ(h.core().Register(FromHost("b", "local", true)).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(LighthouseCoreTest, RegisterForAnotherJobIsRefused) {
  CoreHarness h(CoreHarness::Options(2, 1000));
  RegisterArgs args;
  args.learner_id = "a";
  args.job_id = "other";
  auto result = h.core().Register(args);
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("serves job \"job\""));
}

TEST(LighthouseCoreTest, SilentLearnerIsDeclaredDeadAndRevivedByAHeartbeat) {
  CoreHarness h(CoreHarness::Options(2, 1000));
  h.Register("a");
  h.Register("b");
  for (int i = 0; i < 11; ++i) {
    h.HeartbeatAll({"a"});
    h.AdvanceMs(100);
  }
  auto snapshot = h.core().Snapshot(10, 10);
  EXPECT_EQ(snapshot.learners_alive, 1u);
  EXPECT_EQ(snapshot.counters.deaths, 1u);
  ASSERT_TRUE(h.Heartbeat("b").ok());
  EXPECT_EQ(h.core().Snapshot(10, 10).learners_alive, 2u);
  EXPECT_EQ(EventKinds(h.core(), "b"), (std::vector<std::string>{"registered", "dead", "revived"}));
}

// A lighthouse that did not run (SIGSTOP, a paused VM) for longer than the
// heartbeat timeout does not declare every learner dead on waking: their
// silence was its own. Each gets a fresh timeout, and one that stays silent
// after it is declared dead then.
TEST(LighthouseCoreTest, ALighthouseThatDidNotRunGivesEveryLearnerAFreshTimeout) {
  CoreHarness h(CoreHarness::Options(2, 1000));
  h.Register("a");
  h.Register("b");
  h.HeartbeatAll({"a", "b"});
  h.AdvanceMs(100);
  h.StallMs(5000);
  auto woken = h.core().Snapshot(10, 10);
  EXPECT_EQ(woken.learners_alive, 2u);
  EXPECT_EQ(woken.counters.deaths, 0u);
  EXPECT_EQ(woken.counters.stalls, 1u);
  EXPECT_EQ(EventKinds(h.core(), ""), (std::vector<std::string>{"stalled"}));
  for (int i = 0; i < 11; ++i) {  // b stays silent
    h.HeartbeatAll({"a"});
    h.AdvanceMs(100);
  }
  auto later = h.core().Snapshot(10, 10);
  EXPECT_EQ(later.learners_alive, 1u);
  EXPECT_EQ(later.counters.deaths, 1u);
  EXPECT_EQ(later.counters.stalls, 1u);  // ticks at their deadlines are no stall
  EXPECT_EQ(EventKinds(h.core(), "b"), (std::vector<std::string>{"registered", "dead"}));
}

TEST(LighthouseCoreTest, ForgottenLearnerLeavesTheOthersStateIntact) {
  LighthouseOptions options = CoreHarness::Options(2, 1000);
  options.gone_retention = 5 * kMicrosPerSecond;
  CoreHarness h(options);
  for (const char* id : {"a", "b", "c", "d"}) h.Register(id);
  // "a" (registered first) goes silent, dies, and is forgotten after the
  // retention; the others keep heartbeating with their own step times.
  for (int i = 0; i < 80; ++i) {
    ASSERT_TRUE(h.Heartbeat("b", {100}).ok());
    ASSERT_TRUE(h.Heartbeat("c", {200}).ok());
    ASSERT_TRUE(h.Heartbeat("d", {300}).ok());
    h.AdvanceMs(100);
  }
  auto snapshot = h.core().Snapshot(10, 10);
  ASSERT_EQ(snapshot.learners.size(), 3u);
  std::map<std::string, double> median;
  for (const auto& learner : snapshot.learners) {
    EXPECT_EQ(learner.state, "training") << learner.id;
    EXPECT_LE(learner.last_heartbeat_ms_ago, 100.0) << learner.id;
    median[learner.id] = learner.median_step_ms;
  }
  EXPECT_EQ(median, (std::map<std::string, double>{{"b", 100}, {"c", 200}, {"d", 300}}));
  EXPECT_EQ(h.Heartbeat("a").status().code(), StatusCode::kNotFound);
  // The survivors still die on their own silence, each once.
  h.AdvanceMs(1100);
  EXPECT_EQ(h.core().Snapshot(10, 10).learners_alive, 0u);
  EXPECT_EQ(h.core().Snapshot(10, 10).counters.deaths, 4u);
}

// A second job on a standing lighthouse: the first job's rounds closed
// before any of its learners registered, so they are no news that a round
// left them out (a learner reads "a round of my boundary's step or later
// closed without me" from it, and would never wait for its partner).
TEST(LighthouseCoreTest, AnEarlierJobsRoundsAreNoNewsToTheNextJob) {
  CoreHarness h(CoreHarness::Options(2, 1000));
  for (const char* id : {"a", "b"}) h.Register(id);
  auto a = h.Join("a", 0, 10, 60000, /*step=*/6);
  auto b = h.Join("b", 0, 10, 60000, /*step=*/6);
  ASSERT_TRUE(a->ok() && b->ok());
  for (const char* id : {"a", "b"}) ASSERT_TRUE(h.core().Leave(id, h.session(id), "done").ok());
  h.Register("c");
  auto c = h.Join("c", 0, 10, 60000, /*step=*/3);
  auto news = h.Heartbeat("c");
  ASSERT_TRUE(news.ok());
  EXPECT_EQ(news->latest_round_step, 0u);
  // d registers while c is alive: the same job; the first round of it is news.
  h.Register("d");
  auto d = h.Join("d", 0, 10, 60000, /*step=*/3);
  ASSERT_TRUE(c->ok() && d->ok());
  EXPECT_EQ(c->round().id, 2u);
  auto late = h.Join("d", 2, 10, 60000, /*step=*/6);
  EXPECT_EQ(h.Heartbeat("d")->latest_round_step, 3u);
}

// A learner that two others could not connect to (a firewall in front of
// its data plane: every round with it fails at the connect) is left out of
// the next round, which closes without waiting for it; its joins end at
// once, saying why. Once that round closed it is tried again, and when two
// others again cannot reach it, it is left out twice as long.
TEST(LighthouseCoreTest, ALearnerOthersCannotReachIsLeftOutThenTriedAgain) {
  CoreHarness h(CoreHarness::Options(2, 5000));
  for (const char* id : {"a", "b", "c"}) h.Register(id);
  // Learner `id` could not connect to `peers` in `round` (RoundRunner::Connect).
  const auto report = [&](const Round& round, const std::string& id, const std::string& peers) {
    ASSERT_TRUE(
        h.core().store().Set(round.rendezvous_prefix + kRoundUnreachablePrefix + id, peers).ok());
  };
  auto a = h.Join("a"), b = h.Join("b"), c = h.Join("c");
  ASSERT_TRUE(a->ok() && b->ok() && c->ok());
  ASSERT_EQ(a->round().members.size(), 3u);
  report(a->round(), "b", "a");  // round 1 fails: b named a (c's connect was called off)
  b = h.Join("b");
  a = h.Join("a");
  c = h.Join("c");
  ASSERT_TRUE(a->ok() && b->ok() && c->ok());  // one report, one reporter: all three again
  const Round& second = c->round();
  EXPECT_EQ(second.members.size(), 3u);
  report(second, "c", "a");
  report(second, "a", "b");  // (its own failed connects name the others)
  c = h.Join("c");           // b and c named a: a is left out
  a = h.Join("a");
  ASSERT_TRUE(a->done());
  EXPECT_EQ(a->code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(a->message().find("learner 'a' is left out of the next 1 round(s)"), std::string::npos)
      << a->message();
  EXPECT_NE(a->message().find("learners b, c could not connect to its data plane"),
            std::string::npos)
      << a->message();
  b = h.Join("b");  // (a's report of b is not held against b)
  ASSERT_TRUE(b->ok() && c->ok());
  EXPECT_EQ(CoreHarness::MemberIds(b->round()), (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(b->round().closed_by, "all_joined");  // no grace window spent waiting for a
  const uint64_t third = b->round().id;

  // That round closed: a is tried again, with b and c.
  a = h.Join("a", 0);
  b = h.Join("b", third);
  c = h.Join("c", third);
  ASSERT_TRUE(a->ok() && b->ok() && c->ok());
  EXPECT_EQ(a->round().members.size(), 3u);
  report(a->round(), "b", "a");
  report(a->round(), "c", "a");
  b = h.Join("b", third);
  c = h.Join("c", third);
  a = h.Join("a", 0);
  ASSERT_TRUE(a->done());
  EXPECT_NE(a->message().find("left out of the next 2 round(s)"), std::string::npos)
      << a->message();
  auto status = nlohmann::json::parse(StatusJson(h.core().Snapshot(100, 10)));
  bool seen = false;
  for (const auto& learner : status["learners"]) {
    if (learner["id"] == "a") {
      EXPECT_EQ(learner["state"], "unreachable");
      seen = true;
    }
  }
  EXPECT_TRUE(seen);
  EXPECT_NE(PrometheusText(h.core().Snapshot(100, 10)).find("mend_unreachable_left_out_total 2"),
            std::string::npos);
  // Two rounds of b and c (the first closed as a was left out: b and c had
  // joined): in between, a's joins still end at once.
  ASSERT_TRUE(b->ok() && c->ok());
  const uint64_t fifth = b->round().id;
  b = h.Join("b", fifth);
  a = h.Join("a", 0);
  ASSERT_TRUE(a->done());
  EXPECT_EQ(a->code(), StatusCode::kDeadlineExceeded);
  c = h.Join("c", fifth);
  ASSERT_TRUE(b->ok() && c->ok());
  EXPECT_EQ(CoreHarness::MemberIds(b->round()), (std::vector<std::string>{"b", "c"}));
  const uint64_t sixth = b->round().id;
  a = h.Join("a", 0);
  EXPECT_FALSE(a->done());  // let back in: it waits for the next round
  b = h.Join("b", sixth);
  c = h.Join("c", sixth);
  ASSERT_TRUE(a->ok() && b->ok() && c->ok());
  EXPECT_EQ(a->round().members.size(), 3u);
}

// Reports that a member's pieces failed the secure data plane's
// authentication leave it out as unreachable ones do, and the reason given
// says so (not a firewall).
TEST(LighthouseCoreTest, AMemberWhosePiecesFailAuthenticationIsLeftOutSayingSo) {
  CoreHarness h(CoreHarness::Options(2, 5000));
  for (const char* id : {"a", "b", "c", "d"}) h.Register(id);
  std::map<std::string, std::shared_ptr<JoinOutcome>> join;
  for (const char* id : {"a", "b", "c", "d"}) join[id] = h.Join(id);
  ASSERT_TRUE(join["a"]->ok());
  const Round first = join["a"]->round();
  for (const char* id : {"b", "c"}) {
    ASSERT_TRUE(h.core()
                    .store()
                    .Set(first.rendezvous_prefix + kRoundUnreachablePrefix + id,
                         std::string("a") + kRoundUnauthenticatedTag)
                    .ok());
  }
  join["b"] = h.Join("b");
  join["c"] = h.Join("c");  // two reporters: a is left out
  join["a"] = h.Join("a");
  ASSERT_TRUE(join["a"]->done());
  EXPECT_EQ(join["a"]->code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(join["a"]->message().find("learners b, c could not authenticate the data-plane pieces "
                                      "it sent"),
            std::string::npos)
      << join["a"]->message();
  EXPECT_EQ(join["a"]->message().find("firewall"), std::string::npos) << join["a"]->message();
  auto status = nlohmann::json::parse(StatusJson(h.core().Snapshot(100, 10)));
  int events = 0;
  for (const auto& event : status["events"]) {
    if (event["kind"] != "unreachable") continue;
    ++events;
    EXPECT_EQ(event["learner"], "a");
    EXPECT_EQ(event["message"],
              "b, c could not authenticate the pieces of it; left out of 1 round(s)");
  }
  EXPECT_EQ(events, 1);
  join["d"] = h.Join("d");
  ASSERT_TRUE(join["b"]->ok());
  EXPECT_EQ(CoreHarness::MemberIds(join["b"]->round()), (std::vector<std::string>{"b", "c", "d"}));
}

// What does not count against a learner: reports of a round it was already
// left out for (a third reporter's, read later), and those of the learner
// that was left out. A learner left out that completes a round is forgiven.
TEST(LighthouseCoreTest, LateReportsAndTheLeftOutLearnersOwnDoNotCount) {
  CoreHarness h(CoreHarness::Options(2, 5000));
  for (const char* id : {"a", "b", "c", "d"}) h.Register(id);
  const auto report = [&](const Round& round, const std::string& id, const std::string& peers) {
    ASSERT_TRUE(
        h.core().store().Set(round.rendezvous_prefix + kRoundUnreachablePrefix + id, peers).ok());
  };
  std::map<std::string, std::shared_ptr<JoinOutcome>> join;
  for (const char* id : {"a", "b", "c", "d"}) join[id] = h.Join(id);
  ASSERT_TRUE(join["a"]->ok());
  const Round first = join["a"]->round();
  for (const char* id : {"b", "c", "d"}) report(first, id, "a");
  report(first, "a", "b\nc");
  join["b"] = h.Join("b");
  join["c"] = h.Join("c");  // two reporters: a is left out
  join["a"] = h.Join("a");  // (a's report, of b and c, is not counted)
  EXPECT_EQ(join["a"]->code(), StatusCode::kDeadlineExceeded);
  join["d"] = h.Join("d");  // (the third report, of the same round, is not counted)
  ASSERT_TRUE(join["b"]->ok());
  const Round second = join["b"]->round();
  EXPECT_EQ(CoreHarness::MemberIds(second), (std::vector<std::string>{"b", "c", "d"}));
  // A report of a by b alone, and of b by c alone, in the next round: were
  // d's late report or a's counted, a or b would now have two reporters.
  report(second, "b", "a");
  report(second, "c", "b");
  join["a"] = h.Join("a");  // let back in: the one round it was left out of closed
  for (const char* id : {"b", "c", "d"}) join[id] = h.Join(id, second.id);
  for (const char* id : {"a", "b", "c", "d"}) ASSERT_TRUE(join[id]->ok()) << id;
  EXPECT_EQ(join["a"]->round().members.size(), 4u);
  EXPECT_NE(PrometheusText(h.core().Snapshot(100, 10)).find("mend_unreachable_left_out_total 1"),
            std::string::npos);
}

// A learner left out is let back in at once when the others are too few to
// form a round without it (one died or left): otherwise no round would ever
// close again to let it back in.
TEST(LighthouseCoreTest, ALearnerLeftOutIsLetBackInWhenTheOthersAreTooFew) {
  CoreHarness h(CoreHarness::Options(2, 5000));
  for (const char* id : {"a", "b", "c", "d"}) h.Register(id);
  std::map<std::string, std::shared_ptr<JoinOutcome>> join;
  for (const char* id : {"a", "b", "c", "d"}) join[id] = h.Join(id);
  ASSERT_TRUE(join["a"]->ok());
  for (const char* id : {"b", "c"}) {
    ASSERT_TRUE(h.core()
                    .store()
                    .Set(join["a"]->round().rendezvous_prefix + kRoundUnreachablePrefix + id, "a")
                    .ok());
  }
  join["b"] = h.Join("b");
  join["c"] = h.Join("c");  // a is left out; the round waits for d
  join["a"] = h.Join("a");
  EXPECT_EQ(join["a"]->code(), StatusCode::kDeadlineExceeded);
  for (const char* id : {"c", "d"}) ASSERT_TRUE(h.core().Leave(id, h.session(id), "done").ok());
  EXPECT_FALSE(join["b"]->done());
  join["a"] = h.Join("a");  // b alone cannot form a round: a is tried again at once
  ASSERT_TRUE(join["a"]->ok() && join["b"]->ok());
  EXPECT_EQ(CoreHarness::MemberIds(join["a"]->round()), (std::vector<std::string>{"a", "b"}));
}

TEST(LighthouseCoreTest, JoinsOfClosedRoundsNeverExpireLater) {
  CoreHarness h(CoreHarness::Options(2, 0));
  for (const char* id : {"a", "b"}) h.Register(id);
  uint64_t last = 0;
  std::vector<std::shared_ptr<JoinOutcome>> closed;
  // Many rounds of joins with a short timeout: their deadline entries are
  // swept as stale; none may later complete a join that already has a round.
  for (int round = 0; round < 2000; ++round) {
    auto a = h.Join("a", last, 0, /*timeout_ms=*/50);
    auto b = h.Join("b", last, 0, /*timeout_ms=*/50);
    ASSERT_TRUE(a->ok() && b->ok()) << round;
    last = a->round().id;
    closed.push_back(a);
  }
  auto waiting = h.Join("a", last, 0, /*timeout_ms=*/30);
  h.AdvanceMs(20);
  EXPECT_FALSE(waiting->done());
  h.HeartbeatAll({"a", "b"});
  h.AdvanceMs(20);
  ASSERT_TRUE(waiting->done());
  EXPECT_EQ(waiting->code(), StatusCode::kDeadlineExceeded);
  for (const auto& join : closed) EXPECT_TRUE(join->ok());
}

TEST(LighthouseCoreTest, HeartbeatsTellAWaitingLearnerItWasPassedOver) {
  // a and b close the round for step 50 without c; c's join for that step
  // comes after: its heartbeats say it waits, and which step the latest
  // round was for (it then trains on instead of waiting).
  CoreHarness h(CoreHarness::Options(2, 0));
  for (const char* id : {"a", "b", "c"}) h.Register(id);
  auto before = h.Heartbeat("c");
  ASSERT_TRUE(before.ok());
  EXPECT_EQ(before->latest_round_step, 0u);
  auto a = h.Join("a", 0, 0, 60000, /*step=*/50);
  auto b = h.Join("b", 0, 0, 60000, /*step=*/50);
  ASSERT_TRUE(a->ok() && b->ok());
  auto c = h.Join("c", 0, 0, 60000, /*step=*/50);
  EXPECT_FALSE(c->done());
  auto news = h.Heartbeat("c");
  ASSERT_TRUE(news.ok());
  EXPECT_EQ(news->latest_round_id, a->round().id);
  EXPECT_EQ(news->latest_round_step, 50u);
  EXPECT_TRUE(news->waiting);
  // A member may hear of its round through a heartbeat before its join's
  // answer arrives: it must not read that as having been passed over.
  auto member = h.Heartbeat("a");
  ASSERT_TRUE(member.ok());
  EXPECT_FALSE(member->waiting);
  EXPECT_EQ(member->latest_round_step, 0u);
}

TEST(LighthouseCoreTest, HeartbeatsTellAWaitingLearnerWhenTooFewAreLeftForAQuorum) {
  // Quorum of 2: a waits in a join after b left. Its heartbeats say the
  // join is short of a quorum, though only once the lighthouse has been up
  // for a heartbeat timeout (after a restart the others need that long to
  // reach it), and only while the join waits; b's return ends it.
  CoreHarness h(CoreHarness::Options(2, 0));
  for (const char* id : {"a", "b"}) h.Register(id);
  auto idle = h.Heartbeat("a");
  ASSERT_TRUE(idle.ok());
  EXPECT_FALSE(idle->short_of_quorum);
  ASSERT_TRUE(h.core().Leave("b", h.session("b"), "done").ok());
  EXPECT_FALSE(h.Heartbeat("a")->short_of_quorum) << "no join waits";
  auto a = h.Join("a", 0, 0, 600000, /*step=*/40);
  EXPECT_FALSE(a->done());
  EXPECT_FALSE(h.Heartbeat("a")->short_of_quorum) << "up for less than a heartbeat timeout";
  h.AdvanceMs(1000);
  auto alone = h.Heartbeat("a");
  ASSERT_TRUE(alone.ok());
  EXPECT_TRUE(alone->waiting);
  EXPECT_TRUE(alone->short_of_quorum);
  h.Register("b");
  EXPECT_FALSE(h.Heartbeat("a")->short_of_quorum) << "b is back";
  auto b = h.Join("b", 0, 0, 600000, /*step=*/40);
  h.AdvanceMs(1);
  ASSERT_TRUE(a->ok() && b->ok());
  EXPECT_FALSE(h.Heartbeat("a")->short_of_quorum);
}

// A synchronous learner waits for its round at its boundary: once a learner
// of the job is gone and too few are left for a quorum, its join ends after
// a heartbeat timeout (it trains on), not at its own timeout at every
// boundary. At the job's start (none gone, no round yet) it waits for the
// others; a concurrent learner's join waits on (its heartbeats tell it).
TEST(LighthouseCoreTest, ASynchronousJoinEndsOnceALearnerIsGoneAndTooFewAreLeft) {
  CoreHarness h(CoreHarness::Options(2, 0));
  h.Register("a");
  const auto beat = [&](int times) {
    for (int i = 0; i < times; ++i) {
      h.AdvanceMs(400);
      ASSERT_TRUE(h.Heartbeat("a").ok());
    }
  };
  auto first = h.Join("a", 0, 0, 600000, /*step=*/10, /*synchronous=*/true);
  ASSERT_NO_FATAL_FAILURE(beat(5));
  EXPECT_FALSE(first->done()) << "the job's start: b may still come";
  h.Register("b");
  auto b = h.Join("b", 0, 0, 600000, /*step=*/10, /*synchronous=*/true);
  h.AdvanceMs(1);
  ASSERT_TRUE(first->ok() && b->ok());
  ASSERT_TRUE(h.core().Leave("b", h.session("b"), "done").ok());
  auto alone = h.Join("a", 1, 0, 600000, /*step=*/20, /*synchronous=*/true);
  ASSERT_NO_FATAL_FAILURE(beat(2));
  EXPECT_FALSE(alone->done()) << "less than a heartbeat timeout";
  ASSERT_NO_FATAL_FAILURE(beat(2));
  ASSERT_TRUE(alone->done());
  EXPECT_EQ(alone->code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(alone->message().find("no round can form: 1 of the job's learners are alive, the "
                                  "quorum's minimum is 2"),
            std::string::npos)
      << alone->message();
  auto concurrent = h.Join("a", 1, 0, 600000, /*step=*/30, /*synchronous=*/false);
  ASSERT_NO_FATAL_FAILURE(beat(5));
  EXPECT_FALSE(concurrent->done());
}

TEST(LighthouseCoreTest, EveryMemberIsToldTheRoundsStepTheLargestOfTheMembers) {
  // A member whose join is for an earlier step (it was passed over and
  // trained on) learns the same step as the others, so that decisions that
  // depend on the step (the outer warm-up) agree.
  CoreHarness h(CoreHarness::Options(2, 0));
  for (const char* id : {"a", "b"}) h.Register(id);
  auto a = h.Join("a", 0, 0, 60000, /*step=*/100);
  auto b = h.Join("b", 0, 0, 60000, /*step=*/150);
  ASSERT_TRUE(a->ok() && b->ok());
  EXPECT_EQ(a->round().step, 150u);
  EXPECT_EQ(b->round().step, 150u);
}

TEST(LighthouseCoreTest, ALearnerThatDiedInARoundAndCameBackDoesNotHoldTheOthersBack) {
  // a, b and c form round 1; c stops (SIGSTOP) inside it and is declared
  // dead, so round 1 fails for a and b, who join again still at round 0. c
  // comes back (heartbeats again) while its own round 1 is still failing.
  // a and b must get a round within the grace window: c may not hold round
  // 1's state, so it is not the newest state they must wait for.
  CoreHarness h(CoreHarness::Options(2, 300));
  for (const char* id : {"a", "b", "c"}) h.Register(id);
  auto a1 = h.Join("a", 0, 0, 60000, /*step=*/20);
  auto b1 = h.Join("b", 0, 0, 60000, /*step=*/20);
  auto c1 = h.Join("c", 0, 0, 60000, /*step=*/20);
  ASSERT_TRUE(a1->ok() && b1->ok() && c1->ok());
  const uint64_t failed = a1->round().id;
  for (int i = 0; i < 11; ++i) {
    h.HeartbeatAll({"a", "b"});
    h.AdvanceMs(100);
  }
  ASSERT_EQ(h.core().Snapshot(10, 10).counters.deaths, 1u);
  ASSERT_TRUE(h.Heartbeat("c").ok());
  ASSERT_EQ(h.core().Snapshot(10, 10).learners_alive, 3u);
  auto a2 = h.Join("a", 0, 0, 60000, /*step=*/40);
  auto b2 = h.Join("b", 0, 0, 60000, /*step=*/40);
  h.HeartbeatAll({"a", "b", "c"});
  h.AdvanceMs(301);
  ASSERT_TRUE(a2->done() && b2->done());
  ASSERT_TRUE(a2->ok()) << a2->result->status();
  EXPECT_GT(a2->round().id, failed);
  EXPECT_EQ(CoreHarness::MemberIds(a2->round()), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(a2->round().heal_round_id, 0u);
}

TEST(LighthouseCoreTest, SlowFlagIsRaisedAndClearedWithEvents) {
  CoreHarness h(CoreHarness::Options(2, 1000));
  for (const char* id : {"a", "b", "c"}) h.Register(id);
  auto feed = [&](double c_ms) {
    for (int i = 0; i < 8; ++i) {
      ASSERT_TRUE(h.Heartbeat("a", {100}).ok());
      ASSERT_TRUE(h.Heartbeat("b", {102}).ok());
      ASSERT_TRUE(h.Heartbeat("c", {c_ms}).ok());
      h.AdvanceMs(60);
    }
  };
  feed(100);
  EXPECT_FALSE(h.Heartbeat("c")->slow);
  feed(300);
  EXPECT_TRUE(h.Heartbeat("c")->slow);
  EXPECT_FALSE(h.Heartbeat("a")->slow);
  EXPECT_EQ(h.core().Snapshot(10, 10).learners[0].id, "c");  // slow learners listed first
  feed(100);
  EXPECT_FALSE(h.Heartbeat("c")->slow);
  EXPECT_EQ(EventKinds(h.core(), "c"),
            (std::vector<std::string>{"registered", "slow", "recovered"}));
  EXPECT_EQ(h.core().Snapshot(10, 10).counters.slow_flags, 1u);
}

TEST(LighthouseCoreTest, TwoLearnersAreNeverFlagged) {
  CoreHarness h(CoreHarness::Options(1, 1000));
  h.Register("a");
  h.Register("b");
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(h.Heartbeat("a", {100}).ok());
    ASSERT_TRUE(h.Heartbeat("b", {1000}).ok());
    h.AdvanceMs(60);
  }
  EXPECT_FALSE(h.Heartbeat("b")->slow);
}

TEST(LighthouseCoreTest, StoreGetWaitsForSetAndTimesOut) {
  CoreHarness h(CoreHarness::Options(2, 1000));
  std::optional<Status> got;
  std::vector<std::string> values;
  h.core().store().Wait({"k"}, 500 * kMicrosPerMilli, [&](Status s, std::vector<std::string> v) {
    got = s;
    values = std::move(v);
  });
  EXPECT_FALSE(got);
  ASSERT_TRUE(h.core().store().Set("k", "v").ok());
  ASSERT_TRUE(got && got->ok());
  EXPECT_EQ(values[0], "v");
  got.reset();
  h.core().store().Wait({"never"}, 500 * kMicrosPerMilli,
                        [&](Status s, std::vector<std::string>) { got = s; });
  h.AdvanceMs(499);
  EXPECT_FALSE(got);
  h.AdvanceMs(1);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->code(), StatusCode::kDeadlineExceeded);
}

TEST(LighthouseCoreTest, OldRoundsRendezvousKeysAreCollected) {
  auto options = CoreHarness::Options(2, 1000);
  options.keep_round_prefixes = 2;
  CoreHarness h(options);
  h.Register("a");
  h.Register("b");
  uint64_t round = 0;
  for (int i = 0; i < 4; ++i) {
    // The core's rounds carry its instance in their prefixes.
    const std::string incarnation = InstanceText(h.core().instance_id());
    ASSERT_TRUE(
        h.core().store().Set(RendezvousPrefix("job", incarnation, round + 1) + "rank0", "x").ok());
    h.Join("a", round);
    auto b = h.Join("b", round);
    ASSERT_TRUE(b->ok());
    round = b->round().id;
  }
  // Rounds 1 and 2 were collected when rounds 3 and 4 closed.
  EXPECT_EQ(h.core().Snapshot(0, 0).store_keys, 2u);
}

TEST(LighthouseCoreTest, NextDeadlineTracksGraceWindowAndJoinTimeouts) {
  CoreHarness h(CoreHarness::Options(2, 1000));
  for (const char* id : {"a", "b", "c"}) h.Register(id);
  Micros now = h.clock().NowMicros();
  h.Join("a", 0, 0, 300);
  EXPECT_LE(h.core().NextDeadline(), now + 300 * kMicrosPerMilli);
  h.Join("b", 0, 0, 60000);
  h.AdvanceMs(300);  // a times out; quorum lost
  h.Join("a", 0, 0, 60000);
  Micros reached = h.clock().NowMicros();
  EXPECT_LE(h.core().NextDeadline(), reached + 1000 * kMicrosPerMilli);
}

TEST(LighthouseCoreTest, StatusJsonHasTheDocumentedShape) {
  CoreHarness h(CoreHarness::Options(2, 1000));
  h.Register("a");
  h.Register("b");
  h.Join("a");
  ASSERT_TRUE(h.Join("b")->ok());
  auto doc = nlohmann::json::parse(StatusJson(h.core().Snapshot(100, 100)));
  EXPECT_EQ(doc["job"], "job");
  ASSERT_EQ(doc["learners"].size(), 2u);
  for (const char* field :
       {"id", "state", "step", "tokens_per_s", "last_heartbeat_ms_ago", "slow", "slow_zscore"}) {
    EXPECT_TRUE(doc["learners"][0].contains(field)) << field;
  }
  ASSERT_EQ(doc["rounds"].size(), 1u);
  EXPECT_EQ(doc["rounds"][0]["members"], nlohmann::json({"a", "b"}));
  EXPECT_EQ(doc["rounds"][0]["closed_by"], "all_joined");
  EXPECT_TRUE(doc["rounds"][0].contains("waited_ms"));
  EXPECT_TRUE(doc["events"].is_array());
}

TEST(LighthouseCoreTest, MetricsUseMendPrefixAndCountRounds) {
  CoreHarness h(CoreHarness::Options(2, 1000));
  h.Register("a");
  h.Register("b");
  h.Join("a");
  ASSERT_TRUE(h.Join("b")->ok());
  h.core().RecordRejection("UNAUTHENTICATED", "ipv4:1.2.3.4", "bad token");
  std::string text = PrometheusText(h.core().Snapshot(0, 0));
  EXPECT_THAT(text, HasSubstr("mend_rounds_total{closed_by=\"all_joined\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("mend_rejected_requests_total{code=\"UNAUTHENTICATED\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("mend_member_wait_seconds_count 2\n"));
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    EXPECT_EQ(line.rfind("mend_", 0), 0u) << line;
  }
}

// Registers `id` with its shared settings and group size, as a learner does.
StatusOr<RegisterResult> RegisterWith(CoreHarness& h, const std::string& id,
                                      std::vector<std::string> settings, uint32_t group_size = 1) {
  RegisterArgs args;
  args.learner_id = id;
  args.job_settings = std::move(settings);
  args.group_size = group_size;
  return h.core().Register(args);
}

// The learners of a job must agree on what shapes its rounds: the first to
// register while no other is alive sets the job's settings; another that
// differs is refused, naming each key; once none is alive a new one may
// start the job afresh with other settings.
TEST(LighthouseCoreTest, ALearnerWhoseSharedSettingsDifferIsRefusedNamingTheKeys) {
  CoreHarness h(CoreHarness::Options(2, 1000));
  ASSERT_TRUE(RegisterWith(h, "a", {"fragments=1", "sync_period_steps=5"}).ok());
  ASSERT_TRUE(RegisterWith(h, "b", {"fragments=1", "sync_period_steps=5"}).ok());
  auto other = RegisterWith(h, "c", {"fragments=2", "sync_period_steps=10"});
  ASSERT_EQ(other.status().code(), StatusCode::kInvalidArgument) << other.status();
  const std::string message(other.status().message());
  EXPECT_THAT(message, HasSubstr("fragments = 2 (this job's learners have 1)"));
  EXPECT_THAT(message, HasSubstr("sync_period_steps = 10 (this job's learners have 5)"));
  EXPECT_THAT(message, HasSubstr("'a'"));
  auto missing = RegisterWith(h, "c", {"fragments=1"});
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("sync_period_steps = (not sent) (this job's learners have 5)"));
  // An older learner sends none: not checked.
  EXPECT_TRUE(RegisterWith(h, "d", {}).ok());
  // "a" restarting with other settings while "b" and "d" are alive: refused.
  EXPECT_FALSE(RegisterWith(h, "a", {"fragments=1", "sync_period_steps=7"}).ok());
  // Once every learner has left, the next one sets the job's settings.
  for (const char* id : {"a", "b", "d"}) {
    h.Register(id);  // (a fresh session to leave with)
    ASSERT_TRUE(h.core().Leave(id, h.session(id), "done").ok()) << id;
  }
  EXPECT_TRUE(RegisterWith(h, "a", {"fragments=1", "sync_period_steps=7"}).ok());
  EXPECT_FALSE(RegisterWith(h, "b", {"fragments=1", "sync_period_steps=5"}).ok());
  EXPECT_TRUE(RegisterWith(h, "b", {"fragments=1", "sync_period_steps=7"}).ok());
}

// A setting that lists items after its summary (a model's shapes, its frozen
// parameters' digests) names where the two lists first differ, or that the
// listed items agree and the difference lies past them.
TEST(LighthouseCoreTest, ARefusalNamesWhereTwoListedSettingsFirstDiffer) {
  CoreHarness h(CoreHarness::Options(1, 1000));
  ASSERT_TRUE(
      RegisterWith(h, "a", {"frozen_parameters=3 tensors, digest 1f: x=aa y=bb z=cc"}).ok());
  auto other = RegisterWith(h, "b", {"frozen_parameters=3 tensors, digest 2e: x=aa y=b0 z=cc"});
  ASSERT_EQ(other.status().code(), StatusCode::kInvalidArgument) << other.status();
  EXPECT_THAT(std::string(other.status().message()),
              HasSubstr("(first difference: item 2, y=b0 against y=bb)"));
  auto past = RegisterWith(h, "b", {"frozen_parameters=9 tensors, digest 3d: x=aa ..."});
  ASSERT_FALSE(past.ok());
  EXPECT_THAT(std::string(past.status().message()),
              HasSubstr("(the first 1 items agree: they differ past the listed ones)"));
  auto plain = RegisterWith(h, "b", {"frozen_parameters=none"});
  ASSERT_FALSE(plain.ok());
  EXPECT_THAT(std::string(plain.status().message()), Not(HasSubstr("first difference")));
}

// A learner declared dead while a learner of other settings started the
// job anew does not come back into its rounds by heartbeating: it must
// register again, which checks it. Settings compare by key, in any order;
// an older learner (no settings) starting a job anew clears the old job's.
TEST(LighthouseCoreTest, ALearnerDeadWhileTheJobWasStartedAnewMustRegisterAgain) {
  CoreHarness h(CoreHarness::Options(1, 0));
  auto heartbeat = [&](const std::string& id, uint64_t session) {
    HeartbeatArgs args;
    args.learner_id = id;
    args.session_id = session;
    return h.core().Heartbeat(args);
  };
  auto a = RegisterWith(h, "a", {"fragments=1", "sync_period_steps=5"});
  ASSERT_TRUE(a.ok());
  h.AdvanceMs(1100);  // "a" is silent past heartbeat_timeout: dead
  ASSERT_EQ(h.core().Snapshot(10, 10).learners_alive, 0u);
  auto b = RegisterWith(h, "b", {"sync_period_steps=7", "fragments=1"});
  ASSERT_TRUE(b.ok());
  auto revived = heartbeat("a", a->session_id);
  ASSERT_EQ(revived.status().code(), StatusCode::kNotFound) << revived.status();
  EXPECT_THAT(std::string(revived.status().message()), HasSubstr("register again"));
  EXPECT_EQ(RegisterWith(h, "a", {"fragments=1", "sync_period_steps=5"}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(heartbeat("b", b->session_id).ok());
  EXPECT_TRUE(
      RegisterWith(h, "c", {"fragments=1", "sync_period_steps=7"}).ok());  // the order is no matter
  // Every learner gone; an older learner starts the job: no settings stay.
  h.AdvanceMs(1100);
  ASSERT_EQ(h.core().Snapshot(10, 10).learners_alive, 0u);
  ASSERT_TRUE(RegisterWith(h, "old", {}).ok());
  EXPECT_TRUE(RegisterWith(h, "d", {"fragments=1", "sync_period_steps=5"}).ok());
  EXPECT_FALSE(RegisterWith(h, "e", {"fragments=1", "sync_period_steps=7"}).ok());
  // A learner dead while the job restarted with the same settings heartbeats on.
  auto f = RegisterWith(h, "f", {"fragments=1", "sync_period_steps=5"});
  ASSERT_TRUE(f.ok());
  h.AdvanceMs(1100);
  ASSERT_TRUE(RegisterWith(h, "g", {"fragments=1", "sync_period_steps=5"}).ok());
  EXPECT_TRUE(heartbeat("f", f->session_id).ok());
}

// The group size follows the same rule: the alive learners' holds, and the
// first learner of a new job on a standing lighthouse sets another.
TEST(LighthouseCoreTest, ALearnerOfAnotherGroupSizeIsRefusedWhileTheJobsLearnersAreAlive) {
  CoreHarness h(CoreHarness::Options(2, 1000));
  auto a = RegisterWith(h, "a", {}, 2);
  auto b = RegisterWith(h, "b", {}, 2);
  ASSERT_TRUE(a.ok() && b.ok());
  auto other = RegisterWith(h, "c", {}, 4);
  ASSERT_EQ(other.status().code(), StatusCode::kInvalidArgument) << other.status();
  EXPECT_THAT(
      std::string(other.status().message()),
      HasSubstr("group_size = 4: this job's learners are groups of 2 rank(s) (set by 'a')"));
  EXPECT_FALSE(RegisterWith(h, "a", {}, 1).ok());  // a restart of "a" while "b" is alive
  ASSERT_TRUE(h.core().Leave("a", a->session_id, "done").ok());
  ASSERT_TRUE(h.core().Leave("b", b->session_id, "done").ok());
  // A new job, another size.
  EXPECT_TRUE(RegisterWith(h, "c", {}, 4).ok());
  EXPECT_FALSE(RegisterWith(h, "a", {}, 2).ok());
  EXPECT_TRUE(RegisterWith(h, "a", {}, 4).ok());
}

}  // namespace
}  // namespace mend::coordinator
