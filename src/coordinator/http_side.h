// The lighthouse's HTTP side (cpp-httplib): the status page a person reads
// (GET /), the same data for scripts (GET /status.json?learners=N&rounds=N),
// Prometheus metrics (GET /metrics) and a liveness probe (GET /healthz).
// Read-only; bind it to a private address.
//
// Thread-safety: Start/Stop from one owner thread; requests are served on
// cpp-httplib's pool and read the core through its thread-safe Snapshot.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "coordinator/lighthouse_core.h"
#include "mend/status.h"

namespace httplib {
class Server;
}

namespace mend::coordinator {

extern const char kStatusPageHtml[];

class StatusHttpServer {
 public:
  // Binds `address` (HOST:PORT, port 0 picks one) and serves on a background
  // thread. `core` is not owned and must outlive this server.
  [[nodiscard]] static StatusOr<std::unique_ptr<StatusHttpServer>> Start(const std::string& address,
                                                                         LighthouseCore* core);
  ~StatusHttpServer();

  StatusHttpServer(const StatusHttpServer&) = delete;
  StatusHttpServer& operator=(const StatusHttpServer&) = delete;

  // HOST:PORT with the port actually bound.
  const std::string& address() const { return address_; }
  // Stops serving and joins the thread; idempotent.
  void Stop();

 private:
  StatusHttpServer() = default;

  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::atomic<bool> finished_{false};
  std::string address_;
};

}  // namespace mend::coordinator
