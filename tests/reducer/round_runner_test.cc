// The round runner (reducer/round_runner.h) over fake round services: a
// scripted quorum, an in-process store and a communicator of one member, on a
// fake clock. No network: Run() is called on the test's own thread (its
// connect runs on one of the runner's).
#include "reducer/round_runner.h"

#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/round_keys.h"
#include "gtest/gtest.h"
#include "mend/clock.h"
#include "reducer/connect_threads.h"
#include "reducer/options_from_config.h"
#include "reducer/round_fakes.h"
#include "reducer/unreachable_peers.h"
#include "test_util/job_config.h"

namespace mend::reducer {
namespace {

// A store whose reads go through `read` (and writes straight to `store`):
// a member that sees some keys late, or not at all.
class ReadThrough final : public RendezvousStore {
 public:
  using Read = std::function<StatusOr<std::string>(const std::string& key, Micros timeout)>;
  ReadThrough(RendezvousStore& store, Read read) : store_(store), read_(std::move(read)) {}
  Status Set(const std::string& key, const std::string& value) override {
    return store_.Set(key, value);
  }
  StatusOr<std::string> Get(const std::string& key, Micros timeout) override {
    return read_(key, timeout);
  }

 private:
  RendezvousStore& store_;
  Read read_;
};

using fakes::FakeServices;
using fakes::Values;

class RoundRunnerTest : public ::testing::Test {
 protected:
  RoundRunnerTest() {
    config_.quorum_timeout_ms = 1234;
    services_.SetQuorum(fakes::RoundOfOne(7, 100));  // past the warm-up: a Nesterov step
    flight_.fragment = 0;
    flight_.boundary_step = 40;
    flight_.tokens = 640;
    flight_.previous_round_id = 6;
    flight_.delta.assign(4, 0.5f);
    flight_.norm = 1.0;
    flight_.Snapped();
  }
  StatusOr<Outcome> Run() {
    RoundRunner runner(Options(), schedule_, services_, book_, *policy_, 0);
    return runner.Run(flight_, []() { return uint64_t{43}; });
  }

  Config config_ = testing_util::ConcurrentJobConfig(1, 20, 2);
  FragmentSchedule schedule_ = *FragmentSchedule::Make(1, 20);
  Values parameters_{1.0f};
  uint64_t copies_ = 0;
  ThreadPool pool_{1};
  FragmentBook book_{parameters_, schedule_, &copies_, pool_};
  std::unique_ptr<RoundPolicy> policy_ = SingleRankPolicy();
  // The runner's options: config_'s as it stands, with the outer step's defaults.
  const RoundOptions& Options() {
    options_ = MakeRoundOptions(config_, schedule_);
    options_.sync = OuterSyncOptions();
    return options_;
  }
  RoundOptions options_;
  FakeClock clock_;
  FakeServices services_{clock_};
  InFlight flight_;
};

TEST_F(RoundRunnerTest, ARoundAsksTheQuorumForTheFlightAndMergesItsPseudoGradient) {
  StatusOr<Outcome> outcome = Run();
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  const fakes::QuorumAsk ask = services_.last_ask();
  EXPECT_EQ(ask.last_round_id, 6u);
  EXPECT_EQ(ask.tokens, 640u);
  EXPECT_EQ(ask.boundary_step, 40u);
  EXPECT_EQ(ask.timeout, 1234 * kMicrosPerMilli);
  EXPECT_EQ(outcome->round_id, 7u);
  EXPECT_EQ(outcome->members, 1u);
  EXPECT_FALSE(outcome->healed);  // one member agrees with itself
  EXPECT_FALSE(outcome->outer_warmup);
  // The round formed at the learner's step then; the abort watch was armed
  // for its connect, then for its communicator, and disarmed at the end.
  EXPECT_TRUE(flight_.formed);
  EXPECT_EQ(flight_.formed_step, 43u);
  EXPECT_EQ(services_.opened(), 1);
  EXPECT_EQ(services_.watched(), 2);
  EXPECT_FALSE(services_.watching());
  EXPECT_EQ(services_.connected_prefix(), "job/round/x/7/");
  // The merge of one member is its own pseudo-gradient, in the flight's
  // buffer, for a Nesterov step at the commit.
  EXPECT_FALSE(outcome->result.average);
  EXPECT_EQ(std::vector<float>(flight_.delta.begin(), flight_.delta.end()),
            std::vector<float>(4, 0.5f));
}

TEST_F(RoundRunnerTest, AQuorumThatFailsEndsTheRoundBeforeAnythingConnects) {
  services_.SetQuorum(DeadlineExceededError("quorum: no round in time"));
  StatusOr<Outcome> outcome = Run();
  ASSERT_FALSE(outcome.ok());
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(flight_.formed);
  EXPECT_EQ(services_.opened(), 0);
  EXPECT_EQ(services_.watched(), 0);
}

// A member that cannot connect calls the round off for the others (its
// abort key, which their connects watch), so they do not wait out
// collective_timeout_ms for it.
TEST_F(RoundRunnerTest, ACommunicatorThatFailsToConnectEndsTheRoundUnwatched) {
  services_.SetConnect(UnavailableError("bind(2) for [192.0.2.1] failed"));
  StatusOr<Outcome> outcome = Run();
  ASSERT_FALSE(outcome.ok());
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(flight_.formed);
  EXPECT_EQ(services_.watched(), 1);  // the connect only
  EXPECT_FALSE(services_.watching());
  ASSERT_NE(services_.rendezvous(), nullptr);
  auto why =
      services_.rendezvous()->Get(fakes::RoundOfOne(7, 100).rendezvous_prefix() + kRoundAbortKey,
                                  kMicrosPerSecond);  // (the fixture's round)
  ASSERT_TRUE(why.ok()) << why.status();
  EXPECT_EQ(*why, "learner 'fake-learner' could not connect: bind(2) for [192.0.2.1] failed");
}

// A connect that failed on a member's address names that member for the
// lighthouse (<round>/unreachable/<learner>), which leaves out a learner
// that several others could not reach.
TEST_F(RoundRunnerTest, AFailedConnectNamesTheMembersItCouldNotReach) {
  QuorumResult round = fakes::RoundOfOne(7, 100);
  round.set_world_size(4);
  round.clear_members();
  for (const auto& [id, host] : std::vector<std::pair<std::string, std::string>>{
           {"b", "10.0.0.2"}, {"c", "10.0.0.3"}, {"d", "10.0.0.3"}, {"fake-learner", "10.0.0.1"}}) {
    RoundMember member;
    member.set_learner_id(id);
    member.set_address(host);
    *round.add_members() = member;
  }
  round.set_rank(3);
  services_.SetQuorum(round);
  services_.SetConnect(DeadlineExceededError(
      "round 7: connecting to the members: [pair.cc:123] Connect timeout [10.0.0.2]:41234; "
      "Connect timeout [10.0.0.3]:5000 Connect timeout [10.0.0.1]:1 Connect timeout [10.0.0.9]:2"));
  ASSERT_FALSE(Run().ok());
  auto named = services_.rendezvous()->Get(
      round.rendezvous_prefix() + kRoundUnreachablePrefix + "fake-learner", kMicrosPerSecond);
  ASSERT_TRUE(named.ok()) << named.status();
  // 10.0.0.3 is c's and d's (which one cannot be told), 10.0.0.1 its own,
  // 10.0.0.9 no member's: only b.
  EXPECT_EQ(*named, "b");
  // Only a timed-out connect names a member: a refused one is a peer dead or
  // restarting, not one out of reach.
  EXPECT_TRUE(UnreachableMembers("connect [10.0.0.2]:2: Connection refused; Read error "
                                 "[10.0.0.2]:2: Connection reset by peer",
                                 round.members(), "x")
                  .empty());
  // A member's host as a name or with a port is matched by its address.
  round.mutable_members(1)->set_address("localhost");
  round.mutable_members(2)->set_address("10.0.0.5:7000");
  round.mutable_members(3)->set_address("10.0.0.4");
  EXPECT_EQ(UnreachableMembers("Connect timeout [127.0.0.1]:1, Connect timeout [10.0.0.5]:2, "
                               "Connect timeout [10.0.0.4]:3 Connect timeout [",
                               round.members(), "x"),
            (std::vector<UnreachableMember>{{"c"}, {"d"}, {"fake-learner"}}));
  EXPECT_TRUE(UnreachableMembers("no address here", round.members(), "x").empty());
  // A member whose pieces did not open on the secure data plane is named
  // too (itself and an id of no member are not).
  EXPECT_EQ(UnreachableMembers("round 7: connecting to the members: member 1 ('b') failed "
                               "authentication; member 3 ('fake-learner') failed authentication; "
                               "member 9 ('z') failed authentication: ...",
                               round.members(), "fake-learner"),
            (std::vector<UnreachableMember>{{"b", /*unauthenticated=*/true}}));
  // One named both ways is named once, as failing authentication.
  EXPECT_EQ(UnreachableMembers("member 1 ('c') failed authentication; Connect timeout "
                               "[10.0.0.5]:2 Connect timeout [10.0.0.4]:1",
                               round.members(), "fake-learner"),
            (std::vector<UnreachableMember>{{"c", true}, {"d"}}));
  // The report tells the lighthouse which kind each is.
  services_.SetConnect(DataLossError(
      "round 7: connecting to the members: member 0 ('b') failed authentication; Connect timeout "
      "[10.0.0.5]:1"));
  round.set_round_id(8);
  round.set_rendezvous_prefix(round.rendezvous_prefix() + "8/");
  services_.SetQuorum(round);
  ASSERT_FALSE(Run().ok());
  named = services_.rendezvous()->Get(
      round.rendezvous_prefix() + kRoundUnreachablePrefix + "fake-learner", kMicrosPerSecond);
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(*named, std::string("b") + kRoundUnauthenticatedTag + "\nd");
}

// A member that died after the rendezvous holds the others in Gloo's
// connect until connect_timeout_ms; the lighthouse calls the round off when
// it declares that member dead, and the round ends then, its connect left to
// run out in the background.
TEST_F(RoundRunnerTest, ARoundCalledOffWhileItsMembersConnectEndsWithoutWaitingForTheConnect) {
  services_.HoldExchangesFrom(1);  // the connect does not return until released
  auto runner = std::make_unique<RoundRunner>(Options(), schedule_, services_, book_, *policy_, 0);
  std::thread lighthouse([&]() {
    // (The connect may begin before the round arms its watch.)
    ASSERT_TRUE(services_.AwaitConnects(1));
    ASSERT_TRUE(services_.AwaitWatching());
    if (!services_.CallOffRound("learner 'b' is dead (no heartbeat for 2000 ms)")) {
      ADD_FAILURE() << "no watch to call off";
      services_.ReleaseExchanges();  // (the round returns rather than hang)
    }
  });
  StatusOr<Outcome> outcome = runner->Run(flight_, []() { return uint64_t{43}; });
  lighthouse.join();
  ASSERT_FALSE(outcome.ok());
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(outcome.status().message().find("round 7"), std::string_view::npos) << outcome.status();
  EXPECT_NE(outcome.status().message().find("learner 'b' is dead"), std::string_view::npos)
      << outcome.status();
  EXPECT_FALSE(services_.watching());
  // The connect is still held: the round did not wait for it.
  EXPECT_EQ(services_.connects_returned(), 0u);
  EXPECT_EQ(runner->connects().threads(), 1u);
  // The next round goes on beside it; released, the connect returns, and
  // the runner's end joins its thread.
  services_.ReleaseExchanges();
  services_.SetQuorum(fakes::RoundOfOne(8, 120));
  flight_.previous_round_id = 7;
  outcome = runner->Run(flight_, []() { return uint64_t{63}; });
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->round_id, 8u);
  runner.reset();
  EXPECT_EQ(services_.connects_returned(), 2u);
}

// The same over Gloo: member 1 publishes its addresses at the rendezvous
// and dies (its port closes) before member 0 connects. The lighthouse calls
// the round off while member 0 connects; the round ends with ABORTED at
// once, and the Gloo connect left behind ends on its own (refused, or
// connect_timeout_ms without the peer) and is joined when the runner goes.
//
// Member 0 connects only once member 1's port is closed. A connect that
// raced the close could complete and then be reset before Gloo's event
// loop read the peer's address, and this Gloo (Debian's 5b14351) throws
// from getpeername on its loop thread then, which ends the process: see
// "Known limits" in docs/architecture.md.
TEST_F(RoundRunnerTest, AGlooConnectLeftBehindByACalledOffRoundEndsOnItsOwnAndIsJoined) {
  config_.connect_timeout_ms = 1000;
  QuorumResult round = fakes::RoundOfOne(7, 100);
  round.set_world_size(2);
  round.add_members();
  services_.SetQuorum(round);
  testing_util::InProcessStore shared;
  std::mutex mu;
  std::optional<Status> left_behind;  // the real connect's own result
  std::promise<void> member_1_died;
  std::shared_future<void> died = member_1_died.get_future().share();
  // Member 0 reads member 1's addresses only once member 1 is gone.
  services_.SetConnectThrough([&](const CommunicatorOptions& options) {
    // Called off as it begins (its watch is armed by then).
    EXPECT_TRUE(services_.AwaitWatching());
    EXPECT_TRUE(services_.CallOffRound("learner 'b' is dead"));
    testing_util::StoreConnection connection(shared);
    ReadThrough store(connection, [&](const std::string& key, Micros timeout) {
      if (key.ends_with("gloo/1") &&
          died.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
        return StatusOr<std::string>(DeadlineExceededError("member 1 did not die"));
      }
      return connection.Get(key, timeout);
    });
    StatusOr<std::unique_ptr<Communicator>> comm = Communicator::Connect(store, options);
    std::lock_guard lock(mu);
    left_behind = comm.status();
    return comm;
  });
  // Member 1 reads the others' host names but not their addresses: it
  // publishes its own and gives up before it connects, closing its port.
  std::thread dying([&]() {
    ReadThrough store(shared, [&](const std::string& key, Micros timeout) {
      if (key.find("/rank_") != std::string::npos) return shared.Get(key, timeout);
      return StatusOr<std::string>(UnavailableError("member 1 died"));
    });
    CommunicatorOptions options = testing_util::MemberOptions(1, 2, round.rendezvous_prefix());
    EXPECT_FALSE(Communicator::Connect(store, options).ok());
    member_1_died.set_value();  // its pairs, and their ports, are closed
  });

  auto runner = std::make_unique<RoundRunner>(Options(), schedule_, services_, book_, *policy_, 0);
  StatusOr<Outcome> outcome = runner->Run(flight_, []() { return uint64_t{43}; });
  ASSERT_FALSE(outcome.ok());
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kAborted) << outcome.status();
  EXPECT_NE(outcome.status().message().find("learner 'b' is dead"), std::string_view::npos)
      << outcome.status();
  dying.join();
  runner.reset();  // joins the connect, which ends within connect_timeout_ms
  std::lock_guard lock(mu);
  // It returned, and failed: refused by the closed port, or without the
  // peer within connect_timeout_ms.
  ASSERT_TRUE(left_behind.has_value());
  ASSERT_FALSE(left_behind->ok());
  EXPECT_NE(left_behind->message().find("round 7: connecting to the members"),
            std::string_view::npos)
      << *left_behind;
}

// Shutdown calls off a connect in progress too, and any later one before it starts.
TEST_F(RoundRunnerTest, StoppingTheRunnerEndsAConnectInProgressAndStartsNoOther) {
  services_.HoldExchangesFrom(1);
  RoundRunner runner(Options(), schedule_, services_, book_, *policy_, 0);
  std::thread shutdown([&]() {
    ASSERT_TRUE(services_.AwaitConnects(1));
    runner.Stop();
  });
  StatusOr<Outcome> outcome = runner.Run(flight_, []() { return uint64_t{43}; });
  shutdown.join();
  ASSERT_FALSE(outcome.ok());
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(services_.connects_returned(), 0u);
  outcome = runner.Run(flight_, []() { return uint64_t{43}; });
  ASSERT_FALSE(outcome.ok());
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kAborted);
  ASSERT_FALSE(services_.AwaitConnects(2, 0));  // the second round connected to nobody
  services_.ReleaseExchanges();                 // (the runner's end joins the first)
}

// A connect that returned before the call-off gives its communicator: the
// abort watch then calls that off (the key stays set at the lighthouse).
TEST(ConnectThreadsTest, AConnectThatReturnedBeforeTheCallOffGivesItsCommunicator) {
  ConnectThreads threads;
  std::shared_ptr<ConnectThreads::Pending> pending = threads.Start([]() {
    return StatusOr<std::unique_ptr<Communicator>>(std::make_unique<fakes::AloneCommunicator>());
  });
  StatusOr<std::unique_ptr<Communicator>> comm = pending->Await("round 3");
  pending->CallOff("too late");
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ((*comm)->world_size(), 1);
  // A connect's error is the round's, as it was.
  pending = threads.Start([]() -> StatusOr<std::unique_ptr<Communicator>> {
    return DeadlineExceededError("round 3: connecting to the members: Connect timeout");
  });
  EXPECT_EQ(pending->Await("round 3").status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(threads.threads(), 1u);  // the first (it had returned) was joined at the second's start
}

TEST_F(RoundRunnerTest, ARoundWithinTheOuterWarmUpIsAnAverage) {
  services_.SetQuorum(fakes::RoundOfOne(7, 10));  // outer_warmup_steps is the period, 20
  StatusOr<Outcome> outcome = Run();
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_TRUE(outcome->outer_warmup);
  // An average at the commit: theta_g - the merge.
  EXPECT_TRUE(outcome->result.average);
}

// After a heal into a fresh join's state failed halfway (in place), the
// learner's state is its own again: its base its parameters, no momentum,
// no error feedback.
TEST_F(RoundRunnerTest, AStatePartHealedStartsAgainFromTheParameters) {
  const std::vector<float> half_healed = {9.0f, 9.0f, 1.0f, 1.0f};
  book_.at(0).state->Assign(half_healed, std::vector<float>{0.5f, 0.5f, 0.0f, 0.0f});
  book_.at(0).state->AssignResidual(std::vector<float>{0.25f, 0.0f, 0.0f, 0.0f});
  parameters_.values() = {3.0f, 4.0f, 5.0f, 6.0f};
  book_.BaseFromParameters();
  EXPECT_EQ(
      std::vector<float>(book_.at(0).state->global().begin(), book_.at(0).state->global().end()),
      (std::vector<float>{3.0f, 4.0f, 5.0f, 6.0f}));
  for (float m : book_.at(0).state->momentum()) EXPECT_EQ(m, 0.0f);
  EXPECT_TRUE(book_.at(0).state->residual().empty());
  EXPECT_EQ(parameters_.values(), (std::vector<float>{3.0f, 4.0f, 5.0f, 6.0f}));  // (untouched)
}

TEST(FinalMergeTest, TheFinalMergeIsTheRoundOfTheLastStepThatNoBoundaryLaunched) {
  Config config = testing_util::ConcurrentJobConfig(1, 20, 2);
  config.total_steps = 100;
  config.final_merge = true;
  const FragmentSchedule schedule = *FragmentSchedule::Make(1, 20);
  EXPECT_EQ(FinalMergeStep(config), 100u);
  EXPECT_FALSE(MakeRoundOptions(config, schedule).IsFinalMerge(schedule, 99, 0));
  EXPECT_TRUE(MakeRoundOptions(config, schedule).IsFinalMerge(schedule, 100, 0));
  config.concurrent_outer_step = false;  // synchronous: step 100's own round is a boundary's
  EXPECT_FALSE(MakeRoundOptions(config, schedule).IsFinalMerge(schedule, 100, 0));
  config.final_merge = false;
  EXPECT_EQ(FinalMergeStep(config), 0u);
}

}  // namespace
}  // namespace mend::reducer
