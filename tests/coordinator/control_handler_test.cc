// ControlHandler on a fake clock: the rules both control channels follow.
#include "coordinator/control_handler.h"

#include <memory>
#include <string>

#include "coordinator/validation.h"
#include "core_harness.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "mend/lighthouse_client.h"
#include "wire/datagram.h"
#include "wire/protocol_rules.h"

namespace mend::coordinator {
namespace {

using testing::CoreHarness;
using ::testing::HasSubstr;

v1::HeartbeatRequest Beat(CoreHarness& harness, const std::string& id) {
  v1::HeartbeatRequest request;
  request.mutable_learner()->set_learner_id(id);
  request.mutable_learner()->set_session_id(harness.session(id));
  request.set_step(10);
  request.add_step_time_us(100'000);
  return request;
}

TEST(ControlHandlerTest, AcknowledgesTheFirstHeartbeatChangesAndEveryAckInterval) {
  LighthouseOptions options = CoreHarness::Options(2, 1000);
  options.ack_interval = 500 * kMicrosPerMilli;
  CoreHarness harness(options);
  harness.Register("a");
  ControlHandler handler(&harness.core());
  ControlHandler::AckState state;
  auto first = handler.Heartbeat(Beat(harness, "a"));
  ASSERT_TRUE(first.ok()) << first.status();
  auto ack = handler.AckDue(state, *first);
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->lighthouse_instance(), 7u);
  harness.clock().AdvanceMillis(100);
  EXPECT_FALSE(handler.AckDue(state, *handler.Heartbeat(Beat(harness, "a"))).has_value());
  // A changed slow flag is answered at once, whatever the interval.
  HeartbeatResult slow = *handler.Heartbeat(Beat(harness, "a"));
  slow.slow = true;
  auto flagged = handler.AckDue(state, slow);
  ASSERT_TRUE(flagged.has_value());
  EXPECT_TRUE(flagged->slow());
  EXPECT_FALSE(handler.AckDue(state, slow).has_value());
  harness.clock().AdvanceMillis(500);
  EXPECT_TRUE(handler.AckDue(state, slow).has_value());  // the interval passed
}

TEST(ControlHandlerTest, RefusesOutOfBoundsFieldsByNameAndUnknownSessionsForRegistration) {
  CoreHarness harness(CoreHarness::Options(2, 1000));
  harness.Register("a");
  ControlHandler handler(&harness.core());
  v1::HeartbeatRequest bad = Beat(harness, "a");
  bad.add_step_time_us(0);
  auto refused = handler.Heartbeat(bad);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("step_time_us"));
  v1::HeartbeatRequest stranger = Beat(harness, "a");
  stranger.mutable_learner()->set_session_id(harness.session("a") + 1);
  // A session of a known id that is not its current one: another process
  // holds the id (the caller stops), not "register again".
  EXPECT_TRUE(wire::Superseded(handler.Heartbeat(stranger).status().code()));
  v1::HeartbeatRequest unknown = Beat(harness, "a");
  unknown.mutable_learner()->set_learner_id("nobody");
  EXPECT_TRUE(wire::NeedsRegistration(handler.Heartbeat(unknown).status().code()));

  v1::QuorumRequest join;
  *join.mutable_learner() = Beat(harness, "a").learner();
  join.set_timeout_ms(0);  // a join must say how long it waits
  bool called = false;
  auto waiting = handler.Quorum(join, [&](StatusOr<RoundAssignment>) { called = true; });
  EXPECT_EQ(waiting.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(waiting.status().message()), HasSubstr("timeout_ms"));
  EXPECT_FALSE(called);
}

TEST(ControlHandlerTest, ADatagramDecisionCutsHealToToFitAndKeepsTheRest) {
  auto round = std::make_shared<Round>();
  round->id = 12;
  round->rendezvous_prefix = "job/round/0000000000000007/12/";
  round->closed_by = "all_joined";
  round->grace_window = 250 * kMicrosPerMilli;
  MemberInfo source;
  source.id = "source";
  round->members.push_back(source);
  std::vector<std::string>& behind = round->heal_to["source"];
  for (int i = 0; i < 500; ++i) behind.push_back(std::string(100, 'b') + std::to_string(i));
  v1::DatagramDecision decision =
      MakeDatagramDecision(3, RoundAssignment{round, 0}, datagram::kMaxBodyBytes);
  EXPECT_LE(decision.ByteSizeLong(), datagram::kMaxBodyBytes);
  EXPECT_GT(decision.round().heal_to_size(), 0);
  EXPECT_LT(decision.round().heal_to_size(), 500);
  EXPECT_EQ(decision.round().heal_to(0), behind[0]);  // cut from the end
  EXPECT_EQ(decision.join_id(), 3u);
  EXPECT_EQ(decision.round().rendezvous_prefix(), round->rendezvous_prefix);
  EXPECT_EQ(decision.round().grace_window_ms(), 250u);
  EXPECT_EQ(decision.round().members_size(), 0);  // member lists are gRPC's

  v1::DatagramDecision error =
      MakeDatagramDecision(4, DeadlineExceededError("no round within 30000 ms"), 64);
  EXPECT_EQ(error.code(), static_cast<uint32_t>(StatusCode::kDeadlineExceeded));
  EXPECT_FALSE(error.has_round());
}

// What the lighthouse reads of a registration's hosts: which data-plane
// hosts are loopback, and which host the call came from.
TEST(ValidationTest, LoopbackDataPlaneHostsAndPeerHosts) {
  for (const char* loopback : {"127.0.0.1", "127.1.2.3:5000", "localhost", "localhost:1", "::1",
                               "[::1]:9", "::ffff:127.0.0.1"}) {
    EXPECT_TRUE(IsLoopbackHost(loopback)) << loopback;
  }
  for (const char* routable :
       {"10.0.0.5", "10.0.0.5:80", "host.example", "::2", "[fe80::1]:9", "128.0.0.1", ""}) {
    EXPECT_FALSE(IsLoopbackHost(routable)) << routable;
  }
  const std::vector<std::string> local = {"10.0.0.5"};
  EXPECT_EQ(PeerHost("ipv4:127.0.0.1:41234", local), "local");
  EXPECT_EQ(PeerHost("ipv6:[::1]:41234", local), "local");
  EXPECT_EQ(PeerHost("ipv4:10.0.0.5:41234", local), "local");  // one of the lighthouse's own
  EXPECT_EQ(PeerHost("ipv6:[::ffff:10.0.0.6]:41234", local), "10.0.0.6");
  EXPECT_EQ(PeerHost("ipv4:10.0.0.6:41234", local), "10.0.0.6");
  EXPECT_EQ(PeerHost("unix:/tmp/socket", local), "local");
  EXPECT_EQ(PeerHost("something else", local), "");

  v1::RegisterRequest request;
  request.set_learner_id("a");
  request.add_rank_addresses("10.0.0.5");
  request.add_rank_addresses("127.0.0.1");
  request.set_group_size(2);
  auto args = ParseRegister(request);
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->loopback_host, "127.0.0.1");
  request.set_rank_addresses(1, "10.0.0.6");
  EXPECT_EQ(ParseRegister(request)->loopback_host, "");
}

}  // namespace
}  // namespace mend::coordinator
