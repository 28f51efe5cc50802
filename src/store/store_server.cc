#include "store/store_server.h"

#include <chrono>

#include "core/text.h"
#include "fmt/format.h"
#include "store/deadline_timer.h"
#include "store/store_core.h"
#include "store/store_service.h"

namespace mend::store {
namespace {

constexpr int kMaxMessageBytes = 8 << 20;

// The store's calls, and the lighthouse's unary calls answered UNIMPLEMENTED
// with what this server is (through the same reactors as the store's calls).
class StoreOnlyService final : public StoreService {
 public:
  using StoreService::StoreService;

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const v1::RegisterRequest*, v1::RegisterResponse*) override {
    return NotALighthouse(context, "Register");
  }
  grpc::ServerUnaryReactor* Quorum(grpc::CallbackServerContext* context, const v1::QuorumRequest*,
                                   v1::QuorumResponse*) override {
    return NotALighthouse(context, "Quorum");
  }
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* context, const v1::LeaveRequest*,
                                  v1::LeaveResponse*) override {
    return NotALighthouse(context, "Leave");
  }
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const v1::GetStatusRequest*,
                                      v1::GetStatusResponse*) override {
    return NotALighthouse(context, "GetStatus");
  }

 private:
  static grpc::ServerUnaryReactor* NotALighthouse(grpc::CallbackServerContext* context,
                                                  std::string_view call) {
    return Answer(context, [call]() {
      return ToGrpcStatus(absl::UnimplementedError(
          fmt::format("{}: this is a learner group's store, which serves the store's calls "
                      "only; the lighthouse is elsewhere (config key lighthouse)",
                      call)));
    });
  }
};

class StoreServerImpl final : public StoreServer {
 public:
  StoreServerImpl(const std::string& token, KvStoreLimits limits, const Clock& clock)
      : store_(limits, &clock),
        service_(&store_, token, limits.max_value_bytes),
        timer_(
            clock, [this]() { store_.Tick(); }, [this]() { return store_.NextDeadline(); },
            kMaxTimerSleep) {
    store_.SetWakeup([this]() { timer_.Wake(); });
  }

  ~StoreServerImpl() override {
    timer_.Stop();
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
  }

  Status Init(const std::string& address) {
    int port = 0;
    MEND_ASSIGN_OR_RETURN(server_,
                          StartGrpcServer("group_store", address, grpc::InsecureServerCredentials(),
                                          &service_, &port));
    address_ = JoinHostPort(SplitHostPort(address).first, port);
    return OkStatus();
  }

  const std::string& address() const override { return address_; }

 private:
  StoreCore store_;
  StoreOnlyService service_;
  DeadlineTimer timer_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

}  // namespace

StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(
    std::string_view key, const std::string& address,
    const std::shared_ptr<grpc::ServerCredentials>& credentials, grpc::Service* service,
    int* port) {
  grpc::ServerBuilder builder;
  *port = 0;
  builder.AddListeningPort(address, credentials, port);
  builder.RegisterService(service);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || *port == 0) {
    return UnavailableError(fmt::format(
        "{} = \"{}\": cannot listen for gRPC (address in use or not local?)", key, address));
  }
  return server;
}

StatusOr<std::unique_ptr<StoreServer>> StoreServer::Start(const std::string& address,
                                                          const std::string& token,
                                                          KvStoreLimits limits,
                                                          const Clock& clock) {
  auto server = std::make_unique<StoreServerImpl>(token, limits, clock);
  MEND_RETURN_IF_ERROR(server->Init(address));
  return std::unique_ptr<StoreServer>(std::move(server));
}

}  // namespace mend::store
