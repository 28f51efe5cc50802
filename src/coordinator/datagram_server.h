// The lighthouse's end of the datagram control channel (see datagram.h): one
// UDP socket, one thread. It reads datagrams in batches (recvmmsg), checks
// their MAC and sequence number, hands heartbeats and joins to the
// ControlHandler (the gRPC service's too: the checks, the acknowledgement
// rule and the decisions are its), and sends acknowledgements and round
// decisions back in batches (sendmmsg). What is this channel's own: sessions
// instead of streams, and resending a lost decision when its join comes again.
//
// Replies (acknowledgements, and the decisions the core's callbacks produce
// on whatever thread closed a round) are queued to sender threads, which
// encode, sign and send them in batches while the receiving thread goes on.
// A session always goes to the same sender, so its datagrams leave in
// sequence order; two senders put both cores to work on a round of 10,000.
//
// Thread-safety: Start/Stop from the owner; per-learner state is guarded by
// mu_, each sender's queue by its own mutex (taken after mu_, never before).
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "coordinator/control_handler.h"
#include "coordinator/lighthouse_core.h"
#include "core/mutex.h"
#include "wire/datagram.h"
#include "wire/receive_batch.h"

namespace mend::coordinator {

struct DatagramCounters {
  std::atomic<uint64_t> received{0};
  std::atomic<uint64_t> sent{0};
  std::atomic<uint64_t> dropped_malformed{0};
  std::atomic<uint64_t> dropped_bad_mac{0};
  std::atomic<uint64_t> dropped_replayed{0};
};

class DatagramServer {
 public:
  // Binds UDP on host:port and serves on a thread. `core` is not owned and
  // must outlive this server; `token` is the job token.
  [[nodiscard]] static StatusOr<std::unique_ptr<DatagramServer>> Start(const std::string& host,
                                                                       int port,
                                                                       LighthouseCore* core,
                                                                       const std::string& token);
  ~DatagramServer();

  DatagramServer(const DatagramServer&) = delete;
  DatagramServer& operator=(const DatagramServer&) = delete;

  int port() const { return port_; }
  const DatagramCounters& counters() const { return counters_; }
  // Stops the thread and closes the socket; idempotent.
  void Stop();

 private:
  using Address = datagram::SocketAddress;
  // What the channel knows of one session.
  struct Peer {
    std::string learner_id;
    Address address;
    uint64_t last_seq = 0;
    ControlHandler::AckState ack;
    uint64_t pending_join = 0;
    uint64_t decided_join = 0;
    StatusOr<RoundAssignment> decision = AbortedError("no decision");
  };
  // A datagram to send; decisions refer to the shared round, so queueing
  // 10,000 of them copies no member lists or strings.
  struct Outgoing {
    uint64_t session_id = 0;
    Address address;
    datagram::Kind kind = datagram::Kind::kAck;
    std::string ack;  // serialized v1::HeartbeatResponse
    uint64_t join_id = 0;
    StatusOr<RoundAssignment> decision = AbortedError("no decision");
  };

  DatagramServer(LighthouseCore* core, const std::string& token);
  void Run();
  void Handle(std::string_view bytes, const Address& from);
  void HandleHeartbeat(uint64_t session_id, const std::string& learner_id,
                       const v1::HeartbeatRequest& body, const Address& from);
  void HandleJoin(uint64_t session_id, const std::string& learner_id, v1::DatagramJoin& body,
                  const Address& from);
  // A malformed or refused datagram: counted, and in the core's rejections.
  void Refused(const Address& from, std::string_view why);
  void OnDecision(uint64_t session_id, uint64_t join_id, const Address& to,
                  StatusOr<RoundAssignment> result);
  // Records sent decisions so that a resent join gets them again.
  void RememberDecisions(const std::vector<Outgoing>& batch);
  struct Sender {
    Mutex mu;
    CondVar ready;
    std::vector<Outgoing> queue ABSL_GUARDED_BY(mu);
    bool stopping ABSL_GUARDED_BY(mu) = false;
    std::thread thread;
  };

  void Enqueue(Outgoing outgoing);
  void ForgetEndedSessions();
  void RunSender(Sender& sender);
  void Send(std::vector<Outgoing>& batch, datagram::Signer& signer);

  LighthouseCore* const core_;
  ControlHandler handler_;
  const datagram::Key key_;
  datagram::Signer signer_;  // used by the receiving thread only
  // The receiving thread's messages, parsed into again and again.
  v1::HeartbeatRequest heartbeat_in_;
  v1::DatagramJoin join_in_;
  int socket_ = -1;
  int wake_fd_ = -1;  // eventfd: Stop
  int port_ = 0;
  std::thread thread_;
  std::vector<std::unique_ptr<Sender>> senders_;
  std::atomic<bool> stopping_{false};
  // Datagrams queued to the senders and not yet sent. While a round's
  // decisions are going out the receiving thread leaves heartbeats in the
  // socket buffer (bounded by kMaxYieldToSenders), so that on a small
  // machine the decisions get the CPU first.
  Mutex backlog_mu_;  // for backlog_drained_
  CondVar backlog_drained_;
  std::atomic<size_t> backlog_{0};
  std::atomic<uint64_t> next_seq_{1};
  DatagramCounters counters_;

  Mutex mu_;
  // Flat (open addressing): looked up for every datagram. No reference to a
  // Peer is kept across an insertion.
  absl::flat_hash_map<uint64_t, Peer> peers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mend::coordinator
