// What a round's rendezvous needs of a key-value store. The data plane
// (Communicator::Connect) reads and writes through it; the learner's side
// implements it over the lighthouse's store (src/learner/
// lighthouse_rendezvous.h) and over a group's own store (group_store.h);
// tests use an in-process one. Neither side includes the other for it.
#pragma once

#include <string>

#include "mend/clock.h"
#include "mend/status.h"

namespace mend {

class RendezvousStore {
 public:
  virtual ~RendezvousStore() = default;
  [[nodiscard]] virtual Status Set(const std::string& key, const std::string& value) = 0;
  // Waits up to `timeout` for the key; DEADLINE_EXCEEDED when it never came.
  [[nodiscard]] virtual StatusOr<std::string> Get(const std::string& key, Micros timeout) = 0;
  // Removes `key` (with `prefix`, every key that starts with it) where the
  // store can; stores that end with their job may keep them.
  [[nodiscard]] virtual Status Delete(const std::string& key, bool prefix) {
    (void)key;
    (void)prefix;
    return OkStatus();
  }
};

}  // namespace mend
