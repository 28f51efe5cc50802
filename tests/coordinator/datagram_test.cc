#include "wire/datagram.h"

#include "gtest/gtest.h"

namespace mend::coordinator::datagram {
namespace {

TEST(DatagramTest, HeartbeatRoundTripsAndVerifies) {
  Signer signer(DeriveKey("job-token-123456"));
  Heartbeat body{42, 1000, 10, {1, 2, 3}};
  std::string bytes = Encode({Kind::kHeartbeat, 0xabc, 7}, body, signer);
  auto header = ParseHeader(bytes);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->kind, Kind::kHeartbeat);
  EXPECT_EQ(header->session_id, 0xabcu);
  EXPECT_EQ(header->seq, 7u);
  EXPECT_TRUE(signer.Verify(bytes));
  auto decoded = DecodeHeartbeat(bytes);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->step, 42u);
  EXPECT_EQ(decoded->step_time_us, (std::vector<uint32_t>{1, 2, 3}));
}

TEST(DatagramTest, DecisionRoundTrips) {
  Signer signer(DeriveKey("job-token-123456"));
  Decision body;
  body.join_id = 9;
  body.round_id = 12;
  body.rank = 3;
  body.world_size = 5;
  body.total_tokens = 1 << 20;
  body.closed_by = "fast_path";
  body.rendezvous_prefix = "job/round/12/";
  body.heal_from_id = "a";
  body.heal_from_address = "10.0.0.1:5000";
  body.heal_to = {"x", "y"};
  auto decoded = DecodeDecision(Encode({Kind::kDecision, 1, 1}, body, signer));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->round_id, 12u);
  EXPECT_EQ(decoded->rank, 3u);
  EXPECT_EQ(decoded->closed_by, "fast_path");
  EXPECT_EQ(decoded->heal_from_address, "10.0.0.1:5000");
  EXPECT_EQ(decoded->heal_to, (std::vector<std::string>{"x", "y"}));
}

TEST(DatagramTest, TamperedOrForeignDatagramsFailVerification) {
  Signer signer(DeriveKey("job-token-123456"));
  Signer other(DeriveKey("another-token-999"));
  std::string bytes = Encode({Kind::kJoin, 5, 1}, Join{1, 2, 3, 4, 5}, signer);
  EXPECT_FALSE(other.Verify(bytes));
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string tampered = bytes;
    tampered[i] ^= 0x01;
    EXPECT_FALSE(signer.Verify(tampered)) << "byte " << i;
  }
  EXPECT_FALSE(signer.Verify(bytes.substr(0, 10)));
}

TEST(DatagramTest, AckRoundTrips) {
  Signer signer(DeriveKey("job-token-123456"));
  auto ack = DecodeAck(Encode({Kind::kAck, 5, 1}, Ack{true, 4.5, 3, 9, 1200, true}, signer));
  ASSERT_TRUE(ack.ok()) << ack.status();
  EXPECT_TRUE(ack->slow);
  EXPECT_EQ(ack->slow_zscore, 4.5);
  EXPECT_EQ(ack->latest_round_id, 3u);
  EXPECT_EQ(ack->lighthouse_instance, 9u);
  EXPECT_EQ(ack->latest_round_step, 1200u);
  EXPECT_TRUE(ack->short_of_quorum);
  auto plain = DecodeAck(Encode({Kind::kAck, 5, 1}, Ack{false, 0, 3, 9, 1200, false}, signer));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->short_of_quorum);
}

TEST(DatagramTest, MalformedInputIsRefused) {
  Signer signer(DeriveKey("job-token-123456"));
  EXPECT_FALSE(ParseHeader("short").ok());
  std::string bytes = Encode({Kind::kAck, 5, 1}, Ack{true, 4.5, 3, 9}, signer);
  std::string wrong_magic = bytes;
  wrong_magic[0] = 'X';
  EXPECT_FALSE(ParseHeader(wrong_magic).ok());
  std::string wrong_version = bytes;
  wrong_version[5] = 9;
  EXPECT_FALSE(ParseHeader(wrong_version).ok());
  // An ack's body does not decode as a join or a heartbeat.
  EXPECT_FALSE(DecodeJoin(bytes).ok());
  EXPECT_FALSE(DecodeHeartbeat(bytes).ok());
  EXPECT_TRUE(DecodeAck(bytes).ok());
  EXPECT_FALSE(DecodeDecision("").ok());
}

TEST(DatagramTest, OversizedStepTimeListsKeepTheNewest) {
  Signer signer(DeriveKey("job-token-123456"));
  Heartbeat body;
  for (uint32_t i = 1; i <= kMaxStepTimes + 10; ++i) body.step_time_us.push_back(i);
  auto decoded = DecodeHeartbeat(Encode({Kind::kHeartbeat, 1, 1}, body, signer));
  ASSERT_TRUE(decoded.ok());
  ASSERT_EQ(decoded->step_time_us.size(), kMaxStepTimes);
  EXPECT_EQ(decoded->step_time_us.back(), kMaxStepTimes + 10);
}

}  // namespace
}  // namespace mend::coordinator::datagram
