#include "reducer/abort_watch.h"

#include <chrono>

#include "absl/status/status.h"

namespace mend::reducer {

void AbortWatch::Run() {
  MutexLock lock(mu_);
  while (!stopping_) {
    if (abort_ == nullptr) {
      while (!stopping_ && abort_ == nullptr) changed_.Wait(mu_);
      continue;
    }
    const std::string key = key_;
    const uint64_t generation = generation_;
    CallCanceller poll;
    poll_ = &poll;
    lock.Unlock();
    StatusOr<std::string> why = client_.StoreGetCancellable(
        key, std::chrono::duration_cast<std::chrono::microseconds>(kPoll).count(), poll);
    lock.Lock();
    poll_ = nullptr;
    if (generation != generation_) continue;  // that round is over
    if (why.ok()) {
      abort_(*why);
      abort_ = nullptr;
    } else if (why.status().code() != absl::StatusCode::kDeadlineExceeded &&
               why.status().code() != absl::StatusCode::kCancelled) {
      // The lighthouse is unreachable (restarting): ask again a little later.
      const auto retry_at = std::chrono::steady_clock::now() + kRetry;
      while (!stopping_ && generation == generation_ && changed_.WaitUntil(mu_, retry_at)) {
      }
    }
  }
}

}  // namespace mend::reducer
