// The lighthouse's gRPC service: a thin shell over LighthouseCore. Each call
// is authenticated (job token, constant-time comparison), then checked and
// handed to the core by ControlHandler (the datagram server's handler too),
// and answered. Waiting calls (Quorum, StoreGet, StoreWait) keep
// their reactor and finish later from the core's callback; they never block a
// gRPC thread. A cancelled call withdraws its wait from the core. The store's
// calls are store::StoreService's (over the core's store), which this derives
// from.
//
// Thread-safety: gRPC calls the handlers from its own threads; all shared
// state lives in LighthouseCore.
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "coordinator/control_handler.h"
#include "coordinator/lighthouse_core.h"
#include "mend/v1/lighthouse.grpc.pb.h"
#include "store/store_service.h"

namespace mend::coordinator {

using store::ToGrpcStatus;

class LighthouseService final : public store::StoreService {
 public:
  // `core` is not owned and must outlive the service and its server.
  LighthouseService(LighthouseCore* core, const std::string& token, size_t max_value_bytes);

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const v1::RegisterRequest* request,
                                     v1::RegisterResponse* response) override;
  grpc::ServerBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse>* Heartbeat(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* Quorum(grpc::CallbackServerContext* context,
                                   const v1::QuorumRequest* request,
                                   v1::QuorumResponse* response) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* context,
                                  const v1::LeaveRequest* request,
                                  v1::LeaveResponse* response) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const v1::GetStatusRequest* request,
                                      v1::GetStatusResponse* response) override;

  LighthouseCore* core() { return core_; }
  ControlHandler& handler() { return handler_; }
  // The datagram channel's UDP port that Register tells learners (0: none).
  void set_udp_port(int port) { udp_port_ = port; }
  // Until called, Register answers UNAVAILABLE (the server is still starting).
  void set_ready() { ready_ = true; }
  // Authenticated heartbeat streams; the first time their number passes
  // kGrpcLearnersHeld the lighthouse warns (once) that large jobs belong on
  // the UDP control channel.
  void HeartbeatStreamOpened();
  void HeartbeatStreamClosed();

 protected:
  // In the core's events and counters.
  void Rejected(std::string_view code, std::string_view peer, std::string_view why) override;

 private:
  LighthouseCore* const core_;
  ControlHandler handler_;
  std::atomic<int> udp_port_{0};
  std::atomic<bool> ready_{false};
  std::atomic<size_t> heartbeat_streams_{0};
  std::atomic<bool> warned_{false};
  // This host's interfaces' addresses: a registration from one of them is
  // from the lighthouse's own host (PeerHost).
  const std::vector<std::string> local_hosts_;
};

// The most learners the gRPC control path serves with round decisions under
// 50 ms at p99 on a 2-core lighthouse, heartbeating every 100 ms: 1,000
// (36 ms; 1,500 gave 52 ms, 2,000 64 ms, 4,000 279 ms, and at 10,000 streams
// time out; docs/benchmarks.md, "Lighthouse under load").
inline constexpr size_t kGrpcLearnersHeld = 1000;

}  // namespace mend::coordinator
