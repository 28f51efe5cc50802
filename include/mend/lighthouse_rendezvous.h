// The lighthouse's key-value store as a data-plane rendezvous store: what a
// learner hands Communicator::Connect for each round.
//
// Thread-safety: as the LighthouseClient it wraps (safe from any thread).
#pragma once

#include "mend/communicator.h"
#include "mend/lighthouse_client.h"

namespace mend {

class LighthouseRendezvousStore final : public RendezvousStore {
 public:
  // `client` is not owned and must outlive this object.
  explicit LighthouseRendezvousStore(LighthouseClient& client) : client_(client) {}

  Status Set(const std::string& key, const std::string& value) override {
    return client_.StoreSet(key, value);
  }
  StatusOr<std::string> Get(const std::string& key, Micros timeout) override {
    return client_.StoreGet(key, timeout);
  }

 private:
  LighthouseClient& client_;
};

}  // namespace mend
