#include "reducer/group_layout.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "fmt/format.h"
#include "fmt/ranges.h"

namespace mend::reducer {

SliceRange SliceOf(size_t total, int size, int rank) {
  // total * r fits in 64 bits for any model (r < size <= 1024).
  const auto cut = [&](int r) {
    return static_cast<size_t>(static_cast<uint64_t>(total) * static_cast<uint64_t>(r) /
                               static_cast<uint64_t>(size));
  };
  return {cut(rank), cut(rank + 1)};
}

namespace {

// Each parameter's holders, from the first rank of each: a set is who
// holds its parameters, in the order of its first parameter.
StatusOr<std::vector<ReplicaSet>> FindSets(const std::vector<std::vector<uint64_t>>& keys,
                                           const std::vector<std::vector<uint64_t>>& numels) {
  const size_t ranks = keys.size();
  std::map<std::vector<int>, size_t> set_of;
  std::vector<ReplicaSet> sets;
  for (size_t i = 0; i < keys[0].size(); ++i) {
    std::vector<bool> placed(ranks, false);
    for (size_t q = 0; q < ranks; ++q) {
      if (placed[q]) continue;
      std::vector<int> members;
      for (size_t p = q; p < ranks; ++p) {
        if (keys[p][i] != keys[q][i]) continue;
        if (numels[p][i] != numels[q][i]) {
          return InvalidArgumentError(fmt::format(
              "group layout: parameter {} has {} values on group rank {} and {} on group rank "
              "{}, which pass the same replica key for it (they must hold the same values)",
              i, numels[q][i], q, numels[p][i], p));
        }
        placed[p] = true;
        members.push_back(static_cast<int>(p));
      }
      auto [it, added] = set_of.try_emplace(members, sets.size());
      if (added) sets.push_back({members, {}, 0});
      sets[it->second].parameters.push_back(i);
      sets[it->second].total += numels[q][i];
    }
  }
  return sets;
}

}  // namespace

StatusOr<GroupLayout> GroupLayout::Make(int rank, const std::vector<std::vector<uint64_t>>& keys,
                                        const std::vector<std::vector<uint64_t>>& numels) {
  const size_t ranks = keys.size();
  if (ranks == 0 || numels.size() != ranks || rank < 0 || static_cast<size_t>(rank) >= ranks) {
    return InvalidArgumentError(
        fmt::format("group layout: {} ranks' keys and {} ranks' value counts for rank {}", ranks,
                    numels.size(), rank));
  }
  const size_t count = keys[0].size();
  for (size_t q = 0; q < ranks; ++q) {
    if (keys[q].size() != count || numels[q].size() != count) {
      return InvalidArgumentError(
          fmt::format("group layout: group rank {} has {} parameters, group rank 0 {}", q,
                      keys[q].size(), count));
    }
  }
  GroupLayout layout;
  MEND_ASSIGN_OR_RETURN(layout.sets_, FindSets(keys, numels));
  layout.numels_ = numels[static_cast<size_t>(rank)];
  layout.contributions_.resize(ranks);
  for (size_t s = 0; s < layout.sets_.size(); ++s) {
    const ReplicaSet& set = layout.sets_[s];
    layout.sharded_ = layout.sharded_ || set.members.size() < ranks;
    for (size_t j = 0; j < set.members.size(); ++j) {
      const int member = set.members[j];
      const SliceRange slice =
          SliceOf(set.total, static_cast<int>(set.members.size()), static_cast<int>(j));
      if (member == rank) {
        std::vector<ParameterPiece> pieces = layout.SlicePieces(s, rank);
        layout.own_.insert(layout.own_.end(), pieces.begin(), pieces.end());
      }
      if (set.members.size() == 1) continue;
      auto& contribution = layout.contributions_[static_cast<size_t>(member)];
      const size_t at =
          contribution.empty() ? 0 : contribution.back().at + contribution.back().slice.size();
      contribution.push_back({s, at, slice});
      layout.widest_ = std::max(layout.widest_, at + slice.size());
    }
  }
  return layout;
}

size_t GroupLayout::own_values() const {
  return std::accumulate(
      own_.begin(), own_.end(), size_t{0},
      [](size_t sum, const ParameterPiece& piece) { return sum + piece.values; });
}

std::vector<ParameterPiece> GroupLayout::SlicePieces(size_t set, int rank) const {
  const ReplicaSet& replicas = sets_[set];
  const auto member = std::find(replicas.members.begin(), replicas.members.end(), rank);
  const SliceRange range = SliceOf(replicas.total, static_cast<int>(replicas.members.size()),
                                   static_cast<int>(member - replicas.members.begin()));
  std::vector<ParameterPiece> pieces;
  size_t offset = 0;
  for (size_t i : replicas.parameters) {
    const size_t n = numels_[i];
    const size_t lo = std::max(offset, range.begin);
    const size_t hi = std::min(offset + n, range.end);
    if (lo < hi) pieces.push_back({i, lo - offset, hi - lo});
    offset += n;
  }
  return pieces;
}

}  // namespace mend::reducer
