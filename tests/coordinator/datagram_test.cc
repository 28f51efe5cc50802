#include "wire/datagram.h"

#include "gtest/gtest.h"
#include "mend/lighthouse_client.h"
#include "mend/v1/lighthouse.pb.h"
#include "wire/protocol_rules.h"

namespace mend::coordinator::datagram {
namespace {

TEST(DatagramTest, HeartbeatRoundTripsAndVerifies) {
  Signer signer(DeriveKey("job-token-123456"));
  v1::HeartbeatRequest body;
  body.set_step(42);
  body.set_tokens_total(1000);
  for (uint32_t us : {1, 2, 3}) body.add_step_time_us(us);
  std::string bytes = EncodeMessage({Kind::kHeartbeat, 0xabc, 7}, body, signer);
  auto header = ParseHeader(bytes);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->kind, Kind::kHeartbeat);
  EXPECT_EQ(header->session_id, 0xabcu);
  EXPECT_EQ(header->seq, 7u);
  EXPECT_TRUE(signer.Verify(bytes));
  auto decoded = DecodeMessage<v1::HeartbeatRequest>(bytes);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->step(), 42u);
  EXPECT_EQ(decoded->tokens_total(), 1000u);
  EXPECT_EQ(std::vector<uint32_t>(decoded->step_time_us().begin(), decoded->step_time_us().end()),
            (std::vector<uint32_t>{1, 2, 3}));
}

TEST(DatagramTest, DecisionRoundTrips) {
  Signer signer(DeriveKey("job-token-123456"));
  v1::DatagramDecision body;
  body.set_join_id(9);
  v1::QuorumResponse& round = *body.mutable_round();
  round.set_round_id(12);
  round.set_rank(3);
  round.set_world_size(5);
  round.set_closed_by("fast_path");
  round.mutable_heal_from()->set_address("10.0.0.1:5000");
  round.add_heal_to("x");
  round.add_heal_to("y");
  auto decoded =
      DecodeMessage<v1::DatagramDecision>(EncodeMessage({Kind::kDecision, 1, 1}, body, signer));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->join_id(), 9u);
  EXPECT_EQ(decoded->round().round_id(), 12u);
  EXPECT_EQ(decoded->round().rank(), 3u);
  EXPECT_EQ(decoded->round().closed_by(), "fast_path");
  EXPECT_EQ(decoded->round().heal_from().address(), "10.0.0.1:5000");
  ASSERT_EQ(decoded->round().heal_to_size(), 2);
  EXPECT_EQ(decoded->round().heal_to(1), "y");
}

TEST(DatagramTest, TamperedOrForeignDatagramsFailVerification) {
  Signer signer(DeriveKey("job-token-123456"));
  Signer other(DeriveKey("another-token-999"));
  v1::DatagramJoin join;
  join.set_join_id(1);
  join.mutable_request()->set_step(3);
  join.mutable_request()->set_timeout_ms(5);
  std::string bytes = EncodeMessage({Kind::kJoin, 5, 1}, join, signer);
  EXPECT_FALSE(other.Verify(bytes));
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string tampered = bytes;
    tampered[i] ^= 0x01;
    EXPECT_FALSE(signer.Verify(tampered)) << "byte " << i;
  }
  EXPECT_FALSE(signer.Verify(bytes.substr(0, 10)));
}

TEST(DatagramTest, MalformedInputIsRefused) {
  Signer signer(DeriveKey("job-token-123456"));
  EXPECT_FALSE(ParseHeader("short").ok());
  v1::HeartbeatResponse ack;
  ack.set_slow(true);
  std::string bytes = EncodeMessage({Kind::kAck, 5, 1}, ack, signer);
  std::string wrong_magic = bytes;
  wrong_magic[0] = 'X';
  EXPECT_FALSE(ParseHeader(wrong_magic).ok());
  std::string wrong_version = bytes;
  wrong_version[5] = 4;  // the last version with hand-packed bodies
  EXPECT_FALSE(ParseHeader(wrong_version).ok());
  std::string wrong_kind = bytes;
  wrong_kind[4] = 7;  // one past kSuperseded
  EXPECT_FALSE(ParseHeader(wrong_kind).ok());
  // A body that is no protobuf message (a field tag of number 0).
  std::string garbage = Encode({Kind::kJoin, 5, 1}, std::string("\x00\x01\x02", 3), signer);
  EXPECT_TRUE(ParseHeader(garbage).ok());
  EXPECT_FALSE(DecodeMessage<v1::DatagramJoin>(garbage).ok());
  EXPECT_TRUE(DecodeMessage<v1::HeartbeatResponse>(bytes).ok());
  EXPECT_TRUE(Body("").empty());
}

TEST(DatagramTest, TheLargestHeartbeatALearnerSendsFitsOneDatagram) {
  v1::HeartbeatRequest body;
  const uint64_t counter = uint64_t{1} << 62;
  body.set_step(counter);
  body.set_tokens_total(counter);
  body.set_tokens_since_last_round(counter);
  for (size_t i = 0; i < wire::kMaxHeartbeatStepTimes; ++i) body.add_step_time_us(3'600'000'000u);
  EXPECT_LE(body.ByteSizeLong(), kMaxBodyBytes);
  Signer signer(DeriveKey("job-token-123456"));
  std::string bytes = EncodeMessage({Kind::kHeartbeat, 1, 1}, body, signer);
  EXPECT_LE(bytes.size(), kMaxDatagramBytes);
  auto decoded = DecodeMessage<v1::HeartbeatRequest>(bytes);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(static_cast<size_t>(decoded->step_time_us_size()), wire::kMaxHeartbeatStepTimes);
}

}  // namespace
}  // namespace mend::coordinator::datagram
