// MadeAllReduce (values made as the reduction reaches them) against
// WeightedAllReduce of the same values: the same bits on every member, each
// value made once and pieces sent before the last is made; a member whose
// values are not finite is left out with the bits of zeros and weight 0;
// refusals and a hung member end the call without a hang; members that
// give their values (WeightedAllReduce) beside members that make them.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <tuple>

#include "dataplane/dataplane_fixture.h"
#include "dataplane/hierarchy.h"
#include "fmt/format.h"
#include "test_util/wait.h"

namespace mend {
namespace {

using testing_util::InProcessStore;
using testing_util::MemberOptions;
using testing_util::RunMembers;

std::vector<float> MemberData(int rank, size_t n) {
  return testing_util::NormalValues(2000 + rank, n);
}

double MemberWeight(int rank) { return 100.0 * (rank + 1); }

// What one member's MadeAllReduce saw: its result, the sum of squares it
// returned, how often each value was made, and the bytes it had sent when
// it made its last range (posted to go).
struct Made {
  std::vector<float> result;
  double squares = 0;
  std::vector<int> made;
  size_t calls = 0;
  uint64_t sent_before_last = 0;
  bool reduced_before_last = false;  // a segment was summed before the last range was made
  uint64_t operations = 0;
  uint64_t kept_bytes = 0;
};

// `make` for `source`: copies the range into `data`, counts it, and returns
// its sum of squares (each call notes the bytes posted to go so far).
Communicator::MakeValues Maker(const std::vector<float>& source, std::vector<float>& data,
                               Communicator& comm, Made& seen) {
  seen.made.assign(source.size(), 0);
  return [&source, &data, &comm, &seen](size_t begin, size_t end) {
    double squares = 0;
    for (size_t i = begin; i < end; ++i) {
      data[i] = source[i];
      squares += static_cast<double>(source[i]) * source[i];
      seen.made[i]++;
    }
    seen.calls++;
    // (bytes_sent_to counts a piece when its send is posted.)
    const CommunicatorStats stats = comm.stats();
    seen.sent_before_last = 0;
    for (uint64_t bytes : stats.bytes_sent_to) seen.sent_before_last += bytes;
    seen.reduced_before_last = stats.reduce_seconds > 0;
    return squares;
  };
}

// Each member's WeightedAllReduce of `inputs[rank]` with `weights[rank]`.
std::vector<std::vector<float>> Reference(const std::vector<std::vector<float>>& inputs,
                                          const std::vector<double>& weights,
                                          const std::vector<std::string>& racks = {}) {
  std::vector<std::vector<float>> results(inputs.size());
  RunMembers(
      static_cast<int>(inputs.size()),
      [&](int rank, Communicator& comm) {
        std::vector<float> data = inputs[rank];
        Status status = comm.WeightedAllReduce(data, weights[rank]);
        ASSERT_TRUE(status.ok()) << status;
        results[rank] = std::move(data);
      },
      "job/round/7/",
      [&](CommunicatorOptions& o) {
        o.segment_bytes = 4096;
        o.member_racks = racks;
      });
  return results;
}

// What every member gets when member `left_out` passes zeros with weight 0.
std::vector<std::vector<float>> ReferenceLeavingOut(std::vector<std::vector<float>> inputs,
                                                    std::vector<double> weights, int left_out) {
  inputs[static_cast<size_t>(left_out)].assign(inputs[static_cast<size_t>(left_out)].size(), 0.0f);
  weights[static_cast<size_t>(left_out)] = 0;
  return Reference(inputs, weights);
}

// Each member's MadeAllReduce of `inputs[rank]`, made into a buffer of
// garbage (so a value read before it was made shows); the members not in
// `makers` (a bit each) pass theirs to WeightedAllReduce instead.
std::vector<Made> RunMade(const std::vector<std::vector<float>>& inputs,
                          const std::vector<double>& weights,
                          const std::vector<std::string>& racks = {}, unsigned makers = ~0u) {
  std::vector<Made> seen(inputs.size());
  RunMembers(
      static_cast<int>(inputs.size()),
      [&](int rank, Communicator& comm) {
        if ((makers >> rank & 1) == 0) {
          std::vector<float> data = inputs[rank];
          Status status = comm.WeightedAllReduce(data, weights[rank]);
          ASSERT_TRUE(status.ok()) << status;
          seen[rank].result = std::move(data);
        } else {
          std::vector<float> data(inputs[rank].size(), std::numeric_limits<float>::quiet_NaN());
          auto squares =
              comm.MadeAllReduce(data, weights[rank], Maker(inputs[rank], data, comm, seen[rank]));
          ASSERT_TRUE(squares.ok()) << squares.status();
          seen[rank].squares = *squares;
          seen[rank].result = std::move(data);
        }
        seen[rank].operations = comm.stats().operations;
        seen[rank].kept_bytes = comm.stats().kept_bytes;
      },
      "job/round/7/",
      [&](CommunicatorOptions& o) {
        o.segment_bytes = 4096;
        o.member_racks = racks;
      });
  return seen;
}

void ExpectSameBits(const std::vector<float>& got, const std::vector<float>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  if (!want.empty()) {
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0) << what;
  }
}

class MadeAllReduceTest
    : public ::testing::TestWithParam<std::tuple<int, size_t, std::vector<std::string>>> {};

TEST_P(MadeAllReduceTest, GivesWeightedAllReducesBitsAndMakesEachValueOnceWhileSending) {
  auto [members, n, racks] = GetParam();
  if (!racks.empty()) racks.resize(static_cast<size_t>(members), "b");
  std::vector<std::vector<float>> inputs;
  std::vector<double> weights;
  for (int r = 0; r < members; ++r) {
    inputs.push_back(MemberData(r, n));
    weights.push_back(MemberWeight(r));
  }
  const auto want = Reference(inputs, weights, racks);
  const auto seen = RunMade(inputs, weights, racks);
  for (int r = 0; r < members; ++r) {
    const std::string what = "member " + std::to_string(r) + " of " + std::to_string(members);
    ExpectSameBits(seen[r].result, want[r], what);
    EXPECT_EQ(std::count(seen[r].made.begin(), seen[r].made.end(), 1),
              static_cast<std::ptrdiff_t>(n))
        << what << ": every value made exactly once";
    double squares = 0;
    for (float v : inputs[r]) squares += static_cast<double>(v) * v;
    EXPECT_NEAR(seen[r].squares, squares, 1e-9 * std::max(1.0, squares)) << what;
    EXPECT_EQ(seen[r].operations, 1u) << what;
    // 20,000 values in 4 KiB segments: far more segments than the receive
    // window. The pieces of the first segments left, and were summed,
    // before the last was made.
    if (n >= 20'000) {
      EXPECT_GT(seen[r].calls, 16u) << what;
      EXPECT_GT(seen[r].sent_before_last, 0u) << what << ": made whole before anything was sent";
      EXPECT_TRUE(seen[r].reduced_before_last) << what << ": made whole before the reduction";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, MadeAllReduceTest,
                         ::testing::Combine(::testing::Values(2, 3),
                                            ::testing::Values(size_t{0}, size_t{3}, size_t{1001},
                                                              size_t{20'000}),
                                            // No racks; the members in two racks (the sum by rack).
                                            ::testing::Values(std::vector<std::string>{},
                                                              std::vector<std::string>{"a"})));

TEST(MadeAllReduceTest, OneMemberMakesItsValuesAndKeepsThem) {
  const std::vector<std::vector<float>> inputs{MemberData(0, 1001)};
  const auto want = Reference(inputs, {5.0});
  const auto seen = RunMade(inputs, {5.0});
  ExpectSameBits(seen[0].result, want[0], "one member");
  EXPECT_EQ(std::count(seen[0].made.begin(), seen[0].made.end(), 1), 1001);
}

TEST(MadeAllReduceTest, AMemberWhoseValuesAreNotFiniteIsLeftOutWithTheBitsOfZeros) {
  // Member 1's values hold a NaN (or an infinity) far into the buffer, made
  // after its first pieces left: every member ends with WeightedAllReduce's
  // bits for member 1 passing zeros with weight 0, in a second reduction.
  for (float poison :
       {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
    for (int members : {2, 3}) {
      const size_t n = 20'000;
      std::vector<std::vector<float>> inputs;
      std::vector<double> weights;
      for (int r = 0; r < members; ++r) {
        inputs.push_back(MemberData(r, n));
        weights.push_back(MemberWeight(r));
      }
      inputs[1][n - 7] = poison;
      const auto want = ReferenceLeavingOut(inputs, weights, 1);
      const auto seen = RunMade(inputs, weights);
      for (int r = 0; r < members; ++r) {
        const std::string what = "member " + std::to_string(r) + " of " + std::to_string(members) +
                                 ", poison " + std::to_string(poison);
        ExpectSameBits(seen[r].result, want[r], what);
        EXPECT_EQ(std::isfinite(seen[r].squares), r != 1) << what;
        EXPECT_EQ(seen[r].operations, 2u) << what;
        for (float v : seen[r].result) ASSERT_TRUE(std::isfinite(v)) << what;
      }
    }
  }
}

TEST(MadeAllReduceTest, MembersThatMakeTheirValuesAndMembersThatGiveThemMeetInOneReduction) {
  // One fp32 protocol: any members make their values, the others give
  // theirs (WeightedAllReduce), with WeightedAllReduce's bits; a member that
  // gives keeps a copy only when another makes.
  const size_t n = 20'000;
  for (int members : {2, 3}) {
    for (unsigned makers : {0u, 1u, 2u, 5u}) {
      if (makers >> members != 0) continue;
      std::vector<std::vector<float>> inputs;
      std::vector<double> weights;
      for (int r = 0; r < members; ++r) {
        inputs.push_back(MemberData(r, n));
        weights.push_back(MemberWeight(r));
      }
      const auto want = Reference(inputs, weights);
      const auto seen = RunMade(inputs, weights, {}, makers);
      for (int r = 0; r < members; ++r) {
        const bool makes = (makers >> r & 1) != 0;
        const std::string what = fmt::format("member {} of {}, makers {}", r, members, makers);
        ExpectSameBits(seen[r].result, want[r], what);
        EXPECT_EQ(seen[r].operations, 1u) << what;
        EXPECT_EQ(seen[r].kept_bytes, !makes && makers != 0 ? n * sizeof(float) : 0) << what;
        if (makes) {
          EXPECT_EQ(std::count(seen[r].made.begin(), seen[r].made.end(), 1),
                    static_cast<std::ptrdiff_t>(n))
              << what;
        }
      }
    }
  }
}

TEST(MadeAllReduceTest, AMakerNotFiniteIsLeftOutBesideMembersThatGaveTheirValues) {
  // Member 1 makes its values, a NaN among the last; the others gave theirs,
  // which the first reduction overwrote: the second reduces their kept
  // copies, with the bits of member 1's zeros and weight 0.
  const size_t n = 20'000;
  for (int members : {2, 3}) {
    std::vector<std::vector<float>> inputs;
    std::vector<double> weights;
    for (int r = 0; r < members; ++r) {
      inputs.push_back(MemberData(r, n));
      weights.push_back(MemberWeight(r));
    }
    inputs[1][n - 7] = std::numeric_limits<float>::quiet_NaN();
    const auto want = ReferenceLeavingOut(inputs, weights, 1);
    const auto seen = RunMade(inputs, weights, {}, /*makers=*/2u);
    for (int r = 0; r < members; ++r) {
      const std::string what = fmt::format("member {} of {}", r, members);
      ExpectSameBits(seen[r].result, want[r], what);
      EXPECT_EQ(seen[r].operations, 2u) << what;
      for (float v : seen[r].result) ASSERT_TRUE(std::isfinite(v)) << what;
    }
    EXPECT_FALSE(std::isfinite(seen[1].squares));
  }
}

TEST(MadeAllReduceTest, AMemberOfWeightZeroThatGivesItsValuesKeepsNoCopyForTheSecondReduction) {
  // Three members: 0 gives its values, 1 makes them (a NaN among the last:
  // left out), 2 gives zeros with weight 0 (a fresh join's part). Member 2
  // keeps no copy (it reduces zeros again, whatever it gave); member 0 keeps
  // one; every member ends with the bits of 1 and 2 passing zeros.
  const size_t n = 20'000;
  std::vector<std::vector<float>> inputs;
  std::vector<double> weights;
  for (int r = 0; r < 3; ++r) {
    inputs.push_back(MemberData(r, n));
    weights.push_back(MemberWeight(r));
  }
  inputs[1][n - 7] = std::numeric_limits<float>::quiet_NaN();
  inputs[2].assign(n, 0.0f);
  weights[2] = 0;
  const auto want = ReferenceLeavingOut(inputs, weights, 1);
  const auto seen = RunMade(inputs, weights, {}, /*makers=*/2u);
  for (int r = 0; r < 3; ++r) {
    const std::string what = fmt::format("member {}", r);
    ExpectSameBits(seen[r].result, want[r], what);
    EXPECT_EQ(seen[r].operations, 2u) << what;
  }
  EXPECT_EQ(seen[0].kept_bytes, n * sizeof(float));
  EXPECT_EQ(seen[2].kept_bytes, 0u);
}

TEST(MadeAllReduceTest, EveryMemberNotFiniteIsRefusedOnEveryMember) {
  std::vector<StatusCode> codes(2, StatusCode::kOk);
  RunMembers(
      2,
      [&](int rank, Communicator& comm) {
        std::vector<float> source = MemberData(rank, 20'000);
        source[rank * 100] = std::numeric_limits<float>::quiet_NaN();
        std::vector<float> data(source.size());
        Made seen;
        auto squares = comm.MadeAllReduce(data, 1.0, Maker(source, data, comm, seen));
        codes[rank] = squares.status().code();
        EXPECT_NE(std::string(StatusMessage(squares.status())).find("sum to 0"), std::string::npos)
            << squares.status();
      },
      "job/round/7/", [](CommunicatorOptions& o) { o.segment_bytes = 4096; });
  EXPECT_EQ(codes, std::vector<StatusCode>(2, StatusCode::kInvalidArgument));
}

TEST(MadeAllReduceTest, WeightsSummingToZeroAreRefusedAfterEveryPieceWasMadeAndDrained) {
  // The refusal comes once the weights arrived, with most pieces not made
  // yet: every member makes and sends the rest as it drains the others', so
  // none waits for a piece that will not come (that would end in the 20 s
  // deadline, not INVALID_ARGUMENT).
  std::vector<StatusCode> codes(2, StatusCode::kOk);
  std::vector<std::ptrdiff_t> made(2);
  RunMembers(
      2,
      [&](int rank, Communicator& comm) {
        std::vector<float> source = MemberData(rank, 100'000);
        std::vector<float> data(source.size());
        Made seen;
        auto squares = comm.MadeAllReduce(data, 0.0, Maker(source, data, comm, seen));
        codes[rank] = squares.status().code();
        made[rank] = std::count(seen.made.begin(), seen.made.end(), 1);
        EXPECT_TRUE(comm.broken());
      },
      "job/round/7/", [](CommunicatorOptions& o) { o.segment_bytes = 4096; });
  EXPECT_EQ(codes, std::vector<StatusCode>(2, StatusCode::kInvalidArgument));
  EXPECT_EQ(made, std::vector<std::ptrdiff_t>(2, 100'000));
}

TEST(MadeAllReduceTest, AHungMemberFailsTheOtherWithADeadlineNamingIt) {
  const Micros timeout = 1500 * kMicrosPerMilli;
  InProcessStore store;
  std::atomic<bool> done{false};
  std::thread hung([&]() {
    auto comm = Communicator::Connect(store, MemberOptions(1, 2, "job/round/7/", timeout));
    ASSERT_TRUE(comm.ok()) << comm.status();
    EXPECT_TRUE(testing_util::WaitFor(30 * kMicrosPerSecond, [&]() { return done.load(); }));
  });
  auto comm = Communicator::Connect(store, MemberOptions(0, 2, "job/round/7/", timeout));
  ASSERT_TRUE(comm.ok()) << comm.status();
  std::vector<float> source = MemberData(0, 100'000);
  std::vector<float> data(source.size());
  Made seen;
  auto squares = (*comm)->MadeAllReduce(data, 1.0, Maker(source, data, **comm, seen));
  done = true;
  hung.join();
  EXPECT_EQ(squares.status().code(), StatusCode::kDeadlineExceeded) << squares.status();
  EXPECT_NE(std::string(StatusMessage(squares.status())).find("member 1 ('learner-1')"),
            std::string::npos)
      << squares.status();
  EXPECT_TRUE((*comm)->broken());
}

// Member `rank` of four in `racks`: its flat communicator, made rack-aware.
StatusOr<std::unique_ptr<Communicator>> ConnectRackAwareMember(
    InProcessStore& store, int rank, const std::string& prefix,
    const std::vector<std::string>& racks, Micros timeout = 20 * kMicrosPerSecond) {
  CommunicatorOptions options = MemberOptions(rank, 4, prefix, timeout);
  options.connect_timeout = 20 * kMicrosPerSecond;
  options.segment_bytes = 4096;
  options.member_racks = racks;
  MEND_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> flat, Communicator::Connect(store, options));
  return ConnectRackAware(store, options, std::move(flat), racks);
}

TEST(MadeAllReduceTest, TheRackAwareMergeMakesTheValuesFirstWithTheSameBits) {
  // Four members in two racks: the rack-aware communicator (no pipelined
  // path of its own) makes every value first, then reduces as
  // WeightedAllReduce does, with the flat merge's bits.
  const std::vector<std::string> racks{"a", "b", "a", "b"};
  std::vector<std::vector<float>> inputs;
  std::vector<double> weights;
  for (int r = 0; r < 4; ++r) {
    inputs.push_back(MemberData(r, 5000));
    weights.push_back(MemberWeight(r));
  }
  const auto want = Reference(inputs, weights, racks);
  std::vector<std::vector<float>> got(4);
  InProcessStore store;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 4; ++rank) {
    threads.emplace_back([&, rank]() {
      auto comm = ConnectRackAwareMember(store, rank, "job/round/7/", racks);
      ASSERT_TRUE(comm.ok()) << comm.status();
      std::vector<float> data(inputs[rank].size());
      Made seen;
      auto squares =
          (*comm)->MadeAllReduce(data, weights[rank], Maker(inputs[rank], data, **comm, seen));
      ASSERT_TRUE(squares.ok()) << squares.status();
      EXPECT_EQ(seen.calls, 1u);
      got[rank] = std::move(data);
    });
  }
  for (auto& thread : threads) thread.join();
  for (int r = 0; r < 4; ++r) ExpectSameBits(got[r], want[r], "member " + std::to_string(r));
}

// The rack-aware merge gathers the members' norms in one collective on the
// flat communicator (beside its reduction when the member makes its
// values) and has the bits of the flat merge: whoever makes or gives its
// values, with or without a member the rule leaves out.
TEST(MadeAllReduceTest, TheRackAwareMergeGathersTheNormsInOneFlatCollectiveWithTheSameBits) {
  const std::vector<std::string> racks{"a", "b", "a", "b"};
  constexpr size_t kValues = 5000;
  const Communicator::LeaveOut outlier = [](std::span<const double> squares,
                                            std::span<const double>) {
    return squares[3] > 100 * squares[0] ? std::vector<int>{3} : std::vector<int>{};
  };
  int run = 0;
  for (const bool loud : {false, true}) {
    std::vector<std::vector<float>> inputs;
    std::vector<double> weights;
    for (int r = 0; r < 4; ++r) {
      inputs.push_back(MemberData(r, kValues));
      if (loud && r == 3)
        for (float& v : inputs.back()) v *= 1000;
      weights.push_back(MemberWeight(r));
    }
    // The flat reduction's bits, member 3 as zeros with weight 0 when loud.
    std::vector<std::vector<float>> reference_inputs = inputs;
    std::vector<double> reference_weights = weights;
    if (loud) {
      std::fill(reference_inputs[3].begin(), reference_inputs[3].end(), 0.0f);
      reference_weights[3] = 0;
    }
    const auto want = Reference(reference_inputs, reference_weights, racks);
    for (const unsigned makers : {0xfu, 0x5u, 0x0u}) {
      const std::string which = fmt::format("makers {:#x}{}", makers, loud ? ", 3 loud" : "");
      std::vector<std::vector<float>> got(4);
      std::vector<std::vector<int>> left_out(4);
      std::vector<uint64_t> merge_operations(4), reduce_operations(4);
      std::vector<size_t> makes(4, 0);
      InProcessStore store;
      std::vector<std::thread> threads;
      const std::string prefix = fmt::format("job/round/{}/", ++run);
      for (int rank = 0; rank < 4; ++rank) {
        threads.emplace_back([&, rank]() {
          auto comm = ConnectRackAwareMember(store, rank, prefix, racks);
          ASSERT_TRUE(comm.ok()) << comm.status();
          // A plain reduction first: what the merge adds to its operations.
          std::vector<float> plain = inputs[rank];
          const uint64_t before = (*comm)->stats().operations;
          ASSERT_TRUE((*comm)->WeightedAllReduce(plain, weights[rank]).ok());
          reduce_operations[rank] = (*comm)->stats().operations - before;
          Communicator::MergeValues values;
          std::vector<float> data(kValues, std::numeric_limits<float>::quiet_NaN());
          Made seen;
          const Communicator::MakeValues make = Maker(inputs[rank], data, **comm, seen);
          double squares = 0;
          if ((makers >> rank & 1) != 0) {
            values.make = &make;
          } else {
            data = inputs[rank];
            for (float v : data) squares += static_cast<double>(v) * v;
            values.squares = squares;
          }
          values.leave_out = &outlier;
          const uint64_t merge_before = (*comm)->stats().operations;
          auto merged = (*comm)->MergeAllReduce(data, weights[rank], values);
          ASSERT_TRUE(merged.ok()) << which << ": " << merged.status();
          merge_operations[rank] = (*comm)->stats().operations - merge_before;
          left_out[rank] = merged->left_out;
          makes[rank] = seen.calls;
          got[rank] = std::move(data);
        });
      }
      for (auto& thread : threads) thread.join();
      for (int r = 0; r < 4; ++r) {
        const std::string member = which + ", member " + std::to_string(r);
        ExpectSameBits(got[r], want[r], member);
        EXPECT_EQ(left_out[r], loud ? std::vector<int>{3} : std::vector<int>{}) << member;
        // One collective for the norms (three through the racks: the
        // rack's gather, the columns', the rack's broadcast), and a second
        // reduction only when a member made its values and one is left out.
        const bool again = loud && makers != 0;
        EXPECT_EQ(merge_operations[r], (again ? 2 : 1) * reduce_operations[r] + 1) << member;
        // (The member left out sends zeros the second time, not its values.)
        if ((makers >> r & 1) != 0) {
          EXPECT_EQ(makes[r], again && r != 3 ? 2u : 1u) << member;
        }
      }
    }
  }
}

// A member of a rack-aware merge that never comes fails the others' merges
// (the gather on the flat communicator and the reduction through the racks
// both wait for it) with a deadline, once, and leaves them broken.
TEST(MadeAllReduceTest, AHungMemberFailsTheRackAwareMergeWithADeadline) {
  const std::vector<std::string> racks{"a", "b", "a", "b"};
  const Micros timeout = 1500 * kMicrosPerMilli;
  InProcessStore store;
  std::atomic<bool> done{false};
  std::vector<StatusCode> codes(3, StatusCode::kOk);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 4; ++rank) {
    threads.emplace_back([&, rank]() {
      auto comm = ConnectRackAwareMember(store, rank, "job/round/9/", racks, timeout);
      ASSERT_TRUE(comm.ok()) << comm.status();
      if (rank == 3) {
        EXPECT_TRUE(testing_util::WaitFor(60 * kMicrosPerSecond, [&]() { return done.load(); }));
        return;
      }
      std::vector<float> source = MemberData(rank, 10'000);
      std::vector<float> data(source.size());
      Made seen;
      auto squares = (*comm)->MadeAllReduce(data, 1.0, Maker(source, data, **comm, seen));
      codes[static_cast<size_t>(rank)] = squares.status().code();
      EXPECT_EQ(seen.calls, 1u);
      EXPECT_TRUE((*comm)->broken());
    });
  }
  // (Member 3 waits until the others' merges ended.)
  for (int rank = 0; rank < 3; ++rank) threads[static_cast<size_t>(rank)].join();
  done = true;
  threads[3].join();
  // The first to give up does so at its deadline; a member still waiting on
  // a peer that gave up before it may see that peer's connections end
  // instead (ABORTED: seen under load).
  EXPECT_GE(std::count(codes.begin(), codes.end(), StatusCode::kDeadlineExceeded), 1);
  for (StatusCode code : codes) {
    EXPECT_TRUE(code == StatusCode::kDeadlineExceeded || code == StatusCode::kAborted) << code;
  }
}

// Forwards every operation to `flat` but the merges, which are then the
// base class's: the sums of squares in a collective of their own first.
class NormsApart final : public Communicator {
 public:
  explicit NormsApart(Communicator& flat) : flat_(flat) {}
  Status WeightedAllReduce(std::span<float> data, double weight, const Codec* codec) override {
    return flat_.WeightedAllReduce(data, weight, codec);
  }
  Status WeightedAllGatherDecode(std::span<const std::byte> payload, double weight,
                                 const Codec& codec, std::span<float> out) override {
    return flat_.WeightedAllGatherDecode(payload, weight, codec, out);
  }
  Status AllGather(std::span<const std::byte> mine, std::span<std::byte> out) override {
    return flat_.AllGather(mine, out);
  }
  Status Broadcast(std::span<std::byte> data, int root) override {
    return flat_.Broadcast(data, root);
  }
  void Abort(const std::string& reason) override { flat_.Abort(reason); }
  int rank() const override { return flat_.rank(); }
  int world_size() const override { return flat_.world_size(); }
  bool broken() const override { return flat_.broken(); }
  CommunicatorStats stats() const override { return flat_.stats(); }

 private:
  Communicator& flat_;
};

TEST(MadeAllReduceTest, ACodecsMergeLeavesOutAlikeWithTheNormsBesideThePiecesOrApart) {
  // Four members, member 3's values 1000x the others': through int8
  // (MergeAllReduce) and top-k (MergeAllGatherDecode), the rule leaves
  // member 3 out on every member with the same bits whether the norms
  // travel beside the pieces (Gloo's: one collective) or in a collective
  // of their own first (the base class's: two).
  constexpr size_t kValues = 5000;
  const Communicator::LeaveOut outlier = [](std::span<const double> squares,
                                            std::span<const double>) {
    return squares[3] > 100 * squares[0] ? std::vector<int>{3} : std::vector<int>{};
  };
  for (CodecKind kind : {CodecKind::kInt8, CodecKind::kTopK}) {
    auto codec = MakeCodec({kind, 64, 256, 16});
    ASSERT_TRUE(codec.ok());
    auto run = [&](bool apart) {
      std::vector<std::vector<float>> results(4);
      std::vector<std::vector<int>> left(4);
      std::vector<uint64_t> operations(4);
      RunMembers(4, [&](int rank, Communicator& flat) {
        NormsApart wrapped(flat);
        Communicator& comm = apart ? static_cast<Communicator&>(wrapped) : flat;
        std::vector<float> data = MemberData(rank, kValues);
        if (rank == 3)
          for (float& v : data) v *= 1000.0f;
        double squares = 0;
        for (float v : data) squares += static_cast<double>(v) * v;
        if ((*codec)->dense()) {
          Communicator::MergeValues values;
          values.squares = squares;
          values.leave_out = &outlier;
          values.codec = codec->get();
          auto merged = comm.MergeAllReduce(data, MemberWeight(rank), values);
          ASSERT_TRUE(merged.ok()) << merged.status();
          left[rank] = merged->left_out;
        } else {
          std::vector<std::byte> payload((*codec)->EncodedBytes(kValues));
          (*codec)->Encode(data, payload);
          auto left_out = comm.MergeAllGatherDecode(payload, MemberWeight(rank), squares, &outlier,
                                                    **codec, data);
          ASSERT_TRUE(left_out.ok()) << left_out.status();
          left[rank] = *left_out;
        }
        results[rank] = std::move(data);
        operations[rank] = flat.stats().operations;
      });
      return std::make_tuple(results, left, operations);
    };
    const auto [beside, beside_left, beside_ops] = run(false);
    const auto [apart, apart_left, apart_ops] = run(true);
    for (int r = 0; r < 4; ++r) {
      const std::string what = fmt::format("{}, member {}", CodecName(kind), r);
      EXPECT_EQ(beside_left[r], std::vector<int>{3}) << what;
      EXPECT_EQ(apart_left[r], std::vector<int>{3}) << what;
      EXPECT_EQ(beside_ops[r], 1u) << what;
      EXPECT_EQ(apart_ops[r], 2u) << what;
      ExpectSameBits(beside[r], apart[r], what);
      ExpectSameBits(beside[r], beside[0], what);
      for (float v : beside[r]) ASSERT_LT(std::fabs(v), 100.0f) << what;  // member 3's not in it
    }
  }
}

}  // namespace
}  // namespace mend
