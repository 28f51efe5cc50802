// The learner's side of the control messages, for both channels: the gRPC
// client (lighthouse_client.cc) and the datagram link (datagram_link.cc).
// Requests, decisions and acknowledgements are the protocol's messages
// themselves (mend/lighthouse_client.h): nothing here copies their fields.
// A decision travels, with the status a join failed with, as a
// DatagramDecision: over UDP, and from a group's rank 0 to its other ranks
// (reducer/group_round_services.cc).
//
// Thread-safety: pure functions.
#pragma once

#include "mend/lighthouse_client.h"
#include "mend/v1/lighthouse.pb.h"

namespace mend {

// A request's `learner` field; left unset for an empty reference (a
// datagram's session says who instead).
template <typename Request>
void FillLearnerRef(const LearnerRef& learner, Request* request) {
  if (learner.learner_id.empty()) return;
  request->mutable_learner()->set_learner_id(learner.learner_id);
  request->mutable_learner()->set_session_id(learner.session_id);
}

// A decision (a round, or the status the join failed with) as the message a
// datagram carries, and back; `where` prefixes an error's message (e.g.
// "lighthouse HOST:PORT (udp): Quorum"). A code outside the known ones
// reads as UNKNOWN.
v1::DatagramDecision DecisionToProto(const StatusOr<QuorumResult>& result);
StatusOr<QuorumResult> DecisionFromProto(const v1::DatagramDecision& decision,
                                         std::string_view where);

}  // namespace mend
