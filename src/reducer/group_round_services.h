// The round services of a multi-rank learner (learner_group.h): every rank
// runs a round of its own slice, but the group joins each round once. Rank
// 0's Quorum() is the learner's join through the lighthouse; it publishes
// what came of it (the round, or the error) in the group's store under
// <group prefix>decision/<n>, and the n-th Quorum() of every other rank reads
// that decision instead of asking the lighthouse. So every rank of the group
// sees the same rounds in the same order. The rest (the rendezvous store,
// the communicator, the abort watch, the clock) is the inner services'.
//
// Thread-safety: as RoundServices (the round's thread); Interrupt from any.
#pragma once

#include <memory>
#include <string>

#include "mend/rendezvous_store.h"
#include "reducer/round_services.h"

namespace mend::reducer {

// Over `inner` (the lighthouse's services of this rank). `decisions` is a
// connection to the group's store of its own; `base` the group's prefix
// there; a rank other than 0 waits up to the round's timeout plus `margin`
// for rank 0's decision. `learner_id` names the learner in errors.
std::unique_ptr<RoundServices> GroupRoundServices(std::unique_ptr<RoundServices> inner,
                                                  std::unique_ptr<RendezvousStore> decisions,
                                                  std::string base, int rank, Micros margin,
                                                  std::string learner_id);

// A round decision (or the error rank 0's join ended with) as the group's
// store carries it: the protocol's own decision message (v1::DatagramDecision,
// read by learner/control_proto.h), and back (INTERNAL when the bytes do not
// parse).
std::string EncodeDecision(const StatusOr<QuorumResult>& result);
StatusOr<QuorumResult> DecodeDecision(const std::string& bytes);

}  // namespace mend::reducer
