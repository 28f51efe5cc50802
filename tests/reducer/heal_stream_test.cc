// Live healing's chunked, checksummed transfer, against a member whose
// incoming bytes are damaged on the way.
#include "reducer/heal_stream.h"

#include <cstring>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "reducer/replay_communicator.h"

namespace mend::reducer {
namespace {

using ::testing::HasSubstr;
using testing_util::ReplayCommunicator;

std::vector<std::byte> Pattern(size_t n) {
  std::vector<std::byte> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<std::byte>(i * 31 + 7);
  return bytes;
}

TEST(HealStreamTest, ChunksArriveIntactAndAreChecked) {
  std::vector<std::vector<std::byte>> log;
  std::vector<std::byte> source = Pattern(10'000);
  ReplayCommunicator sender(0, &log);
  uint64_t header[2] = {1234, 5};
  ASSERT_TRUE(
      StreamState(sender, source, 0, "learner-a", 4096, std::as_writable_bytes(std::span(header)))
          .ok());
  // 3 chunks (4096, 4096, 1808), each with its digest; the header rides with the first.
  ASSERT_EQ(log.size(), 3u);
  EXPECT_EQ(log[0].size(), sizeof header + 4096 + 16);
  EXPECT_EQ(log[2].size(), 1808u + 16);
  std::vector<std::byte> received(10'000);
  ReplayCommunicator receiver(1, &log);
  uint64_t got[2] = {0, 0};
  ASSERT_TRUE(
      StreamState(receiver, received, 0, "learner-a", 4096, std::as_writable_bytes(std::span(got)))
          .ok());
  EXPECT_EQ(received, source);
  EXPECT_EQ(got[0], 1234u);
  EXPECT_EQ(got[1], 5u);
}

TEST(HealStreamTest, AStateOfOneChunkIsOneCollective) {
  std::vector<std::vector<std::byte>> log;
  std::vector<std::byte> source = Pattern(3000);
  ReplayCommunicator sender(0, &log);
  ASSERT_TRUE(StreamState(sender, source, 0, "learner-a", 4096).ok());
  EXPECT_EQ(log.size(), 1u);
  std::vector<std::byte> received(3000);
  ReplayCommunicator receiver(1, &log);
  ASSERT_TRUE(StreamState(receiver, received, 0, "learner-a", 4096).ok());
  EXPECT_EQ(received, source);
}

TEST(HealStreamTest, ADamagedChunkIsRefusedNamingItAndTheSource) {
  std::vector<std::vector<std::byte>> log;
  std::vector<std::byte> source = Pattern(10'000);
  ReplayCommunicator sender(0, &log);
  ASSERT_TRUE(StreamState(sender, source, 0, "learner-a", 4096).ok());
  std::vector<std::byte> received(10'000);
  for (int damaged : {0, 1}) {  // the first message (chunk 1), and chunk 2
    ReplayCommunicator receiver(1, &log, damaged);
    Status status = StreamState(receiver, received, 0, "learner-a", 4096);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << damaged;
  }
  ReplayCommunicator receiver(1, &log, /*damage=*/1);
  Status status = StreamState(receiver, received, 0, "learner-a", 4096);
  EXPECT_THAT(status.message(), HasSubstr("healing from learner-a: chunk 2 of 3"));
}

// A damaged header (in the first message, before chunk 1) is refused too,
// and the receiver's header is left as it was.
TEST(HealStreamTest, ADamagedHeaderIsRefusedAndNotTaken) {
  std::vector<std::vector<std::byte>> log;
  std::vector<std::byte> source = Pattern(100);
  ReplayCommunicator sender(0, &log);
  uint64_t header[4] = {1, 2, 3, 4};
  ASSERT_TRUE(
      StreamState(sender, source, 0, "learner-a", 4096, std::as_writable_bytes(std::span(header)))
          .ok());
  log[0][3] ^= std::byte{0x01};  // (a byte of the header)
  std::vector<std::byte> received(100);
  ReplayCommunicator receiver(1, &log);
  uint64_t got[4] = {9, 9, 9, 9};
  Status status =
      StreamState(receiver, received, 0, "learner-a", 4096, std::as_writable_bytes(std::span(got)));
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_EQ(got[0], 9u);
}

}  // namespace
}  // namespace mend::reducer
