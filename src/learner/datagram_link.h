// One learner's use of the datagram control channel: heartbeats, and quorum
// joins that are resent until their decision arrives. LearnerAgent uses it
// when control_plane = "udp" and the lighthouse serves the channel.
//
// Thread-safety: every method may be called from any thread; the hooks run
// on the channel's receiving thread.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "core/mutex.h"
#include "learner/datagram_client.h"
#include "mend/clock.h"
#include "mend/lighthouse_client.h"

namespace mend::coordinator {

class DatagramLink {
 public:
  struct Hooks {
    std::function<void(const HeartbeatAck&)> on_ack;
    // The lighthouse does not know `session_id`: register again.
    std::function<void(uint64_t session_id)> on_unknown_session;
  };

  // `clock` (not owned; it must outlive the link) times the
  // acknowledgements and the joins' timeouts.
  [[nodiscard]] static StatusOr<std::unique_ptr<DatagramLink>> Open(
      const std::string& host, int port, const std::string& token, const Clock& clock, Hooks hooks);

  // Speaks for `session_id` from now on (a new registration); restarts the
  // acknowledgement clock.
  void Attach(uint64_t session_id);
  // Sends to another port of the same host from now on.
  [[nodiscard]] Status Retarget(int port);
  int port() const;
  void SendHeartbeat(const HeartbeatUpdate& update);
  // Joins a round: sends the join every `resend` until the decision comes,
  // args.timeout passes (DEADLINE_EXCEEDED) or Interrupt() (ABORTED).
  [[nodiscard]] StatusOr<QuorumResult> Join(const QuorumRequestArgs& args, Micros resend);
  // Ends a Join in progress, and every later one, with ABORTED.
  void Interrupt();
  Micros last_ack_at() const;

 private:
  DatagramLink(std::string host, int port, const Clock& clock, Hooks hooks)
      : host_(std::move(host)),
        clock_(clock),
        hooks_(std::move(hooks)),
        port_(port),
        last_ack_at_(clock.NowMicros()) {}
  std::string Where() const;

  const std::string host_;
  const Clock& clock_;
  const Hooks hooks_;
  std::unique_ptr<DatagramClient> client_;

  mutable Mutex mu_;
  CondVar decided_;
  int port_ ABSL_GUARDED_BY(mu_);
  uint64_t session_id_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_join_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t waiting_for_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<v1::DatagramDecision> decision_ ABSL_GUARDED_BY(mu_);
  bool interrupted_ ABSL_GUARDED_BY(mu_) = false;
  Micros last_ack_at_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mend::coordinator
