// One fragment's outer rounds among in-process members: bit-identical global
// state, convergence to the token-weighted optimum, the robust merge, codecs
// with error feedback, and a failed round that changes nothing.
#include "mend/outer_sync.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>

#include "dataplane/dataplane_fixture.h"
#include "fmt/format.h"
#include "test_util/wait.h"

namespace mend {
namespace {

using testing_util::InProcessStore;
using testing_util::MemberOptions;
using testing_util::RunMembers;

constexpr size_t kSize = 2000;

std::vector<float> Target(int rank) {
  std::mt19937 random(rank + 7);
  std::normal_distribution<float> normal(static_cast<float>(rank), 1.0f);
  std::vector<float> target(kSize);
  for (float& v : target) v = normal(random);
  return target;
}

double Tokens(int rank) { return 1000.0 * (rank + 1); }

// H inner steps of gradient descent on ||theta - target||^2 / 2.
void Train(std::vector<float>& theta, const std::vector<float>& target, int steps) {
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < theta.size(); ++i) theta[i] -= 0.1f * (theta[i] - target[i]);
  }
}

// Runs `rounds` synchronous DiLoCo rounds on every member; returns each
// member's final global state and the dropped lists of the last round.
struct MemberRun {
  std::vector<float> global;
  std::vector<std::vector<float>> globals_by_round;
  std::vector<int> last_dropped;
};

// An Exchange's `make` that copies `own` into `delta`, range by range.
Communicator::MakeValues CopiesInto(const std::vector<float>& own, std::vector<float>& delta) {
  return [&own, &delta](size_t begin, size_t end) {
    double squares = 0;
    for (size_t i = begin; i < end; ++i) {
      delta[i] = own[i];
      squares += static_cast<double>(own[i]) * own[i];
    }
    return squares;
  };
}

// Four members exchange, member 3's pseudo-gradient 1000x the others'
// (finite; from seed `seed` + rank), through `codec` (nullptr: fp32); the
// members set in the bit mask `makers` make theirs in the merge; with
// `sits_out` member 3 does not contribute. Each member's merged values, the
// members it dropped and its collectives.
struct OutlierRun {
  std::vector<std::vector<float>> merged;
  std::vector<std::vector<int>> dropped;
  std::vector<uint64_t> operations;
};
constexpr int kOutlierMembers = 4;
OutlierRun RunWithAnOutlier(const Codec* codec, uint64_t seed, bool sits_out, unsigned makers) {
  OutlierRun run{std::vector<std::vector<float>>(kOutlierMembers),
                 std::vector<std::vector<int>>(kOutlierMembers),
                 std::vector<uint64_t>(kOutlierMembers)};
  RunMembers(kOutlierMembers, [&](int rank, Communicator& comm) {
    FragmentState state(std::vector<float>(kSize, 0.0f));
    OuterSyncOptions options;
    options.codec = codec;
    options.contributes = !(sits_out && rank == 3);
    std::vector<float> own = testing_util::NormalValues(seed + static_cast<uint64_t>(rank), kSize);
    if (rank == 3)
      for (float& v : own) v *= 1000.0f;
    std::vector<float> delta = own;
    const Communicator::MakeValues make = CopiesInto(own, delta);
    const bool makes = (makers >> rank & 1) != 0;
    if (makes) std::fill(delta.begin(), delta.end(), 1e30f);
    auto result = OuterRound::Exchange(comm, state, delta, Tokens(rank), options, std::nullopt,
                                       makes ? &make : nullptr);
    ASSERT_TRUE(result.ok()) << result.status();
    run.merged[rank] = delta;
    run.dropped[rank] = result->dropped;
    run.operations[rank] = comm.stats().operations;
  });
  return run;
}

// `made`: the members (a bit each) whose exchange makes the pseudo-gradient
// itself (Exchange's `make`); the others' was made before the exchange.
std::vector<MemberRun> RunRounds(int members, int rounds, const OuterSyncOptions& options,
                                 int poison_rank = -1, unsigned made = 0) {
  std::vector<MemberRun> runs(members);
  RunMembers(members, [&](int rank, Communicator& comm) {
    std::vector<float> initial(kSize, 0.0f);
    FragmentState state(initial);
    std::vector<float> theta = initial;
    auto target = Target(rank);
    for (int round = 0; round < rounds; ++round) {
      Train(theta, target, 5);
      std::vector<float> delta(kSize);
      PseudoGradient(state.global(), theta, delta);
      if (rank == poison_rank && round == rounds - 1) delta[17] = std::nanf("");
      const std::vector<float> own = delta;  // the exchange merges `delta` in place
      const Communicator::MakeValues make = CopiesInto(own, delta);
      const bool makes = (made >> rank & 1) != 0;
      if (makes) std::fill(delta.begin(), delta.end(), 1e30f);  // to be made by the exchange
      auto result = OuterRound::Exchange(comm, state, delta, Tokens(rank), options, std::nullopt,
                                         makes ? &make : nullptr);
      ASSERT_TRUE(result.ok()) << result.status();
      runs[rank].last_dropped = result->dropped;
      std::vector<float> base(state.global().begin(), state.global().end());
      OuterRound::Commit(state, std::move(*result), delta, options.outer);
      ApplyOuterResult(theta, state.global(), base, own, OuterApply::kExact, 0.5f);
      runs[rank].globals_by_round.emplace_back(state.global().begin(), state.global().end());
    }
    runs[rank].global.assign(state.global().begin(), state.global().end());
  });
  return runs;
}

void ExpectBitIdentical(const std::vector<MemberRun>& runs) {
  for (size_t r = 1; r < runs.size(); ++r) {
    ASSERT_EQ(runs[r].globals_by_round.size(), runs[0].globals_by_round.size());
    for (size_t k = 0; k < runs[0].globals_by_round.size(); ++k) {
      ASSERT_EQ(std::memcmp(runs[r].globals_by_round[k].data(), runs[0].globals_by_round[k].data(),
                            kSize * sizeof(float)),
                0)
          << "member " << r << " differs from member 0 after round " << k + 1;
    }
  }
}

TEST(OuterSyncTest, DiLoCoRoundsAreBitIdenticalAndReachTheTokenWeightedOptimum) {
  OuterSyncOptions options;  // eta 0.7, mu 0.9, token-weighted
  auto runs = RunRounds(3, 40, options);
  ExpectBitIdentical(runs);
  // The fixed point of the rounds is the token-weighted mean of the targets.
  double total = Tokens(0) + Tokens(1) + Tokens(2);
  double error = 0;
  for (size_t i = 0; i < kSize; ++i) {
    double want = 0;
    for (int r = 0; r < 3; ++r) want += Tokens(r) / total * Target(r)[i];
    error = std::max(error, std::fabs(want - runs[0].global[i]));
  }
  EXPECT_LT(error, 1e-2);
}

TEST(OuterSyncTest, UniformWeightsReachThePlainMean) {
  OuterSyncOptions options;
  options.token_weighted = false;
  auto runs = RunRounds(2, 40, options);
  double error = 0;
  for (size_t i = 0; i < kSize; ++i) {
    error = std::max(error, std::fabs(0.5 * (Target(0)[i] + Target(1)[i]) - runs[1].global[i]));
  }
  EXPECT_LT(error, 1e-2);
}

TEST(OuterSyncTest, AWarmupRoundAveragesAndLeavesTheMomentumForTheNextRound) {
  // Round 1 is an outer warm-up round: the global state becomes the
  // members' token-weighted average, and the momentum stays zero, so round
  // 2's Nesterov step starts its momentum from round 2's pseudo-gradient
  // alone. Without the warm-up round 1's delta would stay in it (mu delta_1).
  const auto mean = [](size_t i) {
    return (Tokens(0) * Target(0)[i] + Tokens(1) * Target(1)[i]) / (Tokens(0) + Tokens(1));
  };
  std::vector<std::vector<float>> momentum_after(2), global_after(2);
  RunMembers(2, [&](int rank, Communicator& comm) {
    std::vector<float> initial(kSize, 0.0f);
    FragmentState state(initial);
    const std::vector<float> theta = Target(rank);
    std::vector<float> delta(kSize);
    PseudoGradient(state.global(), theta, delta);
    OuterSyncOptions options;
    options.warmup = true;
    auto first = OuterRound::Exchange(comm, state, delta, Tokens(rank), options);
    ASSERT_TRUE(first.ok()) << first.status();
    OuterRound::Commit(state, std::move(*first), delta, options.outer);
    for (size_t i = 0; i < kSize; ++i) {
      ASSERT_NEAR(state.global()[i], mean(i), 1e-4) << i;
      ASSERT_EQ(state.momentum()[i], 0.0f) << i;
    }
    // Round 2: every member moved by 1 from the average.
    std::vector<float> second_delta(kSize, -1.0f);
    options.warmup = false;
    auto second = OuterRound::Exchange(comm, state, second_delta, Tokens(rank), options);
    ASSERT_TRUE(second.ok()) << second.status();
    OuterRound::Commit(state, std::move(*second), second_delta, options.outer);
    momentum_after[rank].assign(state.momentum().begin(), state.momentum().end());
    global_after[rank].assign(state.global().begin(), state.global().end());
  });
  for (int rank = 0; rank < 2; ++rank) {
    for (size_t i = 0; i < kSize; ++i) {
      ASSERT_FLOAT_EQ(momentum_after[rank][i], -1.0f) << i;
      // eta (delta + mu m) = 0.7 x (-1 + 0.9 x -1) = -1.33
      ASSERT_NEAR(global_after[rank][i], mean(i) + 1.33, 1e-4) << i;
    }
  }
}

TEST(OuterSyncTest, NaNPseudoGradientIsDroppedOnEveryMember) {
  OuterSyncOptions options;
  auto runs = RunRounds(3, 3, options, /*poison_rank=*/1);
  for (const MemberRun& run : runs) {
    EXPECT_EQ(run.last_dropped, std::vector<int>{1});
    for (float v : run.global) ASSERT_TRUE(std::isfinite(v));
  }
  ExpectBitIdentical(runs);
}

TEST(OuterSyncTest, WithTwoMembersANaNPseudoGradientIsLeftOutOnBoth) {
  // The norms travel beside the weights: both members leave the poisoned
  // one out, and the survivor's merge is its own pseudo-gradient.
  OuterSyncOptions options;
  auto runs = RunRounds(2, 3, options, /*poison_rank=*/1);
  EXPECT_EQ(runs[1].last_dropped, std::vector<int>{1});
  EXPECT_EQ(runs[0].last_dropped, std::vector<int>{1});
  for (const MemberRun& run : runs) {
    for (float v : run.global) ASSERT_TRUE(std::isfinite(v));
  }
  ExpectBitIdentical(runs);
}

TEST(OuterSyncTest, APseudoGradientMadeByTheExchangeGivesTheSameBits) {
  // Made as the merge reaches each piece, by every member or by some (the
  // others' made before the exchange: they keep a copy for a second
  // reduction); a member not finite is dropped alike, whichever made it.
  for (int members : {2, 3}) {
    for (int poison : {-1, 1}) {
      for (unsigned makers : {~0u, 1u, 2u}) {
        const std::string what = fmt::format("{} members, poison {}, makers {}", members, poison,
                                             makers == ~0u ? "all" : std::to_string(makers));
        OuterSyncOptions options;
        auto whole = RunRounds(members, 4, options, poison);
        auto made = RunRounds(members, 4, options, poison, makers);
        for (int r = 0; r < members; ++r) {
          ASSERT_EQ(made[r].globals_by_round.size(), whole[r].globals_by_round.size()) << what;
          for (size_t k = 0; k < whole[r].globals_by_round.size(); ++k) {
            ASSERT_EQ(std::memcmp(made[r].globals_by_round[k].data(),
                                  whole[r].globals_by_round[k].data(), kSize * sizeof(float)),
                      0)
                << what << ": member " << r << ", round " << k + 1;
          }
          EXPECT_EQ(made[r].last_dropped, whole[r].last_dropped) << what;
        }
        if (poison >= 0) {
          EXPECT_EQ(made[1].last_dropped, std::vector<int>{1}) << what;
        }
      }
    }
  }
}

TEST(OuterSyncTest, AnFp32RoundMakesOneCollective) {
  // Counted on the communicator: the merge only (the norms travel beside
  // the weights), with two members or three.
  std::vector<uint64_t> collectives(2), three(3);
  RunMembers(2, [&](int rank, Communicator& comm) {
    FragmentState state(std::vector<float>(kSize, 0.0f));
    std::vector<float> delta(kSize, 1.0f);
    auto result = OuterRound::Exchange(comm, state, delta, 1, OuterSyncOptions{});
    ASSERT_TRUE(result.ok()) << result.status();
    collectives[rank] = comm.stats().operations;
  });
  RunMembers(3, [&](int rank, Communicator& comm) {
    FragmentState state(std::vector<float>(kSize, 0.0f));
    std::vector<float> delta(kSize, 1.0f);
    auto result = OuterRound::Exchange(comm, state, delta, 1, OuterSyncOptions{});
    ASSERT_TRUE(result.ok()) << result.status();
    three[rank] = comm.stats().operations;
  });
  EXPECT_EQ(collectives, (std::vector<uint64_t>{1, 1}));
  EXPECT_EQ(three, (std::vector<uint64_t>{1, 1, 1}));
}

TEST(OuterSyncTest, AnOutlierIsLeftOutAlikeWhetherItsPseudoGradientWasMadeBeforeOrInTheMerge) {
  // Four members, member 3's pseudo-gradient 1000x the others' (finite):
  // the robust rule leaves it out on every member, with the bits of a round
  // it sat out (contributes = false). Made before the round by everyone, it
  // is left out of the sums as they are made (one reduction); made in the
  // merge by any member, after them, and every member reduces again.
  const OutlierRun want = RunWithAnOutlier(nullptr, 50, /*sits_out=*/true, 0u);
  for (int r = 0; r < kOutlierMembers; ++r) EXPECT_TRUE(want.dropped[r].empty()) << r;
  for (unsigned makers : {0u, 1u << 3, 1u, 0xFu}) {
    const auto [merged, dropped, operations] = RunWithAnOutlier(nullptr, 50, false, makers);
    for (int r = 0; r < kOutlierMembers; ++r) {
      const std::string what = fmt::format("makers {:#x}, member {}", makers, r);
      EXPECT_EQ(dropped[r], std::vector<int>{3}) << what;
      ASSERT_EQ(std::memcmp(merged[r].data(), want.merged[r].data(), kSize * sizeof(float)), 0)
          << what;
      EXPECT_EQ(operations[r], makers == 0 ? 1u : 2u) << what;
    }
  }
}

TEST(OuterSyncTest, ADenseCodecsRoundLeavesAnOutlierOutInOneCollective) {
  // Four members merging through int8, member 3's pseudo-gradient 1000x the
  // others': the norms travel beside the merge's first pieces (one
  // collective, not a gather of norms first), every member leaves member 3
  // out, with the bits of a round it sat out (zeros, weight 0), whether its
  // pseudo-gradient was made before the exchange or by it.
  auto codec = MakeCodec({CodecKind::kInt8, 64, 256, 16});
  ASSERT_TRUE(codec.ok());
  const OutlierRun want = RunWithAnOutlier(codec->get(), 70, /*sits_out=*/true, 0u);
  for (int r = 0; r < kOutlierMembers; ++r) {
    EXPECT_TRUE(want.dropped[r].empty()) << r;
    EXPECT_EQ(want.operations[r], 1u) << r;
  }
  for (unsigned makers : {0u, 1u << 3, 0xFu}) {
    const auto [merged, dropped, operations] = RunWithAnOutlier(codec->get(), 70, false, makers);
    for (int r = 0; r < kOutlierMembers; ++r) {
      const std::string what = fmt::format("makers {:#x}, member {}", makers, r);
      EXPECT_EQ(dropped[r], std::vector<int>{3}) << what;
      EXPECT_EQ(operations[r], 1u) << what;
      ASSERT_EQ(std::memcmp(merged[r].data(), want.merged[r].data(), kSize * sizeof(float)), 0)
          << what;
      for (float v : merged[r]) ASSERT_TRUE(std::isfinite(v)) << what;
    }
  }
  // Not finite: left out alike, the others' rounds finite and identical.
  OuterSyncOptions options;
  options.codec = codec->get();
  auto poisoned = RunRounds(3, 3, options, /*poison_rank=*/1);
  for (const MemberRun& member : poisoned) {
    EXPECT_EQ(member.last_dropped, std::vector<int>{1});
    for (float v : member.global) ASSERT_TRUE(std::isfinite(v));
  }
  ExpectBitIdentical(poisoned);
}

TEST(OuterSyncTest, ASparseCodecsRoundLeavesAnOutlierOutInOneCollective) {
  // The same through top-k among four: each member's norm beside its
  // payload, member 3 left out on every member with the bits of a round it
  // sat out, and its error feedback as it was before the round (the round
  // did not take its values); the others' residuals as in that round.
  constexpr int kMembers = 4;
  auto codec = MakeCodec({CodecKind::kTopK, 64, 256, 16});
  ASSERT_TRUE(codec.ok());
  auto run = [&](bool sits_out) {
    std::vector<std::vector<float>> merged(kMembers), residual(kMembers);
    std::vector<std::vector<int>> dropped(kMembers);
    std::vector<uint64_t> operations(kMembers);
    RunMembers(kMembers, [&](int rank, Communicator& comm) {
      FragmentState state(std::vector<float>(kSize, 0.0f));
      state.AssignResidual(testing_util::NormalValues(90 + rank, kSize));
      OuterSyncOptions options;
      options.codec = codec->get();
      options.contributes = !(sits_out && rank == 3);
      std::vector<float> delta = testing_util::NormalValues(80 + rank, kSize);
      if (rank == 3)
        for (float& v : delta) v *= 1000.0f;
      auto result = OuterRound::Exchange(comm, state, delta, Tokens(rank), options);
      ASSERT_TRUE(result.ok()) << result.status();
      merged[rank] = delta;
      dropped[rank] = result->dropped;
      residual[rank] = result->residual;
      operations[rank] = comm.stats().operations;
    });
    return std::make_tuple(merged, dropped, residual, operations);
  };
  const auto [want, none, want_residual, sat_out_ops] = run(/*sits_out=*/true);
  const auto [merged, dropped, residual, operations] = run(/*sits_out=*/false);
  for (int r = 0; r < kMembers; ++r) {
    EXPECT_TRUE(none[r].empty()) << r;
    EXPECT_EQ(sat_out_ops[r], 1u) << r;
    EXPECT_EQ(dropped[r], std::vector<int>{3}) << r;
    EXPECT_EQ(operations[r], 1u) << r;
    ASSERT_EQ(std::memcmp(merged[r].data(), want[r].data(), kSize * sizeof(float)), 0) << r;
    EXPECT_EQ(residual[r], want_residual[r]) << r;
  }
  EXPECT_EQ(residual[3], testing_util::NormalValues(93, kSize));  // as before the round
  EXPECT_NE(residual[0], testing_util::NormalValues(90, kSize));  // fed back
  // Not finite: left out alike, every member's rounds finite and identical.
  OuterSyncOptions options;
  options.codec = codec->get();
  options.outer = {1.0f, 0.0f};
  auto poisoned = RunRounds(3, 3, options, /*poison_rank=*/1);
  for (const MemberRun& member : poisoned) {
    EXPECT_EQ(member.last_dropped, std::vector<int>{1});
    for (float v : member.global) ASSERT_TRUE(std::isfinite(v));
  }
  ExpectBitIdentical(poisoned);
}

TEST(OuterSyncTest, CompressedRoundsStayBitIdentical) {
  for (CodecKind kind : {CodecKind::kInt4, CodecKind::kTopK}) {
    auto codec = MakeCodec({kind, 64, 256, 16});
    ASSERT_TRUE(codec.ok());
    OuterSyncOptions options;
    options.codec = codec->get();
    if (kind == CodecKind::kTopK) options.outer = {1.0f, 0.0f};  // SparseLoCo
    auto runs = RunRounds(3, 8, options);
    ExpectBitIdentical(runs);
    for (float v : runs[0].global) ASSERT_TRUE(std::isfinite(v)) << CodecName(kind);
  }
}

TEST(OuterSyncTest, AnAbstainingMemberChangesNothingInTheMerge) {
  // Three members; member 2 has nothing of the job's state (contributes =
  // false) and a wild delta: the round's result is the token-weighted merge
  // of members 0 and 1 alone, the same on every member, and nobody is
  // reported as dropped.
  auto delta_of = [](int rank) {
    return std::vector<float>(kSize, rank == 2 ? 1e6f : static_cast<float>(rank + 1));
  };
  std::vector<std::vector<float>> globals(3);
  RunMembers(3, [&](int rank, Communicator& comm) {
    FragmentState state(std::vector<float>(kSize, 0.0f));
    OuterSyncOptions options;
    options.contributes = rank != 2;
    std::vector<float> delta = delta_of(rank);
    auto result = OuterRound::Exchange(comm, state, delta, Tokens(rank), options);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_TRUE(result->dropped.empty());
    OuterRound::Commit(state, std::move(*result), delta, options.outer);
    globals[rank].assign(state.global().begin(), state.global().end());
  });
  std::vector<float> two;
  RunMembers(2, [&](int rank, Communicator& comm) {
    FragmentState state(std::vector<float>(kSize, 0.0f));
    std::vector<float> delta = delta_of(rank);
    auto result = OuterRound::Exchange(comm, state, delta, Tokens(rank), OuterSyncOptions{});
    ASSERT_TRUE(result.ok()) << result.status();
    OuterRound::Commit(state, std::move(*result), delta, OuterSyncOptions{}.outer);
    if (rank == 0) two.assign(state.global().begin(), state.global().end());
  });
  for (int rank = 1; rank < 3; ++rank) EXPECT_EQ(globals[rank], globals[0]) << "member " << rank;
  ASSERT_EQ(two.size(), kSize);
  for (size_t i = 0; i < kSize; i += 97) EXPECT_NEAR(globals[0][i], two[i], 1e-5) << i;
}

TEST(OuterSyncTest, FailedRoundChangesNothing) {
  // Member 1 never takes part: member 0's exchange fails and its state is
  // exactly what it was.
  InProcessStore store;
  std::atomic<bool> done{false};
  std::thread absent([&]() {
    auto comm = Communicator::Connect(store, MemberOptions(1, 2, "job/round/3/", kMicrosPerSecond));
    ASSERT_TRUE(comm.ok());
    EXPECT_TRUE(testing_util::WaitFor(30 * kMicrosPerSecond, [&]() { return done.load(); }));
  });
  auto comm = Communicator::Connect(store, MemberOptions(0, 2, "job/round/3/", kMicrosPerSecond));
  ASSERT_TRUE(comm.ok());
  std::vector<float> initial(kSize, 1.0f);
  FragmentState state(initial);
  std::vector<float> delta(kSize, 0.5f);
  auto result = OuterRound::Exchange(**comm, state, delta, 1.0, OuterSyncOptions{});
  done = true;
  absent.join();
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(std::vector<float>(state.global().begin(), state.global().end()), initial);
  for (float m : state.momentum()) EXPECT_EQ(m, 0.0f);
}

TEST(RobustDropsTest, OutlierNormsAndNonFiniteAreDropped) {
  EXPECT_EQ(RobustDrops(std::vector<double>{1.0, 1.1, 0.9, 50.0}, 6.0), std::vector<int>{3});
  EXPECT_EQ(RobustDrops(std::vector<double>{1.0, std::nan(""), 1.0}, 6.0), std::vector<int>{1});
  EXPECT_EQ(RobustDrops(std::vector<double>{1.0, INFINITY}, 6.0), std::vector<int>{1});
  // Two members: no norm comparison, only non-finite ones go.
  EXPECT_TRUE(RobustDrops(std::vector<double>{1.0, 100.0}, 6.0).empty());
  // Off.
  EXPECT_TRUE(RobustDrops(std::vector<double>{1.0, 1.0, 1.0, 100.0}, 0.0).empty());
  // Close norms are not outliers, nor is the spread that learners training on
  // different data legitimately have (found by the convergence test above).
  EXPECT_TRUE(RobustDrops(std::vector<double>{1.0, 1.02, 0.98, 1.05}, 6.0).empty());
  EXPECT_TRUE(RobustDrops(std::vector<double>{31.2, 17.0, 16.2}, 6.0).empty());
  EXPECT_EQ(RobustDrops(std::vector<double>{170.0, 17.0, 16.2}, 6.0), std::vector<int>{0});
}

}  // namespace
}  // namespace mend
