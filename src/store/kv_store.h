// The rendezvous key-value store of the lighthouse, in the shape of c10d's
// Store: set, get, add (integer counters stored as decimal text), wait for
// keys with a deadline, delete (by key or prefix).
//
// Waits do not block: Wait() registers a callback that is queued onto
// `Completions` once every key exists or the deadline passes, and the owner
// runs the queued callbacks after releasing its mutex.
//
// Thread-safety: none; StoreCore serializes access under its mutex.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "mend/clock.h"
#include "mend/status.h"

namespace mend::store {

// Callbacks to run once the owner's mutex is released.
using Completions = std::vector<std::function<void()>>;

struct KvStoreLimits {
  size_t max_key_bytes = 512;
  size_t max_value_bytes = 4 << 20;
  size_t max_total_bytes = 256 << 20;
};

class KvStore {
 public:
  // Receives OK and the values of the waited keys (in request order), or
  // DEADLINE_EXCEEDED / CANCELLED and no values.
  using WaitCallback = std::function<void(Status, std::vector<std::string>)>;

  explicit KvStore(KvStoreLimits limits = {}) : limits_(limits) {}

  // RESOURCE_EXHAUSTED when the store would exceed its byte budget.
  [[nodiscard]] Status Set(const std::string& key, std::string value, Completions* done);
  std::optional<std::string> Get(const std::string& key) const;
  // Adds `delta` to the integer under `key` (0 when absent) and returns the
  // sum; FAILED_PRECONDITION when the key holds something else.
  [[nodiscard]] StatusOr<int64_t> Add(const std::string& key, int64_t delta, Completions* done);
  // Deletes `key`, or every key starting with it when `prefix`; returns how many.
  size_t Delete(const std::string& key, bool prefix);

  // Calls `callback` once all `keys` exist (at once if they do), or with
  // DEADLINE_EXCEEDED at `deadline`. Returns an id for Cancel.
  uint64_t Wait(std::vector<std::string> keys, Micros deadline, WaitCallback callback,
                Completions* done);
  // Completes the wait with CANCELLED if it is still outstanding.
  void Cancel(uint64_t wait_id, Completions* done);
  // Completes every wait whose deadline is at or before `now`.
  void ExpireWaits(Micros now, Completions* done);
  Micros NextDeadline() const;

  size_t key_count() const { return values_.size(); }
  size_t total_bytes() const { return total_bytes_; }
  size_t waiter_count() const { return waiters_.size(); }

 private:
  struct Waiter {
    std::vector<std::string> keys;
    Micros deadline = 0;
    WaitCallback callback;
  };
  bool AllPresent(const std::vector<std::string>& keys) const;
  void Complete(uint64_t wait_id, Status status, Completions* done);
  void WakeWaitersOf(const std::string& key, Completions* done);

  KvStoreLimits limits_;
  std::map<std::string, std::string> values_;
  size_t total_bytes_ = 0;
  uint64_t next_wait_id_ = 1;
  std::unordered_map<uint64_t, Waiter> waiters_;
  // key -> waits that name it; deadline -> wait.
  std::unordered_multimap<std::string, uint64_t> waiters_by_key_;
  std::multimap<Micros, uint64_t> deadlines_;
};

}  // namespace mend::store
