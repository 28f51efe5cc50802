// Live healing's chunked, checksummed transfer, against a member whose
// incoming bytes are damaged on the way.
#include "reducer/heal_stream.h"

#include <cstring>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mend::reducer {
namespace {

using ::testing::HasSubstr;

// Rank 1 of 2: every broadcast from rank 0 delivers the next of the
// source's messages (recorded by running the source side first), with one
// byte of message `damage` flipped.
class ReplayCommunicator final : public Communicator {
 public:
  ReplayCommunicator(int rank, std::vector<std::vector<std::byte>>* log, int damage = -1)
      : rank_(rank), log_(log), damage_(damage) {}
  Status WeightedAllReduce(std::span<float>, double, const Codec*) override { return OkStatus(); }
  Status WeightedAllGatherDecode(std::span<const std::byte>, double, const Codec&,
                                 std::span<float>) override {
    return OkStatus();
  }
  Status AllGather(std::span<const std::byte>, std::span<std::byte>) override { return OkStatus(); }
  Status Broadcast(std::span<std::byte> data, int root) override {
    EXPECT_EQ(root, 0);
    if (rank_ == 0) {
      log_->emplace_back(data.begin(), data.end());
      return OkStatus();
    }
    const std::vector<std::byte>& message = (*log_)[next_];
    EXPECT_EQ(message.size(), data.size());
    std::memcpy(data.data(), message.data(), data.size());
    if (static_cast<int>(next_) == damage_) data[data.size() / 2] ^= std::byte{0x10};
    ++next_;
    return OkStatus();
  }
  void Abort(const std::string&) override {}
  int rank() const override { return rank_; }
  int world_size() const override { return 2; }
  bool broken() const override { return false; }
  CommunicatorStats stats() const override { return {}; }

 private:
  int rank_;
  std::vector<std::vector<std::byte>>* log_;
  int damage_;
  size_t next_ = 0;
};

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
  ASSERT_EQ(log.size(),
            3u);  // 3 chunks (4096, 4096, 1808); the digests and header ride with the first
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
  for (int damaged : {0, 1}) {  // the first message (digests and chunk 1), and chunk 2
    ReplayCommunicator receiver(1, &log, damaged);
    Status status = StreamState(receiver, received, 0, "learner-a", 4096);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << damaged;
  }
  ReplayCommunicator receiver(1, &log, /*damage=*/1);
  Status status = StreamState(receiver, received, 0, "learner-a", 4096);
  EXPECT_THAT(status.message(), HasSubstr("healing from learner-a: chunk 2 of 3"));
}

}  // namespace
}  // namespace mend::reducer
