#include "reducer/abort_watch.h"

#include <chrono>

#include "absl/status/status.h"

namespace mend::reducer {

void AbortWatch::Run() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    if (comm_ == nullptr) {
      changed_.wait(lock, [this]() { return stopping_ || comm_ != nullptr; });
      continue;
    }
    const std::string key = key_;
    const uint64_t generation = generation_;
    lock.unlock();
    StatusOr<std::string> why =
        client_.StoreGet(key, std::chrono::duration_cast<std::chrono::microseconds>(kPoll).count());
    lock.lock();
    if (generation != generation_) continue;  // that round is over
    if (why.ok()) {
      comm_->Abort(*why);
      comm_ = nullptr;
    } else if (why.status().code() != absl::StatusCode::kDeadlineExceeded) {
      // The lighthouse is unreachable (restarting): ask again a little later.
      changed_.wait_for(lock, kPoll, [&]() { return stopping_ || generation != generation_; });
    }
  }
}

}  // namespace mend::reducer
