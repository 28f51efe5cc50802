// One learner's use of the datagram control channel: heartbeats, and quorum
// joins that are resent until their decision arrives. It is the datagram
// ControlChannel (control_channel.h); LearnerAgent uses it when
// control_plane = "udp" and the lighthouse serves the channel.
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
#include "learner/control_channel.h"
#include "learner/datagram_client.h"
#include "mend/clock.h"
#include "mend/lighthouse_client.h"

namespace mend::coordinator {

class DatagramLink final : public ControlChannel {
 public:
  struct Hooks {
    std::function<void(const HeartbeatAck&)> on_ack;
    // `session_id` ended: NOT_FOUND when the lighthouse does not know it
    // (register again), ALREADY_EXISTS when a newer registration took its
    // learner id (stop).
    std::function<void(uint64_t session_id, const Status& why)> on_session_ended;
  };

  // `clock` (not owned; it must outlive the link) times the
  // acknowledgements and the joins' timeouts; a join is sent again every
  // `resend` until its decision comes.
  [[nodiscard]] static StatusOr<std::unique_ptr<DatagramLink>> Open(const std::string& host,
                                                                    int port,
                                                                    const std::string& token,
                                                                    const Clock& clock, Hooks hooks,
                                                                    Micros resend);

  // ControlChannel. Attach speaks for the session's id (the lighthouse
  // knows the learner by it); a heartbeat never fails here (a lost one is
  // covered by the next); Restart has nothing to drop.
  void Attach(const LearnerRef& session) override;
  Status SendHeartbeat(const v1::HeartbeatRequest& update) override;
  Micros last_ack_at() const override;
  void Restart() override {}
  // Sends the join every `resend` until the decision comes, args.timeout
  // passes (DEADLINE_EXCEEDED) or Interrupt() (ABORTED).
  [[nodiscard]] StatusOr<QuorumResult> Join(const v1::QuorumRequest& request) override;
  void Interrupt() override;
  // Sends to another port of the same host from now on.
  [[nodiscard]] Status Retarget(int port);
  int port() const;

 private:
  DatagramLink(std::string host, int port, const Clock& clock, Hooks hooks, Micros resend)
      : host_(std::move(host)),
        clock_(clock),
        hooks_(std::move(hooks)),
        resend_(resend),
        port_(port),
        last_ack_at_(clock.NowMicros()) {}
  std::string Where() const;

  const std::string host_;
  const Clock& clock_;
  const Hooks hooks_;
  const Micros resend_;
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
