// The communicator among threads of one process: results against a reference,
// bit-identical results on every member for every codec, deadlines when a
// member hangs or vanishes, and nothing leaked after a failure.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <thread>

#include "dataplane/dataplane_fixture.h"
#include "dataplane/slicing.h"
#include "mend/buckets.h"
#include "test_util/wait.h"

namespace mend {
namespace {

using testing_util::CountEntries;
using testing_util::InProcessStore;
using testing_util::MemberOptions;
using testing_util::RunMembers;

std::vector<float> MemberData(int rank, size_t n) {
  return testing_util::NormalValues(1000 + rank, n);
}

double MemberWeight(int rank) { return 100.0 * (rank + 1); }  // tokens

// sum_r w_r x_r / sum_r w_r in double.
std::vector<double> Reference(int size, size_t n) {
  double total = 0;
  for (int r = 0; r < size; ++r) total += MemberWeight(r);
  std::vector<double> want(n, 0.0);
  for (int r = 0; r < size; ++r) {
    auto x = MemberData(r, n);
    for (size_t i = 0; i < n; ++i) want[i] += MemberWeight(r) / total * x[i];
  }
  return want;
}

double RelativeError(const std::vector<double>& want, const std::vector<float>& got) {
  double error = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    error += (want[i] - got[i]) * (want[i] - got[i]);
    norm += want[i] * want[i];
  }
  return norm == 0 ? std::sqrt(error) : std::sqrt(error / norm);
}

struct Case {
  CodecKind codec;
  double bound;  // relative error against the fp64 reference
};

class WeightedAllReduceTest : public ::testing::TestWithParam<std::tuple<Case, int, size_t>> {};

TEST_P(WeightedAllReduceTest, MatchesReferenceAndIsBitIdenticalOnEveryMember) {
  auto [c, size, n] = GetParam();
  auto codec = MakeCodec({c.codec, 32, 4096, 64});
  ASSERT_TRUE(codec.ok());
  std::vector<std::vector<float>> results(size);
  RunMembers(
      size,
      [&, n = n](int rank, Communicator& comm) {
        auto data = MemberData(rank, n);
        Status status = comm.WeightedAllReduce(data, MemberWeight(rank), codec->get());
        ASSERT_TRUE(status.ok()) << status;
        results[rank] = std::move(data);
      },
      "job/round/7/", [](CommunicatorOptions& options) { options.segment_bytes = 4096; });
  for (int r = 1; r < size; ++r) {
    ASSERT_EQ(results[r].size(), n);
    if (n > 0) {
      ASSERT_EQ(std::memcmp(results[r].data(), results[0].data(), n * sizeof(float)), 0)
          << "member " << r << " differs from member 0";
    }
  }
  if (n > 0) {
    EXPECT_LT(RelativeError(Reference(size, n), results[0]), c.bound);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, WeightedAllReduceTest,
    ::testing::Combine(::testing::Values(Case{CodecKind::kFp32, 1e-6}, Case{CodecKind::kBf16, 5e-3},
                                         Case{CodecKind::kInt8, 2e-2},
                                         Case{CodecKind::kInt4, 0.25}),
                       ::testing::Values(2, 3, 4),
                       // Empty, fewer values than members, not a multiple of
                       // the block, and several segments per slice.
                       ::testing::Values(size_t{0}, size_t{3}, size_t{1001}, size_t{20'000})));

TEST(CommunicatorTest, ADataPlaneHostNotOfThisHostIsRefusedNamingTheKey) {
  EXPECT_TRUE(CheckDataPlaneHost("127.0.0.1").ok());
  const Status elsewhere = CheckDataPlaneHost("192.0.2.1");  // TEST-NET-1: no host's own
  EXPECT_EQ(elsewhere.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(StatusMessage(elsewhere)).find("dataplane_host = \"192.0.2.1\""),
            std::string::npos)
      << elsewhere;
}

TEST(CommunicatorTest, SparseAllGatherDecodeIsBitIdenticalAndWeighted) {
  auto codec = MakeCodec({CodecKind::kTopK, 64, 512, 32});
  ASSERT_TRUE(codec.ok());
  const int size = 3;
  const size_t n = 4096;
  std::vector<std::vector<float>> results(size);
  std::vector<std::vector<float>> decoded(size);
  RunMembers(size, [&](int rank, Communicator& comm) {
    auto data = MemberData(rank, n);
    std::vector<std::byte> payload((*codec)->EncodedBytes(n));
    (*codec)->Encode(data, payload);
    decoded[rank].resize(n);
    (*codec)->Decode(payload, decoded[rank]);
    std::vector<float> out(n);
    Status status = comm.WeightedAllGatherDecode(payload, MemberWeight(rank), **codec, out);
    ASSERT_TRUE(status.ok()) << status;
    results[rank] = std::move(out);
  });
  EXPECT_EQ(results[1], results[0]);
  EXPECT_EQ(results[2], results[0]);
  double total = MemberWeight(0) + MemberWeight(1) + MemberWeight(2);
  for (size_t i = 0; i < n; ++i) {
    double want = 0;
    for (int r = 0; r < size; ++r) want += MemberWeight(r) / total * decoded[r][i];
    ASSERT_NEAR(results[0][i], want, 1e-5) << i;
  }
}

TEST(CommunicatorTest, AllGatherAndBroadcastMoveExactBytes) {
  const int size = 4;
  RunMembers(size, [&](int rank, Communicator& comm) {
    std::vector<std::byte> mine(777, std::byte(rank + 1));
    std::vector<std::byte> all(777 * size);
    ASSERT_TRUE(comm.AllGather(mine, all).ok());
    for (int r = 0; r < size; ++r) EXPECT_EQ(all[r * 777 + 776], std::byte(r + 1));
    std::vector<std::byte> state(3 << 20, std::byte(rank == 2 ? 0x5A : 0));
    ASSERT_TRUE(comm.Broadcast(state, /*root=*/2).ok());
    EXPECT_EQ(state.front(), std::byte(0x5A));
    EXPECT_EQ(state.back(), std::byte(0x5A));
    EXPECT_EQ(comm.stats().operations, 2u);
  });
}

TEST(CommunicatorTest, ZeroTotalWeightIsRefusedOnEveryMember) {
  // The weights travel beside the first pieces, so the refusal comes after
  // those were posted: every member lets them through and returns, in fp32
  // and with a codec (whose result receives are posted up front too), for a
  // buffer of one segment and one of several; the caller's data is as it was.
  // With 4 KiB segments the fp32 pieces of 2^20 values come in far more
  // segments than the receive window: its slots are posted again as the
  // refusal drains them.
  auto int8 = MakeCodec({CodecKind::kInt8, 64, 4096, 64});
  ASSERT_TRUE(int8.ok());
  for (const Codec* codec : std::vector<const Codec*>{nullptr, int8->get()}) {
    for (size_t n : {size_t{10}, size_t{1} << 20}) {
      for (size_t segment_bytes : {size_t{1} << 20, size_t{4096}}) {
        RunMembers(
            3,
            [&](int rank, Communicator& comm) {
              std::vector<float> data(n, static_cast<float>(rank + 1));
              Status status = comm.WeightedAllReduce(data, 0.0, codec);
              EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status;
              EXPECT_NE(std::string(StatusMessage(status)).find("sum to 0"), std::string::npos);
              EXPECT_EQ(std::count(data.begin(), data.end(), static_cast<float>(rank + 1)),
                        static_cast<std::ptrdiff_t>(n));
              EXPECT_TRUE(comm.broken());
            },
            "job/round/7/", [&](CommunicatorOptions& o) { o.segment_bytes = segment_bytes; });
      }
    }
  }
}

TEST(CommunicatorTest, MembersReducingBuffersOfDifferentSizesFailCleanlyNamingBoth) {
  // A bug elsewhere (members at different fragments) must fail the round,
  // not the process: Gloo aborts on a piece longer than the buffer posted
  // for it. Member 1's buffer is larger (in fp32, through a codec, merged
  // with made values); every member returns FAILED_PRECONDITION naming a
  // member of another size, its own buffer as it was, and the next
  // operation is refused as after any failure.
  auto int8 = MakeCodec({CodecKind::kInt8, 64, 4096, 64});
  ASSERT_TRUE(int8.ok());
  for (const Codec* codec : std::vector<const Codec*>{nullptr, int8->get()}) {
    for (bool made : {false, true}) {
      if (made && codec != nullptr) continue;  // (made values are fp32 only)
      RunMembers(3, [&](int rank, Communicator& comm) {
        const size_t n = rank == 1 ? size_t{300'000} : size_t{200'000};
        std::vector<float> data(n, static_cast<float>(rank + 1));
        Status status;
        if (made) {
          Communicator::MakeValues make = [&](size_t, size_t) { return 0.0; };
          Communicator::MergeValues values;
          values.make = &make;
          status = comm.MergeAllReduce(data, 1.0, values).status();
        } else {
          status = comm.WeightedAllReduce(data, 1.0, codec);
        }
        EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition) << status;
        const std::string message(StatusMessage(status));
        EXPECT_NE(message.find(rank == 1 ? "200000 values, this member 300000"
                                         : "300000 values, this member 200000"),
                  std::string::npos)
            << message;
        EXPECT_EQ(std::count(data.begin(), data.end(), static_cast<float>(rank + 1)),
                  static_cast<std::ptrdiff_t>(n));
        EXPECT_TRUE(comm.broken());
      });
    }
  }
  // A sparse codec's payloads likewise (their sizes beside the weights).
  auto topk = MakeCodec({CodecKind::kTopK, 64, 512, 32});
  ASSERT_TRUE(topk.ok());
  RunMembers(3, [&](int rank, Communicator& comm) {
    const size_t n = rank == 1 ? size_t{3072} : size_t{2048};
    std::vector<std::byte> payload((*topk)->EncodedBytes(n));
    std::vector<float> out(n);
    Status status = comm.WeightedAllGatherDecode(payload, 1.0, **topk, out);
    EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition) << status;
    EXPECT_NE(std::string(StatusMessage(status)).find("bytes of payload"), std::string::npos)
        << status;
  });
  // Bytes all-gathered or broadcast (a heal's) carry no size: pieces of
  // another size never meet, and the operation ends at its timeout (or,
  // on the member whose timeout comes second, when the other's connection
  // closes).
  for (bool broadcast : {false, true}) {
    RunMembers(
        2,
        [&](int rank, Communicator& comm) {
          std::vector<std::byte> mine(rank == 0 ? 100 : 150, std::byte{1});
          std::vector<std::byte> all(2 * mine.size());
          Status status = broadcast ? comm.Broadcast(mine, 0) : comm.AllGather(mine, all);
          EXPECT_TRUE(status.code() == StatusCode::kDeadlineExceeded ||
                      status.code() == StatusCode::kAborted)
              << status;
        },
        "job/round/7/", [](CommunicatorOptions& o) { o.timeout = 5 * kMicrosPerSecond; });
  }
}

TEST(CommunicatorTest, AnFp32ReductionHoldsAFewSegmentsOfScratchNotASlice) {
  // 2^23 values (32 MiB) between two members: slices of 16 MiB in 1 MiB
  // segments. The scratch holds the receive window's 4 segments, not the
  // other member's slice (as it did before the window), and the result is
  // exact (small integers, equal weights: the mean of 1 and 3 is 2).
  constexpr size_t kValues = size_t{1} << 23;
  std::vector<uint64_t> scratch(2);
  std::vector<size_t> wrong(2, 1);
  RunMembers(2, [&](int rank, Communicator& comm) {
    std::vector<float> data(kValues, rank == 0 ? 1.0f : 3.0f);
    ASSERT_TRUE(comm.WeightedAllReduce(data, 1.0).ok());
    wrong[rank] = kValues - static_cast<size_t>(std::count(data.begin(), data.end(), 2.0f));
    scratch[rank] = comm.stats().scratch_bytes;
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(wrong[rank], 0u) << "member " << rank;
    EXPECT_GT(scratch[rank], 0u);
    EXPECT_LE(scratch[rank], 4u << 20) << "member " << rank;  // a slice: 16 MiB
  }
}

TEST(CommunicatorTest, HungMemberFailsTheOthersWithDeadlineNamingIt) {
  // Member 2 connects and then never takes part: the others' all-reduce ends
  // with DEADLINE_EXCEEDED naming round 7 and member 2, and the communicator
  // refuses further work.
  const Micros timeout = 1500 * kMicrosPerMilli;
  std::atomic<int> failed{0};
  InProcessStore store;
  std::vector<std::thread> threads;
  std::atomic<bool> others_done{false};
  for (int rank = 0; rank < 3; ++rank) {
    threads.emplace_back([&, rank]() {
      auto comm = Communicator::Connect(store, MemberOptions(rank, 3, "job/round/7/", timeout));
      ASSERT_TRUE(comm.ok()) << comm.status();
      if (rank == 2) {
        EXPECT_TRUE(
            testing_util::WaitFor(30 * kMicrosPerSecond, [&]() { return others_done.load(); }));
        return;
      }
      std::vector<float> data(100'000, 1.0f);
      Status status = (*comm)->WeightedAllReduce(data, 1.0);
      EXPECT_EQ(status.code(), StatusCode::kDeadlineExceeded) << status;
      std::string message(StatusMessage(status));
      EXPECT_NE(message.find("round 7"), std::string::npos) << message;
      EXPECT_NE(message.find("member 2 ('learner-2')"), std::string::npos) << message;
      EXPECT_TRUE((*comm)->broken());
      EXPECT_EQ((*comm)->WeightedAllReduce(data, 1.0).code(), StatusCode::kFailedPrecondition);
      if (++failed == 2) others_done = true;
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failed.load(), 2);
}

TEST(CommunicatorTest, VanishedMemberAbortsTheOthersAndNothingLeaks) {
  // Member 1 closes its communicator (its sockets) while member 0 waits in an
  // all-reduce: member 0 gets ABORTED (or DEADLINE_EXCEEDED) naming member 1
  // long before the 60 s deadline. Afterwards the process has the threads
  // and descriptors it had before. (A thread started and joined first: under
  // ThreadSanitizer the first thread start also starts the runtime's own
  // background thread, which stays; it belongs in the count before.)
  std::thread([]() {}).join();
  size_t threads_before = CountEntries("/proc/self/task");
  size_t fds_before = CountEntries("/proc/self/fd");
  {
    InProcessStore store;
    std::atomic<bool> waiting{false};
    Status status;
    std::thread member1([&]() {
      auto comm =
          Communicator::Connect(store, MemberOptions(1, 2, "job/round/7/", 60 * kMicrosPerSecond));
      ASSERT_TRUE(comm.ok()) << comm.status();
      EXPECT_TRUE(testing_util::WaitFor(30 * kMicrosPerSecond, [&]() { return waiting.load(); }));
      // Gone: the communicator and its connections close.
    });
    auto comm =
        Communicator::Connect(store, MemberOptions(0, 2, "job/round/7/", 60 * kMicrosPerSecond));
    ASSERT_TRUE(comm.ok()) << comm.status();
    std::vector<float> data(1 << 20, 1.0f);
    waiting = true;
    status = (*comm)->WeightedAllReduce(data, 1.0);
    member1.join();
    EXPECT_TRUE(status.code() == StatusCode::kAborted ||
                status.code() == StatusCode::kDeadlineExceeded)
        << status;
    EXPECT_NE(std::string(StatusMessage(status)).find("member 1"), std::string::npos) << status;
  }
  EXPECT_TRUE(testing_util::WaitFor(10 * kMicrosPerSecond,
                                    [&]() {
                                      return CountEntries("/proc/self/task") == threads_before &&
                                             CountEntries("/proc/self/fd") == fds_before;
                                    }))
      << "threads " << CountEntries("/proc/self/task") << " (before " << threads_before << "), fds "
      << CountEntries("/proc/self/fd") << " (before " << fds_before << ")";
}

TEST(CommunicatorTest, AbortCallsOffACollectiveWaitingForAHungMember) {
  // Member 1 connects and then never takes part (a stopped process); the
  // deadline is 60 s. Abort() from another thread (what the reducer does
  // when the lighthouse calls the round off) ends member 0's all-reduce with
  // ABORTED and the reason, and the communicator refuses further work.
  InProcessStore store;
  std::atomic<bool> done{false};
  std::thread member1([&]() {
    auto comm =
        Communicator::Connect(store, MemberOptions(1, 2, "job/round/7/", 60 * kMicrosPerSecond));
    ASSERT_TRUE(comm.ok()) << comm.status();
    EXPECT_TRUE(testing_util::WaitFor(120 * kMicrosPerSecond, [&]() { return done.load(); }));
  });
  auto comm =
      Communicator::Connect(store, MemberOptions(0, 2, "job/round/7/", 60 * kMicrosPerSecond));
  ASSERT_TRUE(comm.ok()) << comm.status();
  Status status;
  std::thread member0([&]() {
    std::vector<float> data(1 << 16, 1.0f);
    status = (*comm)->WeightedAllReduce(data, 1.0);
  });
  (*comm)->Abort("learner 'learner-2' declared dead: no heartbeat for 2000 ms");
  member0.join();
  EXPECT_EQ(status.code(), StatusCode::kAborted) << status;
  EXPECT_NE(std::string(StatusMessage(status)).find("declared dead"), std::string::npos) << status;
  EXPECT_NE(std::string(StatusMessage(status)).find("round 7"), std::string::npos) << status;
  EXPECT_TRUE((*comm)->broken());
  std::vector<float> more(8, 1.0f);
  EXPECT_EQ((*comm)->WeightedAllReduce(more, 1.0).code(), StatusCode::kFailedPrecondition);
  done = true;
  member1.join();
}

TEST(CommunicatorTest, AbortAmidCompletingTransfersEndsEveryLoopCalledOff) {
  // Two members all-reduce in a loop; once both have done 50, another thread
  // aborts both communicators, while their transfers keep completing. Each
  // loop ends with ABORTED and the reason (an abort may meet a wait whose
  // transfer has just completed: Wait takes the buffer out of Abort's reach
  // before it deletes it). Not in the TSan stage: scripts/tsan-tests.sh
  // says why.
  InProcessStore store;
  std::vector<std::unique_ptr<Communicator>> comms(2);
  std::vector<std::thread> connects;
  for (int rank = 0; rank < 2; ++rank) {
    connects.emplace_back([&, rank]() {
      auto comm = Communicator::Connect(store, MemberOptions(rank, 2, "job/round/7/"));
      ASSERT_TRUE(comm.ok()) << comm.status();
      comms[static_cast<size_t>(rank)] = std::move(*comm);
    });
  }
  for (auto& thread : connects) thread.join();
  ASSERT_TRUE(comms[0] && comms[1]);
  std::atomic<int> completed[2] = {0, 0};
  Status ended[2];
  std::vector<std::thread> members;
  for (int rank = 0; rank < 2; ++rank) {
    members.emplace_back([&, rank]() {
      std::vector<float> data(1024, 1.0f);
      Status status;
      while ((status = comms[static_cast<size_t>(rank)]->WeightedAllReduce(data, 1.0)).ok()) {
        ++completed[rank];
      }
      ended[rank] = status;
    });
  }
  EXPECT_TRUE(testing_util::WaitFor(60 * kMicrosPerSecond, [&]() {
    return completed[0].load() >= 50 && completed[1].load() >= 50;
  }));
  for (auto& comm : comms) comm->Abort("the lighthouse called round 7 off");
  for (auto& thread : members) thread.join();
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(ended[rank].code(), StatusCode::kAborted) << ended[rank];
    EXPECT_NE(std::string(StatusMessage(ended[rank])).find("called round 7 off"), std::string::npos)
        << ended[rank];
  }
}

TEST(CommunicatorTest, MissingMemberFailsRendezvousNamingIt) {
  InProcessStore store;
  auto comm =
      Communicator::Connect(store, MemberOptions(0, 2, "job/round/7/", 300 * kMicrosPerMilli));
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), StatusCode::kDeadlineExceeded) << comm.status();
  EXPECT_NE(std::string(StatusMessage(comm.status())).find("1 ('learner-1')"), std::string::npos)
      << comm.status();
}

// A member that reaches the rendezvous well after another (whose last round
// failed at once, while its own failed only at its deadline) still meets
// it: the rendezvous waits the round's timeout, not Gloo's context timeout,
// which bounds only a pair's initial connection (connect_timeout / 5).
TEST(CommunicatorTest, AMemberLaterThanTheConnectTimeoutStillMeetsTheOthers) {
  InProcessStore store;
  auto options = [](int rank) {
    CommunicatorOptions o = MemberOptions(rank, 2, "job/round/9/", 20 * kMicrosPerSecond);
    o.connect_timeout = 500 * kMicrosPerMilli;
    return o;
  };
  std::atomic<Micros> first_arrived{0};
  std::thread first([&]() {
    first_arrived = RealClock()->NowMicros();
    auto comm = Communicator::Connect(store, options(0));
    ASSERT_TRUE(comm.ok()) << comm.status();
    std::vector<float> data(100, 1.0f);
    ASSERT_TRUE((*comm)->WeightedAllReduce(data, 1.0).ok());
    EXPECT_EQ(data[99], 2.0f);
  });
  // The second comes three connect timeouts later.
  EXPECT_TRUE(testing_util::WaitFor(30 * kMicrosPerSecond, [&]() {
    return first_arrived > 0 &&
           RealClock()->NowMicros() - first_arrived > 3 * options(0).connect_timeout;
  }));
  auto comm = Communicator::Connect(store, options(1));
  ASSERT_TRUE(comm.ok()) << comm.status();
  std::vector<float> data(100, 3.0f);
  ASSERT_TRUE((*comm)->WeightedAllReduce(data, 1.0).ok());
  EXPECT_EQ(data[99], 2.0f);
  first.join();
}

TEST(CommunicatorTest, NextRoundBuildsAFreshCommunicatorWithTheSurvivors) {
  // Round 7 fails (member 2 never joins the operation); the two survivors
  // connect again under round 8's prefix and reduce.
  InProcessStore store;
  std::vector<std::thread> threads;
  std::atomic<int> round8_ok{0};
  std::atomic<int> round7_done{0};
  for (int rank = 0; rank < 3; ++rank) {
    threads.emplace_back([&, rank]() {
      auto comm = Communicator::Connect(
          store, MemberOptions(rank, 3, "job/round/7/", 1000 * kMicrosPerMilli));
      ASSERT_TRUE(comm.ok());
      if (rank == 2) {
        EXPECT_TRUE(
            testing_util::WaitFor(30 * kMicrosPerSecond, [&]() { return round7_done == 2; }));
        return;
      }
      std::vector<float> data(1000, static_cast<float>(rank + 1));
      EXPECT_FALSE((*comm)->WeightedAllReduce(data, 1.0).ok());
      round7_done++;
      comm->reset();
      auto next = Communicator::Connect(store, MemberOptions(rank, 2, "job/round/8/"));
      ASSERT_TRUE(next.ok()) << next.status();
      std::vector<float> fresh(1000, static_cast<float>(rank + 1));
      ASSERT_TRUE((*next)->WeightedAllReduce(fresh, 1.0).ok());
      EXPECT_EQ(fresh[999], 1.5f);
      round8_ok++;
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(round8_ok.load(), 2);
}

TEST(CommunicatorTest, LinkEmulationStretchesEveryOperation) {
  RunMembers(
      2,
      [&](int rank, Communicator& comm) {
        std::vector<float> data(1000, 1.0f);
        auto start = std::chrono::steady_clock::now();
        ASSERT_TRUE(comm.WeightedAllReduce(data, 1.0).ok());
        // At least the latency plus the bytes this member sent at 1 MB/s.
        double sent = static_cast<double>(comm.stats().bytes_sent);
        auto least = std::chrono::microseconds(200'000 + static_cast<int64_t>(sent));
        EXPECT_GE(std::chrono::steady_clock::now() - start, least);
      },
      "job/round/7/",
      [](CommunicatorOptions& options) {
        options.link.latency = 200 * kMicrosPerMilli;
        options.link.bytes_per_s = 1e6;
      });
}

TEST(SlicingTest, PiecesCoverTheBufferOnceOnAlignedBoundaries) {
  for (size_t n : {0u, 1u, 63u, 64u, 1000u, 100'003u}) {
    for (int members : {1, 2, 3, 7}) {
      dataplane::Slicing slicing(n, members, 32, 100);
      std::vector<int> covered(n, 0);
      for (int slice = 0; slice < members; ++slice) {
        for (size_t s = 0; s < slicing.segments(); ++s) {
          auto [begin, end] = slicing.Piece(slice, s);
          ASSERT_LE(begin, end);
          if (begin != end) {
            ASSERT_TRUE(begin % 32 == 0) << begin;
          }
          for (size_t i = begin; i < end; ++i) covered[i]++;
        }
      }
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(covered[i], 1) << n << " " << members << " " << i;
    }
  }
}

TEST(BucketPlanTest, PacksSmallTensorsTogetherAndCutsLargeOnes) {
  std::vector<size_t> sizes = {3, 4, 10, 2, 1, 25};
  BucketPlan plan(sizes, 8);
  // Small tensors never straddle buckets; larger ones fill the rest and go on:
  // [3 4 | 1 of 10] [8 of 10] [1 of 10, 2, 1 | 4 of 25] [8] [8] [5]
  ASSERT_EQ(plan.buckets(), 6u);
  for (size_t b = 0; b < 5; ++b) EXPECT_EQ(plan.bucket_size(b), 8u) << b;
  EXPECT_EQ(plan.bucket_size(5), 5u);
  EXPECT_EQ(plan.pieces(0).size(), 3u);
  EXPECT_EQ(plan.total_values(), 45u);
  std::vector<std::vector<float>> tensors;
  for (size_t t = 0; t < sizes.size(); ++t) {
    tensors.emplace_back(sizes[t]);
    for (size_t i = 0; i < sizes[t]; ++i) tensors[t][i] = static_cast<float>(100 * t + i);
  }
  std::vector<std::span<const float>> in(tensors.begin(), tensors.end());
  std::vector<std::vector<float>> copies;
  for (size_t t = 0; t < sizes.size(); ++t) copies.emplace_back(sizes[t], -1.0f);
  std::vector<std::span<float>> out(copies.begin(), copies.end());
  for (size_t b = 0; b < plan.buckets(); ++b) {
    std::vector<float> bucket(plan.bucket_size(b));
    plan.Pack(b, in, bucket);
    plan.Unpack(b, bucket, out);
  }
  EXPECT_EQ(copies, tensors);
}

TEST(BucketPlanTest, BucketedReduceEqualsTensorByTensor) {
  const int size = 3;
  std::vector<size_t> sizes = {1, 17, 300, 5, 4096, 3, 70'000};
  std::vector<std::vector<std::vector<float>>> results(size);
  RunMembers(size, [&](int rank, Communicator& comm) {
    std::vector<std::vector<float>> tensors;
    for (size_t t = 0; t < sizes.size(); ++t) {
      tensors.push_back(MemberData(rank * 10 + static_cast<int>(t), sizes[t]));
    }
    std::vector<std::vector<float>> single = tensors;
    for (auto& tensor : single)
      ASSERT_TRUE(comm.WeightedAllReduce(tensor, MemberWeight(rank)).ok());
    BucketPlan plan(sizes, 10'000);
    EXPECT_LE(plan.buckets(), 9u);  // not one collective per tensor
    std::vector<std::span<float>> views(tensors.begin(), tensors.end());
    std::vector<float> scratch;
    Status status =
        WeightedAllReduceBuckets(comm, plan, views, MemberWeight(rank), nullptr, scratch);
    ASSERT_TRUE(status.ok()) << status;
    for (size_t t = 0; t < sizes.size(); ++t) {
      for (size_t i = 0; i < sizes[t]; ++i) {
        ASSERT_NEAR(tensors[t][i], single[t][i], 1e-5) << t << " " << i;
      }
    }
    results[rank] = std::move(tensors);
  });
  EXPECT_EQ(results[1], results[0]);
  EXPECT_EQ(results[2], results[0]);
}

}  // namespace
}  // namespace mend
