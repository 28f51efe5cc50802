// A communicator of two members in one thread, for the healing stream's
// tests: rank 0 records each broadcast it makes; rank 1 replays them in
// order, with one byte of message `damage` flipped.
#pragma once

#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "mend/communicator.h"

namespace mend::testing_util {

// Rank 1 of 2: every broadcast from rank 0 delivers the next of the
// source's messages (recorded by running the source side first, into
// `log`; none is kept without one), with one byte of message `damage`
// flipped.
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
      if (log_ != nullptr) log_->emplace_back(data.begin(), data.end());
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

}  // namespace mend::testing_util
