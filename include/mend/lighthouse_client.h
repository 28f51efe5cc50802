// The C++ client of the lighthouse protocol.
//
// LighthouseClient: one call per method, each with a deadline; errors come
// back as Status with the server's code (UNAVAILABLE when the lighthouse
// cannot be reached, DEADLINE_EXCEEDED when the deadline passed).
// HeartbeatStream: a learner's long-lived heartbeat stream.
// LearnerAgent (learner_agent.h) builds a learner's whole life on these.
//
// Thread-safety: LighthouseClient is thread-safe (gRPC channels and stubs
// are). A HeartbeatStream may be used from any thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mend/clock.h"
#include "mend/status.h"
#include "mend/v1/lighthouse.pb.h"

namespace mend {

struct LighthouseClientOptions {
  std::string address;  // HOST:PORT
  std::string token;    // the job token
  // PEM roots that sign the lighthouse's certificate; empty for plaintext.
  std::string tls_ca_file;
  // Deadline of every call that does not carry its own timeout.
  Micros rpc_timeout = 5 * kMicrosPerSecond;
};

struct LearnerIdentity {
  std::string id;
  std::string job_id;
  std::string rack;
  std::string address;      // data-plane address peers heal from, HOST:PORT (optional)
  uint32_t group_size = 1;  // ranks in this learner; the same for every learner of a job
  // Every rank's data-plane host, by group rank (empty, or group_size of
  // them); shown on the lighthouse's status page.
  std::vector<std::string> rank_addresses = {};
  // SharedSettings(config): the lighthouse refuses a learner whose settings
  // differ from the job's alive learners' (empty: not checked).
  std::vector<std::string> job_settings = {};
};

struct Registration {
  uint64_t session_id = 0;
  uint64_t lighthouse_instance = 0;
  Micros heartbeat_interval = 0;
  Micros heartbeat_timeout = 0;
  Micros ack_interval = 0;
  int udp_port = 0;  // datagram control channel; 0 when not served
};

struct LearnerRef {
  std::string learner_id;
  uint64_t session_id = 0;
};

// A round's member, and one member's view of a closed round: the
// protocol's own messages (proto/mend/v1/lighthouse.proto), read as the
// lighthouse wrote them, with nothing between (a field added to a decision
// is written by the lighthouse's handler and read where it is used).
// QuorumResult's heal_from is set when this learner is behind; its members,
// all of them sorted, when asked for (rounds of at most 1024 members).
using RoundMember = v1::Member;
using RoundMembers = google::protobuf::RepeatedPtrField<RoundMember>;
using QuorumResult = v1::QuorumResponse;

// A join and a heartbeat are the protocol's requests too
// (v1::QuorumRequest, v1::HeartbeatRequest), built by the learner agent. A
// join's `learner` says who (a datagram's session says it instead); a
// heartbeat's is set by its stream. A join waits timeout_ms, which the
// lighthouse bounds to [1 ms, 1 h]: JoinTimeout/SetJoinTimeout.
inline constexpr Micros kMaxJoinTimeout = 3'600'000 * kMicrosPerMilli;
inline void SetJoinTimeout(v1::QuorumRequest& request, Micros timeout) {
  request.set_timeout_ms(static_cast<uint32_t>(
      std::clamp<Micros>(timeout, kMicrosPerMilli, kMaxJoinTimeout) / kMicrosPerMilli));
}
inline Micros JoinTimeout(const v1::QuorumRequest& request) {
  return static_cast<Micros>(request.timeout_ms()) * kMicrosPerMilli;
}

// The heartbeat stream's acknowledgement, as the lighthouse sent it.
using HeartbeatAck = v1::HeartbeatResponse;

// A learner's heartbeat stream (gRPC bidirectional stream, callback API).
class HeartbeatStream {
 public:
  virtual ~HeartbeatStream() = default;
  // Sends `update` now, or, while a send is in flight, queues it in place of
  // any older queued update. Never blocks.
  virtual void Send(v1::HeartbeatRequest update) = 0;
  // True once the stream has ended; then status() tells why.
  virtual bool done() const = 0;
  virtual Status status() const = 0;
  // When the last acknowledgement arrived (or the stream opened).
  virtual Micros last_ack_at() const = 0;
  // Ends the stream (e.g. the lighthouse stopped acknowledging).
  virtual void Cancel() = 0;
};

// Ends a blocking call early from another thread: Cancel() makes the call
// made with it return CANCELLED at once, or at its start if it has not
// started yet. One per call (a cancelled one stays cancelled).
//
// Thread-safety: Cancel from any thread, while the call runs on another.
class CallCanceller {
 public:
  CallCanceller();
  ~CallCanceller();
  CallCanceller(const CallCanceller&) = delete;
  CallCanceller& operator=(const CallCanceller&) = delete;

  void Cancel();

  // For a LighthouseClient's implementation: from now until Release(),
  // Cancel() runs `cancel` (which ends the call in progress). False, and
  // nothing held, when it is already cancelled.
  [[nodiscard]] bool Hold(std::function<void()> cancel);
  void Release();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

class LighthouseClient {
 public:
  [[nodiscard]] static StatusOr<std::unique_ptr<LighthouseClient>> Connect(
      const LighthouseClientOptions& options);
  virtual ~LighthouseClient() = default;

  [[nodiscard]] virtual StatusOr<Registration> Register(const LearnerIdentity& identity,
                                                        uint64_t step, uint64_t last_round_id) = 0;
  [[nodiscard]] virtual Status Leave(const LearnerRef& learner, const std::string& reason) = 0;
  // Blocks until this learner is a member of a closed round or the join's
  // timeout.
  [[nodiscard]] virtual StatusOr<QuorumResult> Quorum(const v1::QuorumRequest& request) = 0;
  // As Quorum, but `done` runs on a gRPC thread when the call completes;
  // `cancel` ends it early with CANCELLED (`done` still runs, once the call
  // is over: nothing is left in flight). `cancel` holds the call's context
  // until it is cancelled or destroyed.
  virtual void QuorumAsync(const v1::QuorumRequest& request, CallCanceller& cancel,
                           std::function<void(StatusOr<QuorumResult>)> done) = 0;

  [[nodiscard]] virtual Status StoreSet(const std::string& key, const std::string& value) = 0;
  // Waits up to `timeout` for the key; NOT_FOUND at once when timeout is 0.
  [[nodiscard]] virtual StatusOr<std::string> StoreGet(const std::string& key, Micros timeout) = 0;
  // As StoreGet, but `cancel` can end the wait early from another thread
  // (CANCELLED): a long poll that its owner stops when it no longer cares.
  [[nodiscard]] virtual StatusOr<std::string> StoreGetCancellable(const std::string& key,
                                                                  Micros timeout,
                                                                  CallCanceller& cancel) = 0;
  [[nodiscard]] virtual StatusOr<int64_t> StoreAdd(const std::string& key, int64_t delta) = 0;
  [[nodiscard]] virtual Status StoreWait(const std::vector<std::string>& keys, Micros timeout) = 0;
  [[nodiscard]] virtual StatusOr<uint64_t> StoreDelete(const std::string& key, bool prefix) = 0;

  // The lighthouse's /status.json document.
  [[nodiscard]] virtual StatusOr<std::string> StatusJson(uint32_t max_learners = 0,
                                                         uint32_t max_rounds = 0) = 0;

  // Opens the heartbeat stream of `learner`. `on_ack` runs on a gRPC thread
  // for each acknowledgement. The stream's last_ack_at() is on `clock`
  // (the caller's, which compares it with its own now; not owned, it must
  // outlive the stream).
  virtual std::unique_ptr<HeartbeatStream> OpenHeartbeat(
      const LearnerRef& learner, const Clock& clock,
      std::function<void(const HeartbeatAck&)> on_ack) = 0;
};

}  // namespace mend
