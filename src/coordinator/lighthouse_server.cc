// Assembles the lighthouse: core + gRPC service + HTTP side + timer thread.
#include <grpcpp/grpcpp.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "coordinator/datagram_server.h"
#include "coordinator/http_side.h"
#include "coordinator/lighthouse_core.h"
#include "coordinator/service.h"
#include "core/mutex.h"
#include "core/status_format.h"
#include "core/text.h"
#include "fmt/format.h"
#include "mend/lighthouse.h"
#include "spdlog/spdlog.h"
#include "store/deadline_timer.h"
#include "store/store_server.h"

namespace mend {
namespace {

// The coordinator's part of the configuration.
coordinator::LighthouseOptions LighthouseOptionsFrom(const Config& config) {
  coordinator::LighthouseOptions options;
  options.job_id = config.job_id;
  options.quorum.job_id = config.job_id;
  options.quorum.min_learners = static_cast<size_t>(config.quorum_min_learners);
  options.quorum.grace_window = config.grace_window_ms * kMicrosPerMilli;
  options.quorum.grace_window_min = config.grace_window_min_ms * kMicrosPerMilli;
  options.quorum.adaptive = config.grace_window_adaptive;
  options.quorum.rack_aware = config.rack_aware;
  options.failslow.zscore_threshold = config.failslow_zscore_threshold;
  options.failslow.window_steps = static_cast<size_t>(config.failslow_window_steps);
  options.failslow.min_samples =
      std::max<size_t>(2, static_cast<size_t>(config.failslow_window_steps) / 2);
  options.heartbeat_interval = config.heartbeat_ms * kMicrosPerMilli;
  options.heartbeat_timeout = config.heartbeat_timeout_ms * kMicrosPerMilli;
  options.ack_interval =
      std::max<Micros>(options.heartbeat_interval, options.heartbeat_timeout / 4);
  return options;
}

using coordinator::LighthouseCore;

StatusOr<std::string> ReadPem(const std::string& path, std::string_view key) {
  std::ifstream in(path);
  if (!in) {
    return InvalidArgumentError(
        fmt::format("{} = \"{}\": cannot be read: {}", key, path, std::strerror(errno)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The certificate and key checked with OpenSSL before gRPC gets them: gRPC
// only fails to listen, which reads like a port in use.
Status CheckCertificateAndKey(const Config& config, const std::string& cert,
                              const std::string& key) {
  auto bio = [](const std::string& text) {
    return std::unique_ptr<BIO, decltype(&BIO_free)>(
        BIO_new_mem_buf(text.data(), static_cast<int>(text.size())), &BIO_free);
  };
  auto cert_bio = bio(cert);
  std::unique_ptr<X509, decltype(&X509_free)> x509(
      PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr), &X509_free);
  if (!x509) {
    ERR_clear_error();
    return InvalidArgumentError(
        fmt::format("tls_cert_file = \"{}\": no PEM certificate in it", config.tls_cert_file));
  }
  auto key_bio = bio(key);
  // No passphrase callback: an encrypted key fails here rather than prompting.
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> pkey(
      PEM_read_bio_PrivateKey(
          key_bio.get(), nullptr, [](char*, int, int, void*) { return 0; }, nullptr),
      &EVP_PKEY_free);
  ERR_clear_error();
  if (!pkey) {
    return InvalidArgumentError(fmt::format(
        "tls_key_file = \"{}\": no unencrypted PEM private key in it", config.tls_key_file));
  }
  if (X509_check_private_key(x509.get(), pkey.get()) != 1) {
    ERR_clear_error();
    return InvalidArgumentError(
        fmt::format("tls_key_file = \"{}\" is not the private key of tls_cert_file = \"{}\"",
                    config.tls_key_file, config.tls_cert_file));
  }
  return OkStatus();
}

StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const Config& config) {
  if (config.tls_cert_file.empty()) return grpc::InsecureServerCredentials();
  MEND_ASSIGN_OR_RETURN(std::string cert, ReadPem(config.tls_cert_file, "tls_cert_file"));
  MEND_ASSIGN_OR_RETURN(std::string key, ReadPem(config.tls_key_file, "tls_key_file"));
  MEND_RETURN_IF_ERROR(CheckCertificateAndKey(config, cert, key));
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({key, cert});
  return grpc::SslServerCredentials(options);
}

class LighthouseServerImpl final : public LighthouseServer {
 public:
  LighthouseServerImpl(const Config& config, const std::string& token, const Clock& clock)
      : token_(token),
        clock_(clock),
        core_(LighthouseOptionsFrom(config), &clock,
              std::random_device{}() ^ (uint64_t{std::random_device{}()} << 32)),
        service_(&core_, token, core_.options().store.max_value_bytes) {}

  ~LighthouseServerImpl() override { Shutdown(0); }

  Status Init(const Config& config) {
    MEND_ASSIGN_OR_RETURN(auto credentials, ServerCredentials(config));
    // The timer first: a call may come as soon as the server listens.
    timer_ = std::make_unique<store::DeadlineTimer>(
        clock_, [this]() { core_.Tick(); }, [this]() { return core_.NextDeadline(); },
        store::kMaxTimerSleep);
    core_.SetWakeup([timer = timer_.get()]() { timer->Wake(); });
    auto [host, requested] = SplitHostPort(config.bind);
    int port = 0;
    MEND_ASSIGN_OR_RETURN(
        server_, store::StartGrpcServer("bind", config.bind, credentials, &service_, &port));
    grpc_address_ = JoinHostPort(host, port);
    if (config.control_plane == ControlPlane::kUdp) {
      // The datagram channel takes the gRPC port's number (TCP and UDP ports
      // are separate), so it is found again at the same place after a restart.
      auto datagrams = coordinator::DatagramServer::Start(host, port, &core_, token_);
      if (!datagrams.ok()) {
        return Status(datagrams.status().code(),
                      fmt::format("{} (control_plane = \"grpc\" runs without the datagram channel)",
                                  datagrams.status().message()));
      }
      datagrams_ = std::move(*datagrams);
      service_.set_udp_port(datagrams_->port());
    }
    if (!config.http.empty()) {
      MEND_ASSIGN_OR_RETURN(http_, coordinator::StatusHttpServer::Start(config.http, &core_));
    }
    service_.set_ready();
    spdlog::info("lighthouse for job '{}' serving gRPC on {}{}{}{}", config.job_id, grpc_address_,
                 config.tls_cert_file.empty() ? "" : " (TLS)",
                 datagrams_ ? fmt::format(", datagrams on udp port {}", datagrams_->port()) : "",
                 http_ ? fmt::format(", status page on http://{}/", http_->address()) : "");
    return OkStatus();
  }

  std::string grpc_address() const override { return grpc_address_; }
  std::string http_address() const override { return http_ ? http_->address() : ""; }
  int udp_port() const override { return datagrams_ ? datagrams_->port() : 0; }

  void Shutdown(int grace_ms) override {
    {
      MutexLock lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    if (timer_) timer_->Stop();
    if (http_) http_->Stop();
    if (datagrams_) datagrams_->Stop();
    if (server_) {
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(grace_ms));
    }
    MutexLock lock(mu_);
    stopped_ = true;
    stopped_cv_.NotifyAll();
  }

  void Wait() override {
    MutexLock lock(mu_);
    while (!stopped_) stopped_cv_.Wait(mu_);
  }

  std::string StatusJson() const override {
    return coordinator::StatusJson(const_cast<LighthouseCore&>(core_).Snapshot(200, 50));
  }

 private:
  const std::string token_;
  const Clock& clock_;
  LighthouseCore core_;
  coordinator::LighthouseService service_;
  std::unique_ptr<coordinator::DatagramServer> datagrams_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<coordinator::StatusHttpServer> http_;
  std::string grpc_address_;
  std::unique_ptr<store::DeadlineTimer> timer_;

  Mutex mu_;
  CondVar stopped_cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

StatusOr<std::unique_ptr<LighthouseServer>> LighthouseServer::Start(const Config& config,
                                                                    const std::string& token,
                                                                    const Clock& clock) {
  MEND_ASSIGN_OR_RETURN(ValidConfig valid, ValidConfig::Check(config));
  return Start(valid, token, clock);
}

StatusOr<std::unique_ptr<LighthouseServer>> LighthouseServer::Start(const ValidConfig& config,
                                                                    const std::string& token,
                                                                    const Clock& clock) {
  auto server = std::make_unique<LighthouseServerImpl>(config, token, clock);
  MEND_RETURN_IF_ERROR(server->Init(config));
  return std::unique_ptr<LighthouseServer>(std::move(server));
}

}  // namespace mend
