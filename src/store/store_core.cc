#include "store/store_core.h"

#include <utility>

namespace mend::store {

void StoreCore::Run(Completions& completions) {
  for (auto& completion : completions) completion();
  completions.clear();
}

Status StoreCore::Set(const std::string& key, std::string value) {
  Completions completions;
  Status status = Set(key, std::move(value), &completions);
  Run(completions);
  return status;
}

Status StoreCore::Set(const std::string& key, std::string value, Completions* done) {
  MutexLock lock(mu_);
  ops_++;
  return store_.Set(key, std::move(value), done);
}

std::optional<std::string> StoreCore::Get(const std::string& key) {
  MutexLock lock(mu_);
  ops_++;
  return store_.Get(key);
}

uint64_t StoreCore::Wait(std::vector<std::string> keys, Micros timeout,
                         KvStore::WaitCallback done) {
  Completions completions;
  uint64_t id = 0;
  bool wake = false;
  {
    MutexLock lock(mu_);
    const Micros before = store_.NextDeadline();
    ops_++;
    id = store_.Wait(std::move(keys), clock_->NowMicros() + timeout, std::move(done), &completions);
    wake = store_.NextDeadline() < before;
  }
  Run(completions);
  if (wake && wakeup_) wakeup_();
  return id;
}

void StoreCore::Cancel(uint64_t wait_id) {
  Completions completions;
  {
    MutexLock lock(mu_);
    store_.Cancel(wait_id, &completions);
  }
  Run(completions);
}

StatusOr<int64_t> StoreCore::Add(const std::string& key, int64_t delta) {
  Completions completions;
  StatusOr<int64_t> result;
  {
    MutexLock lock(mu_);
    ops_++;
    result = store_.Add(key, delta, &completions);
  }
  Run(completions);
  return result;
}

size_t StoreCore::Delete(const std::string& key, bool prefix) {
  MutexLock lock(mu_);
  ops_++;
  return store_.Delete(key, prefix);
}

void StoreCore::Tick() {
  Completions completions;
  {
    MutexLock lock(mu_);
    store_.ExpireWaits(clock_->NowMicros(), &completions);
  }
  Run(completions);
}

Micros StoreCore::NextDeadline() const {
  MutexLock lock(mu_);
  return store_.NextDeadline();
}

StoreStats StoreCore::Stats() {
  MutexLock lock(mu_);
  return {store_.key_count(), store_.total_bytes(), store_.waiter_count(), ops_};
}

}  // namespace mend::store
