#include "coordinator/http_side.h"

#include <chrono>

#include "coordinator/status_snapshot.h"
#include "core/status_format.h"
#include "core/text.h"
#include "fmt/format.h"
#include "httplib.h"

namespace mend::coordinator {
namespace {

constexpr size_t kDefaultLearners = 200;
constexpr size_t kDefaultRounds = 50;
constexpr size_t kMaxItems = 100000;

size_t QueryCount(const httplib::Request& request, const char* name, size_t fallback) {
  if (!request.has_param(name)) return fallback;
  auto value = ParseInt64(request.get_param_value(name));
  if (!value || *value < 0) return fallback;
  return std::min<size_t>(static_cast<size_t>(*value), kMaxItems);
}

}  // namespace

StatusOr<std::unique_ptr<StatusHttpServer>> StatusHttpServer::Start(const std::string& address,
                                                                    LighthouseCore* core) {
  MEND_RETURN_IF_ERROR(CheckHostPort(address, "http"));
  auto [host, port] = SplitHostPort(address);
  std::unique_ptr<StatusHttpServer> http(new StatusHttpServer());
  http->server_ = std::make_unique<httplib::Server>();
  httplib::Server& server = *http->server_;
  // SO_REUSEADDR only: with httplib's default SO_REUSEPORT a second lighthouse
  // could bind the same port and silently take half of the requests.
  server.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  server.set_read_timeout(5, 0);
  server.set_write_timeout(5, 0);
  server.set_keep_alive_max_count(100);
  server.Get("/", [](const httplib::Request&, httplib::Response& response) {
    response.set_content(kStatusPageHtml, "text/html; charset=utf-8");
  });
  server.Get("/status.json", [core](const httplib::Request& request, httplib::Response& response) {
    StatusSnapshot snapshot = core->Snapshot(QueryCount(request, "learners", kDefaultLearners),
                                             QueryCount(request, "rounds", kDefaultRounds));
    response.set_header("Cache-Control", "no-store");
    response.set_content(StatusJson(snapshot), "application/json");
  });
  server.Get("/metrics", [core](const httplib::Request&, httplib::Response& response) {
    response.set_content(PrometheusText(core->Snapshot(0, 0)),
                         "text/plain; version=0.0.4; charset=utf-8");
  });
  server.Get("/healthz", [](const httplib::Request&, httplib::Response& response) {
    response.set_content("ok\n", "text/plain");
  });
  int bound =
      port == 0 ? server.bind_to_any_port(host) : (server.bind_to_port(host, port) ? port : -1);
  if (bound <= 0) {
    return UnavailableError(
        fmt::format("http = \"{}\": cannot bind (address in use or not local?)", address));
  }
  http->address_ = JoinHostPort(host, bound);
  http->thread_ = std::thread([&server, finished = &http->finished_]() {
    server.listen_after_bind();
    finished->store(true);
  });
  return http;
}

StatusHttpServer::~StatusHttpServer() { Stop(); }

void StatusHttpServer::Stop() {
  if (!thread_.joinable()) return;
  // httplib's stop() does nothing until the accept loop has started, so keep
  // asking until the loop has returned.
  while (!finished_.load()) {
    server_->stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  thread_.join();
}

}  // namespace mend::coordinator
