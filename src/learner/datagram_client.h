// A learner's end of the datagram control channel (see datagram.h): one UDP
// socket towards the lighthouse and a thread that receives. One client can
// speak for many sessions (a process that multiplexes learners); replies are
// dispatched to each session's callbacks.
//
// Thread-safety: every method may be called from any thread. Callbacks run on
// the receiving thread, without any lock of this class held.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "core/mutex.h"
#include "mend/status.h"
#include "mend/v1/lighthouse.pb.h"
#include "wire/datagram.h"

namespace mend::coordinator {

class DatagramClient {
 public:
  struct Callbacks {
    std::function<void(const v1::HeartbeatResponse&)> on_ack;
    std::function<void(const v1::DatagramDecision&)> on_decision;
    // The session ended: NOT_FOUND when the lighthouse does not know it
    // (register again), ALREADY_EXISTS when a newer registration took its
    // learner id (stop).
    std::function<void(const Status& why)> on_session_ended;
  };

  // Opens a socket towards host:port; `token` is the job token.
  [[nodiscard]] static StatusOr<std::unique_ptr<DatagramClient>> Open(const std::string& host,
                                                                      int port,
                                                                      const std::string& token);
  ~DatagramClient();

  DatagramClient(const DatagramClient&) = delete;
  DatagramClient& operator=(const DatagramClient&) = delete;

  // Points the socket at another lighthouse address (e.g. after a restart on
  // another port).
  [[nodiscard]] Status Retarget(const std::string& host, int port);

  void Attach(uint64_t session_id, Callbacks callbacks);
  void Detach(uint64_t session_id);

  // Each sends one datagram per entry (sendmmsg for several); best effort.
  // The requests' learner fields may be left unset: the session says who.
  void SendHeartbeats(const std::vector<std::pair<uint64_t, v1::HeartbeatRequest>>& beats);
  void SendJoins(const std::vector<std::pair<uint64_t, v1::DatagramJoin>>& joins);

 private:
  DatagramClient(const std::string& token, int socket);
  void Receive();
  static void Dispatch(const Callbacks& callbacks, datagram::Kind kind, std::string_view bytes);
  // Under send_mu_, so that datagrams leave in sequence order (the
  // lighthouse drops one whose number it has passed).
  void SendAll(std::vector<std::string>& datagrams) ABSL_EXCLUSIVE_LOCKS_REQUIRED(send_mu_);

  const datagram::Key key_;
  const int socket_;
  int wake_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread thread_;

  Mutex send_mu_;
  datagram::Signer send_signer_ ABSL_GUARDED_BY(send_mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(send_mu_);

  Mutex mu_;
  struct Session {
    std::shared_ptr<Callbacks> callbacks;
    uint64_t last_seq = 0;
  };
  std::unordered_map<uint64_t, Session> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mend::coordinator
