// The learner's side of the control messages, once for both channels: the
// gRPC client (lighthouse_client.cc) and the datagram link
// (datagram_link.cc) build their requests and read their answers with
// these, and a group's ranks share rank 0's decisions as the same message
// (reducer/group_round_services.cc). A decision and an acknowledgement
// are the protocol's messages themselves (QuorumResult, HeartbeatAck):
// nothing here copies their fields.
//
// Thread-safety: pure functions.
#pragma once

#include "mend/lighthouse_client.h"
#include "mend/v1/lighthouse.pb.h"

namespace mend {

// The most a join may wait, as the lighthouse bounds it (timeout_ms).
inline constexpr Micros kMaxJoinTimeout = 3'600'000 * kMicrosPerMilli;

// A request's `learner` field; left unset for an empty reference (a
// datagram's session says who instead).
template <typename Request>
void FillLearnerRef(const LearnerRef& learner, Request* request) {
  if (learner.learner_id.empty()) return;
  request->mutable_learner()->set_learner_id(learner.learner_id);
  request->mutable_learner()->set_session_id(learner.session_id);
}

void FillHeartbeatRequest(const LearnerRef& learner, const HeartbeatUpdate& update,
                          v1::HeartbeatRequest* request);
v1::QuorumRequest QuorumRequestProto(const QuorumRequestArgs& args);

// A decision (a round, or the status the join failed with) as the message a
// datagram carries, and back; `where` prefixes an error's message (e.g.
// "lighthouse HOST:PORT (udp): Quorum"). A code outside the known ones
// reads as UNKNOWN.
v1::DatagramDecision DecisionToProto(const StatusOr<QuorumResult>& result);
StatusOr<QuorumResult> DecisionFromProto(const v1::DatagramDecision& decision,
                                         std::string_view where);

}  // namespace mend
