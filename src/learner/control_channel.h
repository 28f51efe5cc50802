// One channel of a learner's control plane to its lighthouse: heartbeats
// out, acknowledgements back, and quorum joins. Two implement it: the gRPC
// channel here (the heartbeat stream and the Quorum call of a
// LighthouseClient) and the datagram link (datagram_link.h). Both read the
// lighthouse's answers with learner/control_proto.h. LearnerAgentImpl holds
// one of each and picks between them by one rule (LearnerAgentImpl::Channel).
//
// Thread-safety: every method may be called from any thread; the
// acknowledgement hook runs on the channel's own thread.
#pragma once

#include <functional>
#include <memory>

#include "mend/clock.h"
#include "mend/lighthouse_client.h"
#include "mend/status.h"

namespace mend {

class ControlChannel {
 public:
  virtual ~ControlChannel() = default;

  // Speaks for `session` from now on (a new registration): what the channel
  // held for the old one is dropped, and its acknowledgement clock restarts.
  virtual void Attach(const LearnerRef& session) = 0;
  // Sends a heartbeat; never blocks. An error says the channel broke before
  // it (a heartbeat stream that ended) and why; that heartbeat was not sent,
  // and the next starts afresh.
  virtual Status SendHeartbeat(const v1::HeartbeatRequest& update) = 0;
  // When the lighthouse last acknowledged a heartbeat, or the channel last
  // started afresh (an acknowledgement is not due before one is sent).
  virtual Micros last_ack_at() const = 0;
  // Starts afresh: the next heartbeat opens a new stream (acknowledgements
  // stopped, or the learner registers again).
  virtual void Restart() = 0;
  // Joins a round: blocks until the decision, the join's timeout, or
  // Interrupt() (ABORTED).
  [[nodiscard]] virtual StatusOr<QuorumResult> Join(const v1::QuorumRequest& request) = 0;
  // Ends a Join in progress, and every later one, with ABORTED.
  virtual void Interrupt() = 0;
};

// The gRPC channel over `client` (not owned; it must outlive the channel);
// `on_ack` runs on a gRPC thread for every acknowledgement. Its times are on
// `clock`.
std::unique_ptr<ControlChannel> NewGrpcControlChannel(
    LighthouseClient& client, const Clock& clock, std::function<void(const HeartbeatAck&)> on_ack);

}  // namespace mend
