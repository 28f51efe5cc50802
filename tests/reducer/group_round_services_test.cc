// A group's round services (reducer/group_round_services.h) over fake
// services and an in-process store: rank 0 joins and publishes, the other
// ranks read its decision and never ask the lighthouse; and the decision's
// text, both ways.
#include "reducer/group_round_services.h"

#include <memory>
#include <string>
#include <thread>

#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "mend/clock.h"
#include "reducer/round_fakes.h"
#include "test_util/wait.h"

namespace mend::reducer {
namespace {

constexpr char kBase[] = "job/group/a/1.0/";
constexpr Micros kMargin = 5 * kMicrosPerSecond;

// Rank `rank`'s services over its own fakes (`inner`, kept for the test).
std::unique_ptr<RoundServices> RankServices(RendezvousStore& store, const Clock& clock, int rank,
                                            fakes::FakeServices** inner) {
  auto own = std::make_unique<fakes::FakeServices>(clock);
  *inner = own.get();
  return GroupRoundServices(std::move(own), std::make_unique<testing_util::StoreConnection>(store),
                            kBase, rank, kMargin, "learner-a");
}

// Ranks 0 and 1 of one group, each over its own fake services.
class GroupRoundServicesTest : public ::testing::Test {
 protected:
  testing_util::InProcessStore store;
  FakeClock clock;
  fakes::FakeServices *inner0 = nullptr, *inner1 = nullptr;
  std::unique_ptr<RoundServices> rank0 = RankServices(store, clock, 0, &inner0);
  std::unique_ptr<RoundServices> rank1 = RankServices(store, clock, 1, &inner1);
};

TEST_F(GroupRoundServicesTest, EveryRankSeesRankZerosRoundsInOrderAndOnlyRankZeroJoins) {
  for (uint64_t n = 1; n <= 3; ++n) {
    // Rank 1 may ask before rank 0 has published: it waits for the key.
    StatusOr<QuorumResult> seen;
    std::thread reader([&]() { seen = rank1->Quorum(n - 1, 640, 60 * kMicrosPerSecond, 20 * n); });
    StatusOr<QuorumResult> joined = rank0->Quorum(n - 1, 640, 60 * kMicrosPerSecond, 20 * n);
    reader.join();
    ASSERT_TRUE(joined.ok()) << joined.status();
    ASSERT_TRUE(seen.ok()) << seen.status();
    EXPECT_EQ(seen->round_id(), n);
    EXPECT_EQ(seen->step(), 20 * n);
    EXPECT_EQ(seen->rendezvous_prefix(), joined->rendezvous_prefix());
    EXPECT_EQ(seen->members().size(), 1u);
  }
  EXPECT_EQ(inner0->asks().size(), 3u);
  EXPECT_TRUE(inner1->asks().empty());  // the lighthouse hears of the group once
}

TEST_F(GroupRoundServicesTest, RankZerosErrorIsEveryRanksAndAnInterruptEndsAWait) {
  inner0->SetQuorum(DeadlineExceededError("quorum: no round within quorum_timeout_ms = 100"));
  EXPECT_EQ(rank0->Quorum(0, 1, kMicrosPerSecond, 10).status().code(),
            StatusCode::kDeadlineExceeded);
  StatusOr<QuorumResult> seen = rank1->Quorum(0, 1, kMicrosPerSecond, 10);
  EXPECT_EQ(seen.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(std::string(seen.status().message()).find("quorum_timeout_ms = 100"),
            std::string::npos);
  // Rank 1 waits for a second decision that never comes, until interrupted;
  // the interrupt reaches its own services too.
  std::thread reader([&]() { seen = rank1->Quorum(0, 1, 60 * kMicrosPerSecond, 20); });
  rank1->Interrupt();
  reader.join();
  EXPECT_EQ(seen.status().code(), StatusCode::kAborted);
  EXPECT_TRUE(inner1->interrupted());
}

TEST_F(GroupRoundServicesTest, ARankGivesUpOnAMissingDecisionNamingRankZeroAndTheKey) {
  auto own = std::make_unique<fakes::FakeServices>(clock);
  fakes::FakeServices* inner = own.get();
  auto impatient =
      GroupRoundServices(std::move(own), std::make_unique<testing_util::StoreConnection>(store),
                         kBase, 1, /*margin=*/0, "learner-a");
  StatusOr<QuorumResult> seen = impatient->Quorum(0, 1, /*timeout=*/0, 10);
  EXPECT_EQ(seen.status().code(), StatusCode::kDeadlineExceeded);
  const std::string message(seen.status().message());
  EXPECT_NE(message.find("rank 0 of learner 'learner-a'"), std::string::npos) << message;
  EXPECT_NE(message.find("job/group/a/1.0/decision/1"), std::string::npos) << message;
  EXPECT_TRUE(inner->asks().empty());
}

TEST(GroupRoundDecisionTest, ARoundSurvivesItsBytesAndBadBytesAreNamed) {
  QuorumResult round = fakes::RoundOfOne(9, 40);
  round.set_world_size(2);
  round.set_total_tokens(1280);
  round.add_heal_to("learner-b");
  round.set_grace_window_ms(120);
  RoundMember source;
  source.set_learner_id("learner-c");
  source.set_step(40);
  source.set_rack("rack-2");
  source.set_address("10.0.0.3:5000");
  *round.mutable_heal_from() = source;
  *round.add_members() = source;
  StatusOr<QuorumResult> back = DecodeDecision(EncodeDecision(round));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*back, round))
      << back->DebugString() << "\nis not\n"
      << round.DebugString();
  EXPECT_EQ(back->heal_from().address(), "10.0.0.3:5000");

  StatusOr<QuorumResult> error = DecodeDecision(EncodeDecision(AbortedError("called off")));
  EXPECT_EQ(error.status().code(), StatusCode::kAborted);
  EXPECT_EQ(error.status().message(), "called off");

  StatusOr<QuorumResult> bad = DecodeDecision(std::string("\x00\x01", 2));  // field number 0
  EXPECT_EQ(bad.status().code(), StatusCode::kInternal);
  EXPECT_NE(std::string(bad.status().message()).find("does not parse"), std::string::npos);
}

}  // namespace
}  // namespace mend::reducer
