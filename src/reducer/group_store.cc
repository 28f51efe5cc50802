#include "mend/group_store.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <thread>
#include <utility>

#include "core/mutex.h"
#include "core/status_format.h"
#include "core/text.h"
#include "fmt/format.h"
#include "learner/group_ranks.h"
#include "learner/lighthouse_rendezvous.h"
#include "mend/lighthouse_client.h"
#include "spdlog/spdlog.h"
#include "store/store_server.h"

namespace mend {
namespace {

// First wait between tries while the store is not up yet, and the longest.
constexpr Micros kFirstRetry = 10 * kMicrosPerMilli;
constexpr Micros kMaxRetry = 500 * kMicrosPerMilli;

class GroupStoreServerImpl final : public GroupStoreServer {
 public:
  explicit GroupStoreServerImpl(std::unique_ptr<store::StoreServer> server)
      : server_(std::move(server)) {}
  ~GroupStoreServerImpl() override;
  const std::string& address() const override { return server_->address(); }

 private:
  const std::unique_ptr<store::StoreServer> server_;
};

// The servers of this process, by the address they bound.
struct ServerRegistry {
  Mutex mutex;
  std::map<std::string, std::weak_ptr<GroupStoreServer>> servers ABSL_GUARDED_BY(mutex);
};
ServerRegistry& Registry() {
  static auto* registry = new ServerRegistry();
  return *registry;
}

GroupStoreServerImpl::~GroupStoreServerImpl() {
  ServerRegistry& registry = Registry();
  MutexLock lock(registry.mutex);
  for (auto it = registry.servers.begin(); it != registry.servers.end();) {
    it = it->second.expired() ? registry.servers.erase(it) : std::next(it);
  }
}

std::shared_ptr<GroupStoreServer> Served(const std::string& address) {
  ServerRegistry& registry = Registry();
  MutexLock lock(registry.mutex);
  auto it = registry.servers.find(address);
  return it == registry.servers.end() ? nullptr : it->second.lock();
}

// A connection to the group's store: a lighthouse client of its own.
class ClientGroupStore final : public RendezvousStore {
 public:
  ClientGroupStore(std::unique_ptr<LighthouseClient> client, const Clock& clock,
                   std::shared_ptr<GroupStoreServer> server)
      : client_(std::move(client)), store_(*client_, clock), server_(std::move(server)) {}
  Status Set(const std::string& key, const std::string& value) override {
    return store_.Set(key, value);
  }
  StatusOr<std::string> Get(const std::string& key, Micros timeout) override {
    return store_.Get(key, timeout);
  }
  Status Delete(const std::string& key, bool prefix) override { return store_.Delete(key, prefix); }

 private:
  const std::unique_ptr<LighthouseClient> client_;
  LighthouseRendezvousStore store_;                 // over client_
  const std::shared_ptr<GroupStoreServer> server_;  // rank 0's, when it serves the store
};

// Connects, and waits (up to `timeout`) until the store answers: the other
// ranks may start before rank 0 serves it. Each try is a new connection: a
// channel whose first attempts were refused keeps failing its handshakes
// for seconds after the server came up (measured: about 5 s), where a new
// one connects at once.
// `gave_up` (optional) is asked between the tries: an error from it (rank
// 0 told that it could not start) ends the wait.
StatusOr<std::unique_ptr<LighthouseClient>> ConnectWhenUp(
    const std::string& address, const std::string& token, Micros rpc_timeout, Micros timeout,
    const Clock& clock, const std::function<Status()>& gave_up = nullptr) {
  const Micros deadline = clock.NowMicros() + timeout;
  Micros pause = kFirstRetry;
  while (true) {
    MEND_ASSIGN_OR_RETURN(std::unique_ptr<LighthouseClient> client,
                          LighthouseClient::Connect({address, token, "", rpc_timeout}));
    StatusOr<uint64_t> probe = client->StoreDelete("mend/group-store-probe", false);
    if (probe.ok()) return client;
    const Micros left = deadline - clock.NowMicros();
    spdlog::debug("group store {}: not up yet ({})", address, probe.status());
    if (!StoreNotUpOrGone(probe.status()) || left <= 0) {
      return Annotate(probe.status(),
                      fmt::format("group store {}: not reachable within quorum_timeout_ms = {}",
                                  address, timeout / kMicrosPerMilli));
    }
    if (gave_up) MEND_RETURN_IF_ERROR(gave_up());
    std::this_thread::sleep_for(std::chrono::microseconds(std::min(pause, left)));
    pause = std::min(pause * 2, kMaxRetry);
  }
}

}  // namespace

StatusOr<std::shared_ptr<GroupStoreServer>> GroupStoreServer::Serve(const std::string& token,
                                                                    const std::string& address,
                                                                    const Clock& clock) {
  MEND_RETURN_IF_ERROR(CheckHostPort(address, "group_store"));
  // The store alone (plaintext: it is reached inside the rack), with the
  // lighthouse's limits.
  StatusOr<std::unique_ptr<store::StoreServer>> server =
      store::StoreServer::Start(address, token, store::KvStoreLimits{}, clock);
  if (!server.ok()) return server.status();
  auto store = std::make_shared<GroupStoreServerImpl>(std::move(*server));
  const std::string bound = store->address();
  {
    ServerRegistry& registry = Registry();
    MutexLock lock(registry.mutex);
    registry.servers[bound] = store;
  }
  spdlog::info("this group rank serves the group's store on {}", bound);
  return std::shared_ptr<GroupStoreServer>(std::move(store));
}

StatusOr<GroupStoreOpener> GroupStoreOpenerFor(const AgentOptions& options,
                                               const std::string& token, const Clock& clock,
                                               const std::string& learner_id) {
  if (options.group_store.empty()) return GroupStoreOpener();
  MEND_RETURN_IF_ERROR(CheckHostPort(options.group_store, "group_store"));
  std::shared_ptr<GroupStoreServer> server;
  std::string address = options.group_store;
  if (options.group_rank == 0) {
    server = Served(options.group_store);
    if (!server) {
      MEND_ASSIGN_OR_RETURN(server, GroupStoreServer::Serve(token, options.group_store, clock));
    }
    address = server->address();
  }
  const Micros rpc_timeout = options.rpc_timeout_ms * kMicrosPerMilli;
  const Micros timeout = options.quorum_timeout_ms * kMicrosPerMilli;
  // A rank other than 0 waits for rank 0's store; rank 0 may have told the
  // lighthouse meanwhile that it could not start.
  std::function<Status()> gave_up;
  if (options.group_rank != 0 && !learner_id.empty() && !options.lighthouse.empty()) {
    // (A connection of its own each time: the opener may be called from
    // several threads at once, and this runs only while rank 0's store is
    // not up.)
    gave_up = [options, token, learner_id, &clock, since = UnixMillis()]() -> Status {
      StatusOr<std::unique_ptr<LighthouseClient>> told =
          LighthouseClient::Connect(LighthouseClientOptionsFor(options, token));
      if (!told.ok()) return OkStatus();
      LighthouseRendezvousStore store(**told, clock);
      std::optional<Status> failed = CouldNotStartAsTold(store, options, learner_id, 0, since);
      return failed ? *failed : OkStatus();
    };
  }
  return GroupStoreOpener([address, token, rpc_timeout, timeout, &clock, server,
                           gave_up]() -> StatusOr<std::unique_ptr<RendezvousStore>> {
    MEND_ASSIGN_OR_RETURN(std::unique_ptr<LighthouseClient> client,
                          ConnectWhenUp(address, token, rpc_timeout, timeout, clock, gave_up));
    return std::unique_ptr<RendezvousStore>(
        std::make_unique<ClientGroupStore>(std::move(client), clock, server));
  });
}

}  // namespace mend
