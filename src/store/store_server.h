// A store-only gRPC server: a StoreCore answered by StoreService (the
// store's calls of the v1.Lighthouse service, so that a LighthouseClient
// talks to it as to a lighthouse's store), with the job token, in plaintext,
// and a DeadlineTimer that expires its waits. A learner group's rank 0 serves
// the group's own store with it (group_store.h); it is not a lighthouse.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <string_view>

#include "mend/clock.h"
#include "mend/status.h"
#include "store/kv_store.h"

namespace mend::store {

// What the lighthouse's server and a store server both ask of gRPC: at most
// 8 MiB a message, no SO_REUSEPORT (a second server on the port must fail to
// bind, not take half of the calls), keepalive pings from clients allowed.
// UNAVAILABLE naming the config key and `address` when it cannot be bound;
// `port` gets the port bound.
StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(
    std::string_view key, const std::string& address,
    const std::shared_ptr<grpc::ServerCredentials>& credentials, grpc::Service* service, int* port);

// The timer threads' longest sleep with nothing scheduled.
inline constexpr Micros kMaxTimerSleep = 200 * kMicrosPerMilli;

class StoreServer {
 public:
  // Serves at `address` (HOST:PORT; port 0 picks a free one), on `clock`
  // (not owned; it must outlive the server).
  [[nodiscard]] static StatusOr<std::unique_ptr<StoreServer>> Start(const std::string& address,
                                                                    const std::string& token,
                                                                    KvStoreLimits limits,
                                                                    const Clock& clock);
  virtual ~StoreServer() = default;
  // HOST:PORT with the port actually bound.
  virtual const std::string& address() const = 0;
};

}  // namespace mend::store
