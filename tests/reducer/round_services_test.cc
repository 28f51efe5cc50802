// The learner's round services over a real lighthouse and agent
// (reducer/round_services.h): what ends a wait in a round's store.
#include "reducer/round_services.h"

#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "mend/clock.h"
#include "mend/learner_agent.h"
#include "mend/lighthouse.h"
#include "test_util/job_config.h"

namespace mend::reducer {
namespace {

constexpr char kToken[] = "round-services-test-token-0123456789";

// A lighthouse, a learner's agent registered with it, and the learner's
// round services over them (collective_timeout_ms 10 s), with a round's
// store open and one key in it.
struct OneLearner {
  explicit OneLearner(bool train_through_outage) {
    Config config = testing_util::LoopbackJobConfig(1);
    auto started = LighthouseServer::Start(config, kToken, *RealClock());
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return;
    server = std::move(*started);
    config.lighthouse = server->grpc_address();
    auto registered = LearnerAgent::Start(mend::testing_util::AgentOptionsFor(config), kToken,
                                          {"learner-0", "", "", ""}, *RealClock());
    EXPECT_TRUE(registered.ok()) << registered.status();
    if (!registered.ok()) return;
    agent = std::move(*registered);
    services =
        LighthouseRoundServices(*agent, *RealClock(), 10 * kMicrosPerSecond, train_through_outage);
    QuorumResult round;
    round.set_round_id(1);
    round.set_rendezvous_prefix("job/round/1/");
    store = services->OpenRendezvous(round);
    EXPECT_TRUE(store->Set("job/round/1/there", "v").ok());
  }
  bool ok() const { return store != nullptr; }

  std::unique_ptr<LighthouseServer> server;
  std::unique_ptr<LearnerAgent> agent;
  std::unique_ptr<RoundServices> services;
  std::unique_ptr<RendezvousStore> store;
};

// A round's connect left behind at shutdown may be waiting in the round's
// store for a member that never publishes (it died after the round formed).
// Calling the learner's rounds off (Interrupt, as shutdown does) ends that
// wait with ABORTED instead of letting it run out collective_timeout_ms
// (600 s here: without it the test would hang until ctest's timeout).
TEST(LighthouseRoundServicesTest, CallingTheRoundsOffEndsAWaitInTheRoundsStore) {
  OneLearner learner(false);
  ASSERT_TRUE(learner.ok());
  // A key that is there is read as it is.
  auto there = learner.store->Get("job/round/1/there", 600 * kMicrosPerSecond);
  ASSERT_TRUE(there.ok()) << there.status();
  EXPECT_EQ(*there, "v");

  std::optional<StatusOr<std::string>> waited;
  std::thread waiter(
      [&]() { waited.emplace(learner.store->Get("job/round/1/never", 600 * kMicrosPerSecond)); });
  learner.services->Interrupt();
  waiter.join();
  ASSERT_TRUE(waited.has_value());
  EXPECT_EQ(waited->status().code(), StatusCode::kAborted) << waited->status();
  EXPECT_NE(std::string(waited->status().message()).find("called off"), std::string::npos)
      << waited->status();
  learner.server->Shutdown();
}

// A lighthouse that dies while a round is at its rendezvous: the round
// cannot meet before it is back (and a restarted one has lost its keys).
// Training through outages, the wait in the round's store ends once the
// agent has lost the lighthouse, with UNAVAILABLE saying why, instead of
// waiting out its timeout (600 s here: without it the test would hang
// until ctest's timeout); without that option it goes on waiting, to its
// timeout (2 s here).
TEST(LighthouseRoundServicesTest,
     TrainingThroughOutagesAWaitInTheRoundsStoreEndsOnceTheLighthouseIsLost) {
  for (const bool train_through : {true, false}) {
    SCOPED_TRACE(train_through);
    OneLearner learner(train_through);
    ASSERT_TRUE(learner.ok());
    learner.server->Shutdown();
    auto waited =
        learner.store->Get("job/round/1/never", (train_through ? 600 : 2) * kMicrosPerSecond);
    ASSERT_FALSE(waited.ok());
    const std::string message(waited.status().message());
    if (train_through) {
      EXPECT_EQ(waited.status().code(), StatusCode::kUnavailable) << waited.status();
      EXPECT_NE(message.find("train_through_lighthouse_outage"), std::string::npos) << message;
      EXPECT_TRUE(learner.agent->lighthouse_lost());
    } else {
      EXPECT_EQ(message.find("train_through_lighthouse_outage"), std::string::npos) << message;
    }
    learner.agent->Stop();
  }
}

}  // namespace
}  // namespace mend::reducer
