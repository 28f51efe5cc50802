// The lighthouse's control calls, handled once for both channels: the gRPC
// service (service.h) and the datagram server (datagram_server.h) are glue
// around this. It owns the rules both follow: requests checked only through
// validation.h, when a heartbeat is acknowledged, and what a round decision
// tells a member (with the cut that fits a decision into one datagram).
// Whether a learner must register again is wire::NeedsRegistration
// (wire/protocol_rules.h), which the learners' side uses too.
//
// Thread-safety: stateless over the core (which is thread-safe); an
// AckState belongs to its caller, who serialises the calls that use it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "coordinator/lighthouse_core.h"
#include "mend/status.h"
#include "mend/v1/lighthouse.pb.h"

namespace mend::coordinator {

class ControlHandler {
 public:
  // `core` is not owned and must outlive the handler.
  explicit ControlHandler(LighthouseCore* core) : core_(core) {}

  // What a channel keeps of one learner's acknowledgements.
  struct AckState {
    bool sent = false;
    Micros sent_at = 0;
    v1::HeartbeatResponse last;
  };

  // A heartbeat, checked and given to the core. The error is the call's
  // answer: INVALID_ARGUMENT naming the field, or what the core said
  // (NeedsRegistration: the learner must register again).
  [[nodiscard]] StatusOr<HeartbeatResult> Heartbeat(const v1::HeartbeatRequest& request);
  // The same for a learner the channel knows by its session (a datagram's):
  // the request's `learner` is not read.
  [[nodiscard]] StatusOr<HeartbeatResult> HeartbeatOf(std::string learner_id, uint64_t session_id,
                                                      const v1::HeartbeatRequest& request);
  // The acknowledgement to send now for `result`, or nullopt when none is
  // due; records it in `state`. One is due for the first heartbeat, when the
  // slow flag or the quorum shortfall changed, when a round closed while the
  // learner's join waits (it was passed over, and trains on once it knows),
  // and every ack_interval. A new round id alone waits for the interval, or
  // every learner would be acknowledged right after each round closes.
  std::optional<v1::HeartbeatResponse> AckDue(AckState& state, const HeartbeatResult& result) const;

  // A join, checked and given to the core; `done` runs once with the
  // decision, on whichever thread closes the round. Returns the core's wait
  // id (for CancelQuorum), or the check's error (`done` is not called).
  [[nodiscard]] StatusOr<uint64_t> Quorum(const v1::QuorumRequest& request, QuorumCallback done);
  void CancelQuorum(const std::string& learner_id, uint64_t wait_id) {
    core_->CancelQuorum(learner_id, wait_id);
  }

  LighthouseCore* core() const { return core_; }

 private:
  LighthouseCore* const core_;
};

// What member `assignment.rank` of the round learns; the member list only
// when `include_members` and the round is small enough (kMaxMembersInReply).
void FillQuorumResponse(const RoundAssignment& assignment, bool include_members,
                        v1::QuorumResponse* response);
inline constexpr size_t kMaxMembersInReply = 1024;

// The decision a datagram carries: the round without its member list, or
// the error's code and message; heal_to cut to what fits in `max_bytes`.
// Fill reuses what `decision` holds (a sending thread's own).
void FillDatagramDecision(uint64_t join_id, const StatusOr<RoundAssignment>& result,
                          size_t max_bytes, v1::DatagramDecision* decision);
inline v1::DatagramDecision MakeDatagramDecision(uint64_t join_id,
                                                 const StatusOr<RoundAssignment>& result,
                                                 size_t max_bytes) {
  v1::DatagramDecision decision;
  FillDatagramDecision(join_id, result, max_bytes, &decision);
  return decision;
}

}  // namespace mend::coordinator
