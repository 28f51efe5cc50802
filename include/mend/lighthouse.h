// mend::LighthouseServer: the coordinator of a mend job, as a service that
// `mend lighthouse` runs and any process can embed. It serves the gRPC
// protocol of proto/mend/v1/lighthouse.proto (TLS when tls_cert_file and
// tls_key_file are set) and, when `http` is set, the status page,
// /status.json and /metrics.
//
// The lighthouse holds soft state only: if it restarts, learners register
// again on their own and rounds resume with ids above the ones they report.
//
// Thread-safety: Start, Shutdown and Wait may be called from any thread;
// Shutdown is idempotent and also runs on destruction.
#pragma once

#include <memory>
#include <string>

#include "mend/clock.h"
#include "mend/config.h"
#include "mend/status.h"

namespace mend {

class LighthouseServer {
 public:
  // Binds config.bind (port 0 picks a free port) and config.http, and starts
  // serving. `token` is the job token every call must carry. The lighthouse's
  // rules (heartbeat timeouts, quorum waits, fail-slow) run on `clock`, which
  // is not owned and must outlive the server.
  [[nodiscard]] static StatusOr<std::unique_ptr<LighthouseServer>> Start(const ValidConfig& config,
                                                                         const std::string& token,
                                                                         const Clock& clock);
  // The same for a configuration not checked yet: checked first.
  [[nodiscard]] static StatusOr<std::unique_ptr<LighthouseServer>> Start(const Config& config,
                                                                         const std::string& token,
                                                                         const Clock& clock);
  virtual ~LighthouseServer() = default;

  // The gRPC address with the port actually bound, e.g. "127.0.0.1:41234".
  virtual std::string grpc_address() const = 0;
  // The HTTP address with the port actually bound; empty when HTTP is off.
  virtual std::string http_address() const = 0;
  // The UDP port of the datagram control channel; 0 unless control_plane = "udp".
  virtual int udp_port() const = 0;
  // Stops accepting calls, fails the waiting ones with UNAVAILABLE, and joins
  // every thread. Returns within `grace_ms` plus a little.
  virtual void Shutdown(int grace_ms = 1000) = 0;
  // Blocks until Shutdown has been called.
  virtual void Wait() = 0;
  // The /status.json document.
  virtual std::string StatusJson() const = 0;
};

}  // namespace mend
