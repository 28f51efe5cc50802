#include "store/kv_store.h"

#include <climits>

#include "core/status_format.h"
#include "core/text.h"
#include "fmt/format.h"

namespace mend::store {

Status KvStore::Set(const std::string& key, std::string value, Completions* done) {
  auto it = values_.find(key);
  size_t old_bytes = it == values_.end() ? 0 : key.size() + it->second.size();
  size_t new_bytes = key.size() + value.size();
  if (total_bytes_ - old_bytes + new_bytes > limits_.max_total_bytes) {
    return ResourceExhaustedError(
        fmt::format("store is full: setting '{}' ({} bytes) would exceed the {}-byte budget", key,
                    value.size(), limits_.max_total_bytes));
  }
  total_bytes_ = total_bytes_ - old_bytes + new_bytes;
  values_[key] = std::move(value);
  WakeWaitersOf(key, done);
  return OkStatus();
}

std::optional<std::string> KvStore::Get(const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

StatusOr<int64_t> KvStore::Add(const std::string& key, int64_t delta, Completions* done) {
  int64_t current = 0;
  if (auto it = values_.find(key); it != values_.end()) {
    auto parsed = ParseInt64(it->second);
    if (!parsed) {
      return FailedPreconditionError(
          fmt::format("store key '{}' holds a value that is not an integer", key));
    }
    current = *parsed;
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(current, delta, &sum)) {
    return OutOfRangeError(fmt::format("store key '{}': {} + {} overflows", key, current, delta));
  }
  MEND_RETURN_IF_ERROR(Set(key, std::to_string(sum), done));
  return sum;
}

size_t KvStore::Delete(const std::string& key, bool prefix) {
  size_t deleted = 0;
  auto erase = [&](std::map<std::string, std::string>::iterator it) {
    total_bytes_ -= it->first.size() + it->second.size();
    ++deleted;
    return values_.erase(it);
  };
  if (!prefix) {
    if (auto it = values_.find(key); it != values_.end()) erase(it);
    return deleted;
  }
  for (auto it = values_.lower_bound(key);
       it != values_.end() && it->first.compare(0, key.size(), key) == 0;) {
    it = erase(it);
  }
  return deleted;
}

uint64_t KvStore::Wait(std::vector<std::string> keys, Micros deadline, WaitCallback callback,
                       Completions* done) {
  uint64_t id = next_wait_id_++;
  if (AllPresent(keys)) {
    std::vector<std::string> values;
    for (const auto& key : keys) values.push_back(values_.at(key));
    done->push_back([cb = std::move(callback), v = std::move(values)]() mutable {
      cb(OkStatus(), std::move(v));
    });
    return id;
  }
  for (const auto& key : keys) waiters_by_key_.emplace(key, id);
  deadlines_.emplace(deadline, id);
  waiters_.emplace(id, Waiter{std::move(keys), deadline, std::move(callback)});
  return id;
}

void KvStore::Cancel(uint64_t wait_id, Completions* done) {
  Complete(wait_id, absl::CancelledError("store wait cancelled by the caller"), done);
}

void KvStore::ExpireWaits(Micros now, Completions* done) {
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    uint64_t id = deadlines_.begin()->second;
    deadlines_.erase(deadlines_.begin());
    auto it = waiters_.find(id);
    if (it == waiters_.end()) continue;
    std::string missing;
    for (const auto& key : it->second.keys) {
      if (!values_.contains(key)) missing += (missing.empty() ? "'" : ", '") + key + "'";
    }
    Complete(id, DeadlineExceededError(fmt::format("store wait timed out; missing {}", missing)),
             done);
  }
}

Micros KvStore::NextDeadline() const {
  return deadlines_.empty() ? INT64_MAX : deadlines_.begin()->first;
}

bool KvStore::AllPresent(const std::vector<std::string>& keys) const {
  for (const auto& key : keys) {
    if (!values_.contains(key)) return false;
  }
  return true;
}

void KvStore::Complete(uint64_t wait_id, Status status, Completions* done) {
  auto it = waiters_.find(wait_id);
  if (it == waiters_.end()) return;
  Waiter waiter = std::move(it->second);
  waiters_.erase(it);
  for (const auto& key : waiter.keys) {
    auto [begin, end] = waiters_by_key_.equal_range(key);
    for (auto entry = begin; entry != end; ++entry) {
      if (entry->second == wait_id) {
        waiters_by_key_.erase(entry);
        break;
      }
    }
  }
  std::vector<std::string> values;
  if (status.ok()) {
    for (const auto& key : waiter.keys) values.push_back(values_.at(key));
  }
  done->push_back([cb = std::move(waiter.callback), s = std::move(status),
                   v = std::move(values)]() mutable { cb(std::move(s), std::move(v)); });
}

void KvStore::WakeWaitersOf(const std::string& key, Completions* done) {
  std::vector<uint64_t> ready;
  auto [begin, end] = waiters_by_key_.equal_range(key);
  for (auto entry = begin; entry != end; ++entry) {
    if (AllPresent(waiters_.at(entry->second).keys)) ready.push_back(entry->second);
  }
  for (uint64_t id : ready) Complete(id, OkStatus(), done);
}

}  // namespace mend::store
