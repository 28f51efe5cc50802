// Which rank of a group exchanges which values: the layout of a learner's
// model over its ranks.
//
// Each rank passes its parameters (the same names in the same order on
// every rank) with a replica key each (FlatParameters::replica_key): the
// ranks that pass the same key for a parameter hold the same values of it.
//   - DDP: every parameter's key is 0 on every rank: every rank holds the
//     whole model, one replica set of all ranks.
//   - FSDP2 (Shard(0) over the group): each rank's key is its own, and its
//     values are its shard: a set of one rank per parameter.
//   - Tensor parallelism, or TP x FSDP: a parameter TP leaves whole or a
//     Replicate() placement is held by the ranks that share the coordinates
//     of its sharded mesh dimensions.
// The parameters held by the same ranks form a replica set. A set's values
// (its parameters in order, concatenated) are cut into one contiguous slice
// per member (SliceOf), and member j exchanges slice j across racks, with
// the same rank of every other learner. A set of one rank is that rank's
// alone: its whole. So every value crosses racks from exactly one rank, and
// a sharded model needs no all-gather: after a round only the sets of more
// than one member are shared among their members (ShareParameters).
//
// Every rank computes the whole layout from every rank's keys and value
// counts (gathered at LearnerGroup::Join), so all agree on it.
//
// Thread-safety: immutable after Make.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "mend/status.h"

namespace mend::reducer {

// [begin, end) of the flat values.
struct SliceRange {
  size_t begin = 0;
  size_t end = 0;
  size_t size() const { return end - begin; }
};

// Slice `rank` of `total` values cut into `size` contiguous, balanced parts.
SliceRange SliceOf(size_t total, int size, int rank);

// Values [offset, offset + values) of parameter `parameter`.
struct ParameterPiece {
  size_t parameter = 0;
  size_t offset = 0;
  size_t values = 0;
};

// The parameters held by the same ranks.
struct ReplicaSet {
  std::vector<int> members;        // group ranks, ascending
  std::vector<size_t> parameters;  // ascending
  size_t total = 0;                // their values
};

class GroupLayout {
 public:
  // `keys[q][i]` and `numels[q][i]`: rank q's replica key and value count
  // of parameter i (every rank has the same number of parameters).
  // INVALID_ARGUMENT when the ranks that share a key disagree on a
  // parameter's value count.
  [[nodiscard]] static StatusOr<GroupLayout> Make(int rank,
                                                  const std::vector<std::vector<uint64_t>>& keys,
                                                  const std::vector<std::vector<uint64_t>>& numels);

  // Whether some parameter is not held whole by every rank.
  bool sharded() const { return sharded_; }
  const std::vector<ReplicaSet>& sets() const { return sets_; }
  // This rank's pieces, in the order rank `rank` of every learner with this
  // layout has them: what its round driver exchanges.
  const std::vector<ParameterPiece>& own() const { return own_; }
  size_t own_values() const;

  // The pieces of `rank`'s slice of set `set` (rank a member of it: its
  // members hold its parameters alike).
  std::vector<ParameterPiece> SlicePieces(size_t set, int rank) const;

  // What rank q contributes to a share: its slices of the sets of more than
  // one member, in set order, concatenated. `at`: where set `set`'s slice
  // begins in it.
  struct Contribution {
    size_t set = 0;
    size_t at = 0;
    SliceRange slice;  // of the set's values
  };
  const std::vector<Contribution>& contributions(int q) const {
    return contributions_[static_cast<size_t>(q)];
  }
  // The longest contribution's values (what a share gathers from each rank).
  size_t widest_contribution() const { return widest_; }

 private:
  bool sharded_ = false;
  std::vector<ReplicaSet> sets_;
  std::vector<ParameterPiece> own_;
  std::vector<std::vector<Contribution>> contributions_;
  size_t widest_ = 0;
  std::vector<uint64_t> numels_;  // this rank's value counts
};

}  // namespace mend::reducer
