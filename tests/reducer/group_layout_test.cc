// GroupLayout: who exchanges which values of a model over a group's ranks.
#include "reducer/group_layout.h"

#include <map>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mend::reducer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using Rows = std::vector<std::vector<uint64_t>>;

// Each value of each parameter, counted once per rank that exchanges it.
std::map<std::pair<size_t, size_t>, int> Exchanged(const Rows& keys, const Rows& numels) {
  std::map<std::pair<size_t, size_t>, int> times;
  for (size_t r = 0; r < keys.size(); ++r) {
    auto layout = GroupLayout::Make(static_cast<int>(r), keys, numels);
    EXPECT_TRUE(layout.ok()) << layout.status();
    if (!layout.ok()) return times;
    for (const ParameterPiece& piece : layout->own()) {
      for (size_t k = 0; k < piece.values; ++k) times[{piece.parameter, piece.offset + k}]++;
    }
  }
  return times;
}

TEST(GroupLayoutTest, SlicesCoverTheModelOnceAndAreBalanced) {
  for (size_t total : {1ul, 13ul, 1000003ul}) {
    for (int size : {1, 2, 3, 8}) {
      size_t covered = 0;
      for (int r = 0; r < size; ++r) {
        SliceRange slice = SliceOf(total, size, r);
        EXPECT_EQ(slice.begin, covered);
        EXPECT_LE(slice.size(), total / static_cast<size_t>(size) + 1);
        covered = slice.end;
      }
      EXPECT_EQ(covered, total);
    }
  }
}

// DDP: every rank holds the whole model (keys 0): one set, cut as the flat
// model's values are, and shared whole after a round.
TEST(GroupLayoutTest, AReplicaIsCutIntoContiguousSlicesOfTheFlatModel) {
  const Rows keys = {{0, 0}, {0, 0}};
  const Rows numels = {{10, 3}, {10, 3}};
  auto rank1 = GroupLayout::Make(1, keys, numels);
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  EXPECT_FALSE(rank1->sharded());
  ASSERT_EQ(rank1->sets().size(), 1u);
  EXPECT_THAT(rank1->sets()[0].members, ElementsAre(0, 1));
  // Values [6, 13): 4 of the first parameter, then the second.
  ASSERT_EQ(rank1->own().size(), 2u);
  EXPECT_EQ(rank1->own()[0].parameter, 0u);
  EXPECT_EQ(rank1->own()[0].offset, 6u);
  EXPECT_EQ(rank1->own()[0].values, 4u);
  EXPECT_EQ(rank1->own()[1].parameter, 1u);
  EXPECT_EQ(rank1->own()[1].values, 3u);
  EXPECT_EQ(rank1->widest_contribution(), 7u);
  for (const auto& [value, times] : Exchanged(keys, numels)) EXPECT_EQ(times, 1);
  EXPECT_EQ(Exchanged(keys, numels).size(), 13u);
}

// FSDP2: each rank's shard of every parameter is its own (an uneven shard
// may be empty): the rank exchanges all of it, and nothing is shared.
TEST(GroupLayoutTest, ShardsAreTheirRanksOwnAndNeedNoShare) {
  const Rows keys = {{1, 1}, {2, 2}, {3, 3}};
  const Rows numels = {{8, 2}, {8, 1}, {4, 0}};
  for (int r = 0; r < 3; ++r) {
    auto layout = GroupLayout::Make(r, keys, numels);
    ASSERT_TRUE(layout.ok()) << layout.status();
    EXPECT_TRUE(layout->sharded());
    EXPECT_EQ(layout->widest_contribution(), 0u) << "a sharded model is never all-gathered";
    size_t own = 0;
    for (const ParameterPiece& piece : layout->own()) {
      EXPECT_EQ(piece.offset, 0u);
      EXPECT_EQ(piece.values, numels[static_cast<size_t>(r)][piece.parameter]);
      own += piece.values;
    }
    EXPECT_EQ(own, numels[static_cast<size_t>(r)][0] + numels[static_cast<size_t>(r)][1]);
  }
}

// TP: a parameter it leaves whole is held by every rank (key 0) and sliced
// among them; the sharded ones are each rank's own.
TEST(GroupLayoutTest, ReplicatedPiecesOfAShardedModelCrossOnceAndAreShared) {
  const Rows keys = {{1, 0, 1}, {2, 0, 2}};
  const Rows numels = {{6, 4, 3}, {6, 4, 3}};
  auto rank0 = GroupLayout::Make(0, keys, numels);
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  EXPECT_TRUE(rank0->sharded());
  EXPECT_EQ(rank0->widest_contribution(), 2u);  // its half of the 4 replicated values
  EXPECT_EQ(rank0->own_values(), 6u + 2u + 3u);
  const auto times = Exchanged(keys, numels);
  // The replicated parameter's 4 values are exchanged once, by one rank each.
  for (size_t k = 0; k < 4; ++k) EXPECT_EQ(times.at({1, k}), 1) << k;
  // A shard's value (the same index on both ranks) twice: once by each owner.
  EXPECT_EQ(times.at({0, 0}), 2);
}

// TP x FSDP on 4 ranks (dp 2 x tp 2; rank = dp * 2 + tp): a norm weight
// TP leaves whole is sharded by dp and replicated over tp, so ranks {0, 1}
// and {2, 3} each hold one copy.
TEST(GroupLayoutTest, ATwoDimensionalMeshMakesSetsOfTheRanksThatShareAShard) {
  const Rows keys = {{11, 10}, {12, 10}, {21, 20}, {22, 20}};
  const Rows numels = {{5, 4}, {5, 4}, {5, 4}, {5, 4}};
  auto rank2 = GroupLayout::Make(2, keys, numels);
  ASSERT_TRUE(rank2.ok()) << rank2.status();
  std::vector<std::vector<int>> members;
  for (const ReplicaSet& set : rank2->sets()) members.push_back(set.members);
  EXPECT_THAT(members, ElementsAre(ElementsAre(0), ElementsAre(1), ElementsAre(2), ElementsAre(3),
                                   ElementsAre(0, 1), ElementsAre(2, 3)));
  EXPECT_EQ(rank2->own_values(), 5u + 2u);
  ASSERT_EQ(rank2->contributions(3).size(), 1u);
  EXPECT_EQ(rank2->sets()[rank2->contributions(3)[0].set].members, (std::vector<int>{2, 3}));
  EXPECT_EQ(rank2->contributions(3)[0].slice.begin, 2u);
}

TEST(GroupLayoutTest, RanksThatShareAKeyButNotASizeAreRefusedNamingBoth) {
  auto layout = GroupLayout::Make(0, {{0}, {0}}, {{10}, {12}});
  ASSERT_FALSE(layout.ok());
  EXPECT_EQ(layout.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(layout.status().message()),
              HasSubstr("parameter 0 has 10 values on group rank 0 and 12 on group rank 1"));
  auto uneven = GroupLayout::Make(0, {{0, 0}, {0}}, {{1, 1}, {1}});
  ASSERT_FALSE(uneven.ok());
  EXPECT_THAT(std::string(uneven.status().message()), HasSubstr("group rank 1 has 1 parameters"));
}

}  // namespace
}  // namespace mend::reducer
