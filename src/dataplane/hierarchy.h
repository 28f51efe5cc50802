// The rack-aware merge (rack_aware = true, several learners in a rack): a
// round's weighted all-reduce in three steps instead of one across every
// member:
//   1. inside each rack, the members' weighted mean (fp32; the rack's links
//      are fast), and the rack's total weight;
//   2. across racks, between one representative per rack (the rack's first
//      member in rank order), the racks' means weighted by those totals,
//      through the round's codec;
//   3. inside each rack, the representative's result to the others (its
//      bytes: every member ends with the same bits, for every codec).
// Cross-rack bytes fall by the number of learners per rack. AllGather goes
// the same way. A round's merge (MergeAllReduce) gathers the members' sums
// of squares for the robust rule directly between all of them on the flat
// communicator, beside the reduction when the member makes its values (one
// cross-rack latency, not two); Broadcast (healing) and the sparse codecs'
// all-gather run on the flat communicator unchanged.
//
// Thread-safety: as Communicator.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mend/communicator.h"

namespace mend {

// Members' ranks by rack: racks in name order, each with its members in
// rank order (`racks[r]` is member r's). The order of the rack-aware merge,
// and of the flat fp32 sum with racks (CommunicatorOptions::member_racks),
// which is why the two give the same bits.
std::vector<std::vector<int>> MembersByRack(const std::vector<std::string>& racks);

// `flat` is the round's communicator (options.prefix, rank, world size);
// `racks[r]` is member r's rack. Returns `flat` itself when no rack holds two
// members or every member is in one rack (nothing to save); else connects a
// communicator per rack (<prefix>rack/<index>/) and one of the
// representatives (<prefix>reps/), and returns the three as one.
[[nodiscard]] StatusOr<std::unique_ptr<Communicator>> ConnectRackAware(
    RendezvousStore& store, const CommunicatorOptions& options, std::unique_ptr<Communicator> flat,
    const std::vector<std::string>& racks);

}  // namespace mend
