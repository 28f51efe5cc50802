// The lighthouse over real gRPC on loopback (port 0), in one process:
// authentication, request validation, the store, rounds among learner
// agents, TLS, and a restart that agents ride over.
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>

#include "core/subprocess.h"
#include "fmt/format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "learner/datagram_client.h"
#include "mend/learner_agent.h"
#include "mend/lighthouse.h"
#include "mend/lighthouse_client.h"
#include "nlohmann/json.hpp"
#include "test_util/job_config.h"
#include "test_util/wait.h"

namespace mend {
namespace {

using ::testing::HasSubstr;

constexpr char kToken[] = "test-token-0123456789";

Config TestConfig() {
  Config config;
  config.job_id = "job";
  config.bind = "127.0.0.1:0";
  config.http = "";
  config.quorum_min_learners = 2;
  config.grace_window_ms = 2000;
  config.heartbeat_ms = 50;
  config.heartbeat_timeout_ms = 1000;
  config.rpc_timeout_ms = 5000;
  return config;
}

std::unique_ptr<LighthouseServer> StartServer(const Config& config) {
  auto server = LighthouseServer::Start(config, kToken, *RealClock());
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

std::unique_ptr<LighthouseClient> Connect(const std::string& address,
                                          const std::string& token = kToken,
                                          const std::string& ca_file = "") {
  LighthouseClientOptions options;
  options.address = address;
  options.token = token;
  options.tls_ca_file = ca_file;
  options.rpc_timeout = 5 * kMicrosPerSecond;
  auto client = LighthouseClient::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return std::move(*client);
}

TEST(LighthouseServerTest, WrongOrMissingTokenIsUnauthenticatedAndServerKeepsServing) {
  auto server = StartServer(TestConfig());
  auto wrong = Connect(server->grpc_address(), "not-the-token-at-all");
  auto registered = wrong->Register({"a", "job", "", ""}, 0, 0);
  EXPECT_EQ(registered.status().code(), StatusCode::kUnauthenticated);
  EXPECT_THAT(std::string(registered.status().message()), HasSubstr("wrong job token"));
  EXPECT_EQ(wrong->StoreSet("k", "v").code(), StatusCode::kUnauthenticated);
  auto right = Connect(server->grpc_address());
  EXPECT_TRUE(right->Register({"a", "job", "", ""}, 0, 0).ok());
  auto status = nlohmann::json::parse(*right->StatusJson());
  bool recorded = false;
  for (const auto& event : status["events"]) recorded |= event["kind"] == "rejected";
  EXPECT_TRUE(recorded);
}

TEST(LighthouseServerTest, BadRequestsAreInvalidArgumentNamingTheField) {
  auto server = StartServer(TestConfig());
  auto client = Connect(server->grpc_address());
  auto bad_id = client->Register({"has space", "job", "", ""}, 0, 0);
  EXPECT_EQ(bad_id.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad_id.status().message()), HasSubstr("learner_id"));
  auto long_id = client->Register({std::string(200, 'x'), "job", "", ""}, 0, 0);
  EXPECT_EQ(long_id.status().code(), StatusCode::kInvalidArgument);
  auto other_job = client->Register({"a", "other", "", ""}, 0, 0);
  EXPECT_EQ(other_job.status().code(), StatusCode::kInvalidArgument);
  auto bad_address = client->Register({"a", "job", "", "nowhere"}, 0, 0);
  EXPECT_EQ(bad_address.status().code(), StatusCode::kInvalidArgument);
  LearnerIdentity group{"g", "job", "", "", 2, {"10.0.0.1"}};
  auto one_address_for_two = client->Register(group, 0, 0);
  EXPECT_EQ(one_address_for_two.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(one_address_for_two.status().message()),
              HasSubstr("rank_addresses: 1 addresses for group_size = 2"));
  group.rank_addresses = {"10.0.0.1", "bad host"};
  auto bad_rank_address = client->Register(group, 0, 0);
  EXPECT_EQ(bad_rank_address.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad_rank_address.status().message()), HasSubstr("rank_addresses[1]"));
  LearnerIdentity unkeyed{"k", "job", "", ""};
  unkeyed.job_settings = {"fragments=1", "=2"};
  auto bad_setting = client->Register(unkeyed, 0, 0);
  EXPECT_EQ(bad_setting.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad_setting.status().message()), HasSubstr("job_settings[1]"));
  v1::QuorumRequest no_session;
  no_session.mutable_learner()->set_learner_id("a");
  SetJoinTimeout(no_session, kMicrosPerSecond);
  auto quorum = client->Quorum(no_session);
  EXPECT_EQ(quorum.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(quorum.status().message()), HasSubstr("session_id"));
  EXPECT_EQ(client->StoreSet(std::string(600, 'k'), "v").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client->StoreSet("", "v").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client->StoreWait({}, kMicrosPerSecond).code(), StatusCode::kInvalidArgument);
  // Still serving.
  EXPECT_TRUE(client->Register({"a", "job", "", ""}, 0, 0).ok());
}

TEST(LighthouseServerTest, UnknownSessionIsNotFound) {
  auto server = StartServer(TestConfig());
  auto client = Connect(server->grpc_address());
  v1::QuorumRequest request;
  request.mutable_learner()->set_learner_id("ghost");
  request.mutable_learner()->set_session_id(42);
  SetJoinTimeout(request, kMicrosPerSecond);
  EXPECT_EQ(client->Quorum(request).status().code(), StatusCode::kNotFound);
}

// The datagram channel's side of the two tests above: the same checks (the
// handler's), answered on the channel.
TEST(LighthouseServerTest, ADatagramJoinOutOfBoundsIsRefusedNamingTheFieldAndRecorded) {
  Config config = TestConfig();
  config.control_plane = ControlPlane::kUdp;
  auto server = StartServer(config);
  auto client = Connect(server->grpc_address());
  auto registered = client->Register({"a", "job", "", ""}, 0, 0);
  ASSERT_TRUE(registered.ok()) << registered.status();
  // Before the channel, so that they outlive its receiving thread.
  std::mutex mu;
  std::optional<v1::DatagramDecision> decision;
  auto channel = coordinator::DatagramClient::Open("127.0.0.1", server->udp_port(), kToken);
  ASSERT_TRUE(channel.ok()) << channel.status();
  coordinator::DatagramClient::Callbacks callbacks;
  callbacks.on_decision = [&](const v1::DatagramDecision& d) {
    std::lock_guard lock(mu);
    decision = d;
  };
  (*channel)->Attach(registered->session_id, std::move(callbacks));
  v1::DatagramJoin join;
  join.set_join_id(1);
  join.mutable_request()->set_step(uint64_t{1} << 63);  // above the counters' bound
  join.mutable_request()->set_timeout_ms(1000);
  // Sent again until answered, as a learner does (a datagram may be lost).
  ASSERT_TRUE(testing_util::WaitFor(10 * kMicrosPerSecond, [&]() {
    (*channel)->SendJoins({{registered->session_id, join}});
    std::lock_guard lock(mu);
    return decision.has_value();
  }));
  v1::DatagramDecision got;  // (a resent decision may still arrive meanwhile)
  {
    std::lock_guard lock(mu);
    got = *decision;
  }
  EXPECT_EQ(got.join_id(), 1u);
  EXPECT_EQ(got.code(), static_cast<uint32_t>(StatusCode::kInvalidArgument));
  EXPECT_THAT(got.message(), HasSubstr("step"));
  const auto doc = nlohmann::json::parse(server->StatusJson());
  bool recorded = false;
  for (const auto& event : doc["events"]) {
    recorded |= event["kind"] == "rejected" &&
                event["message"].get<std::string>().find("step") != std::string::npos;
  }
  EXPECT_TRUE(recorded);
}

TEST(LighthouseServerTest, AnUnknownDatagramSessionIsToldToRegisterAgain) {
  Config config = TestConfig();
  config.control_plane = ControlPlane::kUdp;
  auto server = StartServer(config);
  std::atomic<bool> told{false};  // (declared first: it outlives the channel's receiving thread)
  auto channel = coordinator::DatagramClient::Open("127.0.0.1", server->udp_port(), kToken);
  ASSERT_TRUE(channel.ok()) << channel.status();
  coordinator::DatagramClient::Callbacks callbacks;
  callbacks.on_session_ended = [&](const Status& why) {
    if (why.code() == StatusCode::kNotFound) told = true;
  };
  (*channel)->Attach(42, std::move(callbacks));
  v1::HeartbeatRequest beat;
  beat.set_step(1);
  EXPECT_TRUE(testing_util::WaitFor(10 * kMicrosPerSecond, [&]() {
    (*channel)->SendHeartbeats({{42, beat}});
    return told.load();
  }));
}

// A session that a newer registration of its id replaced is told so, on
// either channel, and not told to register again (that would replace the
// newer process in turn, without end).
TEST(LighthouseServerTest, ASupersededSessionIsToldSoOnEitherChannel) {
  Config config = TestConfig();
  config.control_plane = ControlPlane::kUdp;
  auto server = StartServer(config);
  auto client = Connect(server->grpc_address());
  auto first = client->Register({"a", "job", "", ""}, 0, 0);
  auto second = client->Register({"a", "job", "", ""}, 0, 0);
  ASSERT_TRUE(first.ok() && second.ok());
  v1::QuorumRequest request;
  request.mutable_learner()->set_learner_id("a");
  request.mutable_learner()->set_session_id(first->session_id);
  SetJoinTimeout(request, kMicrosPerSecond);
  auto stale = client->Quorum(request);
  EXPECT_EQ(stale.status().code(), StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(stale.status().message()),
              HasSubstr("another process registered as learner 'a'"));

  std::atomic<int> code{-1};  // (declared first: it outlives the channel's receiving thread)
  auto channel = coordinator::DatagramClient::Open("127.0.0.1", server->udp_port(), kToken);
  ASSERT_TRUE(channel.ok()) << channel.status();
  coordinator::DatagramClient::Callbacks callbacks;
  callbacks.on_session_ended = [&](const Status& why) { code = static_cast<int>(why.code()); };
  (*channel)->Attach(first->session_id, std::move(callbacks));
  v1::HeartbeatRequest beat;
  beat.set_step(1);
  EXPECT_TRUE(testing_util::WaitFor(10 * kMicrosPerSecond, [&]() {
    (*channel)->SendHeartbeats({{first->session_id, beat}});
    return code.load() >= 0;
  }));
  EXPECT_EQ(code.load(), static_cast<int>(StatusCode::kAlreadyExists));
}

TEST(LighthouseServerTest, StoreSetGetAddWaitDeleteOverGrpc) {
  auto server = StartServer(TestConfig());
  auto client = Connect(server->grpc_address());
  EXPECT_EQ(client->StoreGet("missing", 0).status().code(), StatusCode::kNotFound);
  std::thread setter(
      [&]() { EXPECT_TRUE(Connect(server->grpc_address())->StoreSet("late", "v").ok()); });
  auto late = client->StoreGet("late", 10 * kMicrosPerSecond);
  setter.join();
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(*late, "v");
  EXPECT_EQ(*client->StoreAdd("n", 5), 5);
  EXPECT_EQ(*client->StoreAdd("n", -2), 3);
  auto timeout = client->StoreWait({"late", "never"}, 200 * kMicrosPerMilli);
  EXPECT_EQ(timeout.code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(timeout.message()), HasSubstr("'never'"));
  EXPECT_EQ(*client->StoreDelete("la", true), 1u);
  EXPECT_EQ(client->StoreGet("late", 0).status().code(), StatusCode::kNotFound);
  std::string binary(100000, '\0');
  binary[5] = '\xff';
  ASSERT_TRUE(client->StoreSet("blob", binary).ok());
  EXPECT_EQ(*client->StoreGet("blob", 0), binary);
}

// A long poll ends when its owner cancels it, not at its timeout (a minute
// here: the test would outlast ctest's limit if the cancel were lost), and
// the lighthouse keeps serving the key to others.
TEST(LighthouseServerTest, StoreGetCancellableEndsWhenCancelled) {
  auto server = StartServer(TestConfig());
  auto client = Connect(server->grpc_address());
  CallCanceller before;
  before.Cancel();
  EXPECT_EQ(client->StoreGetCancellable("k", 60 * kMicrosPerSecond, before).status().code(),
            StatusCode::kCancelled);

  CallCanceller poll;
  StatusOr<std::string> polled = InternalError("not run");
  std::thread poller(
      [&]() { polled = client->StoreGetCancellable("k", 60 * kMicrosPerSecond, poll); });
  poll.Cancel();
  poller.join();
  EXPECT_EQ(polled.status().code(), StatusCode::kCancelled) << polled.status();

  CallCanceller unused;
  std::thread setter(
      [&]() { EXPECT_TRUE(Connect(server->grpc_address())->StoreSet("k", "v").ok()); });
  auto got = client->StoreGetCancellable("k", 60 * kMicrosPerSecond, unused);
  setter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "v");
}

// Runs `agents` through `rounds` rounds on threads; returns each agent's results.
// A round that fails is a fatal failure (on its thread) and leaves that agent
// short of results: callers check HasFatalFailure() before reading them.
std::vector<std::vector<QuorumResult>> RunRounds(std::vector<std::unique_ptr<LearnerAgent>>& agents,
                                                 int rounds, bool include_members = true) {
  std::vector<std::vector<QuorumResult>> results(agents.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < agents.size(); ++i) {
    threads.emplace_back([&, i]() {
      uint64_t last = 0;
      for (int r = 0; r < rounds; ++r) {
        agents[i]->RecordStep(static_cast<uint64_t>(r + 1), 100 * (i + 1), 10'000);
        auto result =
            agents[i]->Quorum(last, 100 * (i + 1), 20 * kMicrosPerSecond, include_members);
        ASSERT_TRUE(result.ok()) << result.status();
        last = result->round_id();
        results[i].push_back(*result);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return results;
}

std::vector<std::unique_ptr<LearnerAgent>> StartAgents(const Config& config,
                                                       const std::vector<std::string>& ids) {
  std::vector<std::unique_ptr<LearnerAgent>> agents;
  for (const auto& id : ids) {
    auto agent = LearnerAgent::Start(mend::testing_util::AgentOptionsFor(config), kToken,
                                     {id, "", "", ""}, *RealClock());
    EXPECT_TRUE(agent.ok()) << agent.status();
    agents.push_back(std::move(*agent));
  }
  return agents;
}

// The learner-facing tests run over both control transports.
class AgentTransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  Config AgentConfig() {
    Config config = TestConfig();
    EXPECT_TRUE(SetConfigValue(config, "control_plane", GetParam(), "test").ok());
    return config;
  }
};

INSTANTIATE_TEST_SUITE_P(Transports, AgentTransportTest, ::testing::Values("grpc", "udp"));

// A learner started with another round schedule than the job's is refused
// at its start, the key named, rather than pairing its rounds with the
// others' by number.
TEST_P(AgentTransportTest, AnAgentWithAnotherRoundScheduleIsRefusedAtItsStart) {
  Config config = AgentConfig();
  auto server = StartServer(config);
  config.lighthouse = server->grpc_address();
  config.sync_period_steps = 5;
  auto agents = StartAgents(config, {"a", "b"});
  ASSERT_EQ(agents.size(), 2u);
  Config other = config;
  other.sync_period_steps = 10;
  auto refused = LearnerAgent::Start(mend::testing_util::AgentOptionsFor(other), kToken,
                                     {"c", "", "", ""}, *RealClock());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("sync_period_steps = 10 (this job's learners have 5)"));
  // What only paces a learner may differ.
  Config paced = config;
  paced.concurrent_outer_step = !config.concurrent_outer_step;
  paced.round_threads = 3;
  auto accepted = LearnerAgent::Start(mend::testing_util::AgentOptionsFor(paced), kToken,
                                      {"d", "", "", ""}, *RealClock());
  EXPECT_TRUE(accepted.ok()) << accepted.status();
}

// Two processes given one learner id: the newer registration keeps it and
// the older agent stops with ALREADY_EXISTS, told by its heartbeats, rather
// than registering again and replacing the newer one in turn (which went on
// without end and aborted every round of the job). The job goes on.
TEST_P(AgentTransportTest, TheOlderOfTwoAgentsOfOneIdStopsAndTheNewerTrains) {
  Config config = AgentConfig();
  auto server = StartServer(config);
  config.lighthouse = server->grpc_address();
  auto agents = StartAgents(config, {"a", "b"});
  ASSERT_EQ(agents.size(), 2u);
  auto newer = LearnerAgent::Start(mend::testing_util::AgentOptionsFor(config), kToken,
                                   {"a", "", "", ""}, *RealClock());
  ASSERT_TRUE(newer.ok()) << newer.status();
  ASSERT_TRUE(testing_util::WaitFor(20 * kMicrosPerSecond,
                                    [&]() { return !agents[0]->fatal_status().ok(); }));
  const Status stopped = agents[0]->fatal_status();
  EXPECT_EQ(stopped.code(), StatusCode::kAlreadyExists) << stopped;
  EXPECT_THAT(std::string(stopped.message()), HasSubstr("give every learner its own id"));
  EXPECT_EQ(agents[0]->Quorum(0, 100, kMicrosPerSecond, false).status().code(),
            StatusCode::kAlreadyExists);
  agents[0] = std::move(*newer);
  auto results = RunRounds(agents, 2, /*include_members=*/false);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(results[0][1].world_size(), 2u);
  EXPECT_TRUE(agents[0]->fatal_status().ok()) << agents[0]->fatal_status();
}

TEST_P(AgentTransportTest, AgentsFormRoundsWithRanksAndTokenTotals) {
  Config config = AgentConfig();
  auto server = StartServer(config);
  config.lighthouse = server->grpc_address();
  auto agents = StartAgents(config, {"b", "c", "a"});
  auto results = RunRounds(agents, 3, /*include_members=*/false);
  ASSERT_FALSE(HasFatalFailure());
  // The prefixes carry the lighthouse's instance: a restarted one's round N
  // is not the old one's.
  const std::string instance =
      nlohmann::json::parse(server->StatusJson())["lighthouse_instance"].get<std::string>();
  ASSERT_EQ(instance.size(), 16u);
  for (int r = 0; r < 3; ++r) {
    const QuorumResult& from_b = results[0][static_cast<size_t>(r)];
    EXPECT_EQ(from_b.round_id(), static_cast<uint64_t>(r + 1));
    EXPECT_EQ(from_b.world_size(), 3u);
    EXPECT_EQ(from_b.rank(), 1u);
    EXPECT_EQ(from_b.total_tokens(), 600u);
    EXPECT_EQ(from_b.step(),
              static_cast<uint64_t>(r + 1));  // the round's step travels with the decision
    EXPECT_EQ(from_b.rendezvous_prefix(),
              "job/round/" + instance + "/" + std::to_string(r + 1) + "/");
    EXPECT_EQ(results[2][static_cast<size_t>(r)].rank(), 0u);  // "a"
    EXPECT_EQ(results[1][static_cast<size_t>(r)].rank(), 2u);  // "c"
    // A decision field reaches every member over either channel: the
    // adaptive grace window, between its floor and the configured window.
    EXPECT_GE(from_b.grace_window_ms(), config.grace_window_min_ms);
    EXPECT_LE(from_b.grace_window_ms(), config.grace_window_ms);
    EXPECT_EQ(results[1][static_cast<size_t>(r)].grace_window_ms(), from_b.grace_window_ms());
  }
  for (auto& agent : agents) EXPECT_TRUE(agent->Leave("done").ok());
}

// A join sent after its learner trained on (its round's thread ran late on
// a busy machine) is for its boundary: the round's step is the members'
// largest boundary, not the step they had reached, so that a learner left
// out of a later boundary's round does not read this one as that.
TEST_P(AgentTransportTest, AJoinSentLateIsForItsBoundaryStep) {
  Config config = AgentConfig();
  auto server = StartServer(config);
  config.lighthouse = server->grpc_address();
  auto agents = StartAgents(config, {"a", "b"});
  std::vector<StatusOr<QuorumResult>> results(2, AbortedError("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < 2; ++i) {
    threads.emplace_back([&, i]() {
      agents[i]->RecordStep(10 + i, 100, 10'000);  // two steps past boundary 8, and three
      results[i] = agents[i]->Quorum(0, 100, 20 * kMicrosPerSecond, false, /*boundary_step=*/8);
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& result : results) {
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->step(), 8u);
  }
  for (auto& agent : agents) EXPECT_TRUE(agent->Leave("done").ok());
}

// A join left alone once the other learner left (a quorum needs two) is
// reported short of a quorum through the heartbeat acknowledgements.
TEST_P(AgentTransportTest, AJoinLeftAloneIsReportedShortOfAQuorum) {
  Config config = AgentConfig();
  config.quorum_min_learners = 2;
  auto server = StartServer(config);
  config.lighthouse = server->grpc_address();
  auto agents = StartAgents(config, {"a", "b"});
  ASSERT_TRUE(agents[1]->Leave("done").ok());
  StatusOr<QuorumResult> result = AbortedError("not run");
  std::thread join([&]() { result = agents[0]->Quorum(0, 100, 60 * kMicrosPerSecond, false, 8); });
  EXPECT_TRUE(
      testing_util::WaitFor(30 * kMicrosPerSecond, [&]() { return agents[0]->short_of_quorum(); }));
  agents[0]->Interrupt();
  join.join();
  EXPECT_EQ(result.status().code(), StatusCode::kAborted);
  EXPECT_TRUE(agents[0]->Leave("done").ok());
}

// Member lists are gRPC's: a join that asks for one takes that channel
// whatever the learner's control plane.
TEST_P(AgentTransportTest, MemberListsComeOverGrpcOnRequest) {
  Config config = AgentConfig();
  auto server = StartServer(config);
  config.lighthouse = server->grpc_address();
  auto agents = StartAgents(config, {"b", "a"});
  auto results = RunRounds(agents, 1);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_EQ(results[0][0].members().size(), 2u);
  EXPECT_EQ(results[0][0].members()[0].learner_id(), "a");
  EXPECT_EQ(results[0][0].members()[1].learner_id(), "b");
}

TEST_P(AgentTransportTest, HeartbeatsReachTheLighthouse) {
  Config config = AgentConfig();
  auto server = StartServer(config);
  config.lighthouse = server->grpc_address();
  auto agents = StartAgents(config, {"a"});
  agents[0]->RecordStep(7, 1000, 20'000);
  auto client = Connect(server->grpc_address());
  bool seen = testing_util::WaitFor(10 * kMicrosPerSecond, [&]() {
    auto doc = nlohmann::json::parse(*client->StatusJson());
    return doc["learners"].size() == 1 && doc["learners"][0]["step"] == 7 &&
           doc["learners"][0]["median_step_ms"] == 20.0;
  });
  EXPECT_TRUE(seen) << *client->StatusJson();
}

TEST_P(AgentTransportTest, AgentsReRegisterAfterLighthouseRestartAndRoundIdsKeepGrowing) {
  Config config = AgentConfig();
  auto server = StartServer(config);
  config.bind = server->grpc_address();  // restart on the same port
  config.lighthouse = server->grpc_address();
  auto agents = StartAgents(config, {"a", "b"});
  auto before = RunRounds(agents, 2, /*include_members=*/false);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(before[0].back().round_id(), 2u);
  server->Shutdown(0);
  server.reset();
  server = StartServer(config);
  ASSERT_NE(server, nullptr);
  // Agents notice (heartbeat stream or Quorum gets NOT_FOUND) and register again.
  std::vector<std::vector<QuorumResult>> after(2);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < 2; ++i) {
    threads.emplace_back([&, i]() {
      auto result = agents[i]->Quorum(2, 10, 20 * kMicrosPerSecond, false);
      EXPECT_TRUE(result.ok() && result->members().empty());
      ASSERT_TRUE(result.ok()) << result.status();
      after[i].push_back(*result);
    });
  }
  for (auto& thread : threads) thread.join();
  ASSERT_EQ(after[0].size(), 1u);
  EXPECT_EQ(after[0][0].round_id(), 3u);
  EXPECT_EQ(after[0][0].world_size(), 2u);
  for (auto& agent : agents) EXPECT_GE(agent->registrations(), 2u);
}

// The fallback rule: a learner on the datagram plane whose lighthouse
// serves none (control_plane = "grpc" there) speaks gRPC.
TEST(LighthouseServerTest, AUdpLearnerOfAGrpcOnlyLighthouseFormsRoundsOverGrpc) {
  Config config = TestConfig();
  auto server = StartServer(config);
  ASSERT_EQ(server->udp_port(), 0);
  config.lighthouse = server->grpc_address();
  config.control_plane = ControlPlane::kUdp;
  auto agents = StartAgents(config, {"a", "b"});
  auto results = RunRounds(agents, 2, /*include_members=*/false);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(results[0][1].round_id(), 2u);
  for (auto& agent : agents) EXPECT_TRUE(agent->Leave("done").ok());
}

TEST(LighthouseServerTest, TlsServesClientsThatTrustItsCertificate) {
  std::string dir = testing_util::MakeTempDir();
  std::string cert = dir + "/cert.pem";
  std::string key = dir + "/key.pem";
  auto openssl = Subprocess::Spawn(
      {{"/usr/bin/openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
        "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", key,
        "-out", cert},
       {},
       "/dev/null",
       "/dev/null",
       false});
  ASSERT_TRUE(openssl.ok()) << openssl.status();
  auto exited = (*openssl)->Wait(60 * kMicrosPerSecond);
  ASSERT_TRUE(exited.ok() && *exited == 0);
  Config config = TestConfig();
  config.tls_cert_file = cert;
  config.tls_key_file = key;
  auto server = StartServer(config);
  auto trusted = Connect(server->grpc_address(), kToken, cert);
  EXPECT_TRUE(trusted->StoreSet("k", "v").ok());
  auto plaintext = Connect(server->grpc_address());
  EXPECT_EQ(plaintext->StoreSet("k", "v").code(), StatusCode::kUnavailable);
  std::filesystem::remove_all(dir);
}

// A TLS file that cannot be read, holds no PEM, or a key of another
// certificate: refused with the key and the file named (not gRPC's failure
// to listen, which reads like a port in use).
TEST(LighthouseServerTest, BadTlsFilesAreRefusedNamingTheFile) {
  std::string dir = testing_util::MakeTempDir();
  auto openssl = [](std::vector<std::string> argv) {
    argv.insert(argv.begin(), "/usr/bin/openssl");
    auto child = Subprocess::Spawn({argv, {}, "/dev/null", "/dev/null", false});
    ASSERT_TRUE(child.ok()) << child.status();
    auto exited = (*child)->Wait(60 * kMicrosPerSecond);
    ASSERT_TRUE(exited.ok() && *exited == 0) << fmt::format("{}", fmt::join(argv, " "));
  };
  const std::string cert = dir + "/cert.pem", key = dir + "/key.pem", other = dir + "/other.pem";
  openssl({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
           "-days", "1", "-subj", "/CN=localhost", "-keyout", key, "-out", cert});
  openssl({"genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", other});
  ASSERT_FALSE(HasFatalFailure());
  std::ofstream(dir + "/garbage.pem") << "this is not a certificate\n";
  struct Case {
    std::string cert, key, says;
  };
  for (const Case& c :
       std::vector<Case>{{dir + "/missing.pem", key,
                          "tls_cert_file = \"" + dir + "/missing.pem\": cannot be read"},
                         {dir + "/garbage.pem", key, "no PEM certificate"},
                         {cert, dir + "/garbage.pem", "no unencrypted PEM private key"},
                         {cert, other, "is not the private key of tls_cert_file"}}) {
    Config config = TestConfig();
    config.tls_cert_file = c.cert;
    config.tls_key_file = c.key;
    auto server = LighthouseServer::Start(config, kToken, *RealClock());
    ASSERT_FALSE(server.ok()) << c.says;
    EXPECT_EQ(server.status().code(), StatusCode::kInvalidArgument) << server.status();
    EXPECT_THAT(std::string(server.status().message()), HasSubstr(c.says));
  }
  Config config = TestConfig();  // the matching pair serves
  config.tls_cert_file = cert;
  config.tls_key_file = key;
  EXPECT_TRUE(LighthouseServer::Start(config, kToken, *RealClock()).ok());
  std::filesystem::remove_all(dir);
}

TEST(LighthouseServerTest, DatagramsWithAWrongTokenAreDroppedAndRecorded) {
  Config config = TestConfig();
  config.control_plane = ControlPlane::kUdp;
  auto server = StartServer(config);
  ASSERT_GT(server->udp_port(), 0);
  auto intruder =
      coordinator::DatagramClient::Open("127.0.0.1", server->udp_port(), "not-the-token-at-all");
  ASSERT_TRUE(intruder.ok());
  v1::DatagramJoin join;
  join.set_join_id(1);
  join.mutable_request()->set_timeout_ms(1000);
  (*intruder)->SendJoins({{12345, join}});
  auto client = Connect(server->grpc_address());
  bool recorded = testing_util::WaitFor(10 * kMicrosPerSecond, [&]() {
    auto doc = nlohmann::json::parse(*client->StatusJson());
    for (const auto& event : doc["events"]) {
      if (event["kind"] == "rejected" &&
          event["message"].get<std::string>().find("datagram") != std::string::npos) {
        return true;
      }
    }
    return false;
  });
  EXPECT_TRUE(recorded);
}

TEST(LighthouseServerTest, HttpPortInUseIsAnErrorNamingTheAddress) {
  Config first_config = TestConfig();
  first_config.http = "127.0.0.1:0";
  auto first = StartServer(first_config);
  Config config = TestConfig();
  config.http = first->http_address();
  auto second = LighthouseServer::Start(config, kToken, *RealClock());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr(first->http_address()));
}

TEST(LighthouseServerTest, GrpcPortInUseIsAnErrorNamingTheAddress) {
  auto first = StartServer(TestConfig());
  Config config = TestConfig();
  config.bind = first->grpc_address();
  auto second = LighthouseServer::Start(config, kToken, *RealClock());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr(first->grpc_address()));
}

TEST(LighthouseServerTest, BadConfigIsRefusedBeforeBinding) {
  Config config = TestConfig();
  config.grace_window_ms = -1;
  auto server = LighthouseServer::Start(config, kToken, *RealClock());
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(std::string(server.status().message()), HasSubstr("grace_window_ms"));
}

}  // namespace
}  // namespace mend
