// StoreCore: the rendezvous key-value store (KvStore) behind a mutex, with
// its wait deadlines advanced by Tick(). The lighthouse's store and a
// learner group's own store are each one; the gRPC store service
// (store_service.h) answers over it. Waiting calls never block: a wait's
// callback runs exactly once, always after the mutex is released, on the
// thread whose call (a Set, an Add, a Cancel, a Tick) completed it.
//
// An owner with a mutex of its own (LighthouseCore deletes old rounds' keys
// and writes abort keys while it holds its own) uses Set/Delete with a
// Completions list that it runs after releasing its mutex; the lock order is
// the owner's, then this one's.
//
// Thread-safety: every public method may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "core/mutex.h"
#include "mend/clock.h"
#include "mend/status.h"
#include "store/kv_store.h"

namespace mend::store {

struct StoreStats {
  size_t keys = 0;
  size_t bytes = 0;
  size_t waiters = 0;
  uint64_t ops = 0;  // calls that read or wrote the store
};

class StoreCore {
 public:
  // `clock` is not owned and must outlive this.
  StoreCore(KvStoreLimits limits, const Clock* clock) : clock_(clock), store_(limits) {}

  [[nodiscard]] Status Set(const std::string& key, std::string value);
  std::optional<std::string> Get(const std::string& key);
  // `done` gets the values once all keys exist, or DEADLINE_EXCEEDED after
  // `timeout`, or CANCELLED by Cancel. Returns the wait's id.
  uint64_t Wait(std::vector<std::string> keys, Micros timeout, KvStore::WaitCallback done);
  void Cancel(uint64_t wait_id);
  [[nodiscard]] StatusOr<int64_t> Add(const std::string& key, int64_t delta);
  size_t Delete(const std::string& key, bool prefix);

  // For an owner that holds a mutex of its own: the callbacks these complete
  // go to `done`, for the owner to run after it released its mutex.
  [[nodiscard]] Status Set(const std::string& key, std::string value, Completions* done);

  // Completes the waits whose deadline passed.
  void Tick();
  // When Tick() next has something to do (INT64_MAX: nothing scheduled).
  Micros NextDeadline() const;
  // `wakeup` is called, without the mutex, when NextDeadline may have moved
  // earlier. Set once, before any other call.
  void SetWakeup(std::function<void()> wakeup) { wakeup_ = std::move(wakeup); }
  StoreStats Stats();

 private:
  static void Run(Completions& completions);

  const Clock* const clock_;  // not owned
  std::function<void()> wakeup_;
  mutable Mutex mu_;
  KvStore store_ ABSL_GUARDED_BY(mu_);
  uint64_t ops_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace mend::store
