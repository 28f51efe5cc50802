// Gloo's rendezvous store interface over mend's RendezvousStore, with every
// key under a prefix (the round's) and every wait bounded. Gloo expects
// exceptions from a store; these two types carry what went wrong back to
// Communicator::Connect, which turns them into a Status.
//
// Thread-safety: used by one thread (Gloo's connect) at a time.
#pragma once

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "gloo/rendezvous/store.h"
#include "mend/communicator.h"

namespace mend::dataplane {

struct StoreTimeout : std::runtime_error {
  explicit StoreTimeout(std::vector<std::string> missing)
      : std::runtime_error("rendezvous keys did not appear in time"), keys(std::move(missing)) {}
  std::vector<std::string> keys;
};

struct StoreFailure : std::runtime_error {
  explicit StoreFailure(Status why) : std::runtime_error(why.ToString()), status(std::move(why)) {}
  Status status;
};

class GlooStore final : public gloo::rendezvous::Store {
 public:
  // `store` is not owned and must outlive this object.
  GlooStore(RendezvousStore& store, std::string prefix, std::chrono::milliseconds timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  // Both wait up to `timeout` (this store's), whatever Gloo passes.
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& gloo_timeout) override;

 private:
  RendezvousStore& store_;
  const std::string prefix_;
  const std::chrono::milliseconds timeout_;
};

}  // namespace mend::dataplane
