#include "mend/group_store.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <thread>

#include "core/text.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace mend {
namespace {

// How often a Get looks whether its key has come. torch 1.13's TCPStore
// cannot wait with a timeout shorter than the whole wait: a wait that times
// out leaves its answer on the connection, where the next call reads it.
constexpr Micros kPoll = 10 * kMicrosPerMilli;

class TcpGroupStore final : public RendezvousStore {
 public:
  TcpGroupStore(std::string address, c10::intrusive_ptr<c10d::TCPStore> store,
                c10::intrusive_ptr<c10d::TCPStore> server)
      : address_(std::move(address)), store_(std::move(store)), server_(std::move(server)) {}

  Status Set(const std::string& key, const std::string& value) override {
    try {
      store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
      return OkStatus();
    } catch (const std::exception& error) {
      return Failed("set", key, error);
    }
  }

  StatusOr<std::string> Get(const std::string& key, Micros timeout) override {
    const Micros deadline = RealClock()->NowMicros() + timeout;
    try {
      while (!store_->check({key})) {
        const Micros left = deadline - RealClock()->NowMicros();
        if (left <= 0) {
          return DeadlineExceededError(
              fmt::format("group store {}: '{}' did not come within {} ms", address_, key, timeout / kMicrosPerMilli));
        }
        std::this_thread::sleep_for(std::chrono::microseconds(std::min(left, kPoll)));
      }
      const std::vector<uint8_t> value = store_->get(key);
      return std::string(value.begin(), value.end());
    } catch (const std::exception& error) {
      return Failed("get", key, error);
    }
  }

  Status Delete(const std::string& key, bool prefix) override {
    if (prefix) return OkStatus();  // the group's store ends with the group
    try {
      store_->deleteKey(key);
      return OkStatus();
    } catch (const std::exception& error) {
      return Failed("delete", key, error);
    }
  }

 private:
  Status Failed(std::string_view what, const std::string& key, const std::exception& error) const {
    return UnavailableError(fmt::format("group store {}: {} '{}': {}", address_, what, key, error.what()));
  }

  const std::string address_;
  const c10::intrusive_ptr<c10d::TCPStore> store_;
  const c10::intrusive_ptr<c10d::TCPStore> server_;  // rank 0's, when it serves the store
};

}  // namespace

StatusOr<GroupStoreOpener> GroupStoreFromConfig(const Config& config) {
  if (config.group_store.empty()) return GroupStoreOpener();
  MEND_RETURN_IF_ERROR(CheckHostPort(config.group_store, "group_store"));
  auto [host, port] = SplitHostPort(config.group_store);
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(port);
  options.waitWorkers = false;
  options.timeout = std::chrono::milliseconds(config.quorum_timeout_ms);
  c10::intrusive_ptr<c10d::TCPStore> server;
  if (config.group_rank == 0) {
    c10d::TCPStoreOptions serve = options;
    serve.isServer = true;
    try {
      server = c10::make_intrusive<c10d::TCPStore>(host, serve);
      spdlog::info("group rank 0 serves the group's store on {}", config.group_store);
    } catch (const std::exception& error) {
      // Something (torchrun's agent) already serves it; connect like the others.
      spdlog::debug("group store {}: not serving it ({}); connecting", config.group_store, error.what());
    }
  }
  return GroupStoreOpener([address = config.group_store, host = host, options,
                           server]() -> StatusOr<std::unique_ptr<RendezvousStore>> {
    try {
      auto store = c10::make_intrusive<c10d::TCPStore>(host, options);
      return std::unique_ptr<RendezvousStore>(std::make_unique<TcpGroupStore>(address, std::move(store), server));
    } catch (const std::exception& error) {
      return UnavailableError(fmt::format("group store {}: cannot connect within quorum_timeout_ms = {}: {}", address,
                                          options.timeout.count(), error.what()));
    }
  });
}

}  // namespace mend
