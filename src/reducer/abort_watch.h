// The abort watch of the round driver: one thread for the reducer's life.
//
// Thread-safety: Watch and Unwatch may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <utility>

#include "core/mutex.h"
#include "mend/lighthouse_client.h"

namespace mend::reducer {

// Calls a round off when the lighthouse sets the round's abort key (a member
// was declared dead, or restarted, after the round formed): its connect or
// its collective, so that the survivors stop waiting for the member at once
// instead of at the connect's or the collective's deadline. One thread for
// the reducer's life, long-polling the key of the round watched. A poll lasts
// kPoll, or until the watch moves on (Unwatch, Watch, destruction), which
// cancels it: a round in flight costs the lighthouse one call per kPoll, not
// one per few hundred milliseconds (each call wakes threads on both sides,
// which the training threads beside them feel on a machine with few cores).
class AbortWatch {
 public:
  explicit AbortWatch(LighthouseClient& client) : client_(client), thread_([this]() { Run(); }) {}
  ~AbortWatch() {
    {
      MutexLock lock(mu_);
      stopping_ = true;
      CancelPoll();
    }
    changed_.NotifyAll();
    thread_.join();
  }

  // Watches `key` until Unwatch(): `abort(reason)` is called (on the
  // watch's thread, at most once) when it is set; what it touches must stay
  // alive until Unwatch() returns.
  void Watch(const std::string& key, std::function<void(const std::string&)> abort) {
    {
      MutexLock lock(mu_);
      key_ = key;
      abort_ = std::move(abort);
      ++generation_;
      CancelPoll();
    }
    changed_.NotifyAll();
  }
  void Unwatch() {
    MutexLock lock(mu_);
    abort_ = nullptr;
    ++generation_;
    CancelPoll();
  }

 private:
  static constexpr auto kPoll = std::chrono::seconds(10);
  // After the lighthouse could not be reached (restarting).
  static constexpr auto kRetry = std::chrono::milliseconds(200);

  void Run();
  void CancelPoll() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (poll_ != nullptr) poll_->Cancel();
  }

  LighthouseClient& client_;
  Mutex mu_;
  CondVar changed_;
  std::string key_ ABSL_GUARDED_BY(mu_);
  std::function<void(const std::string&)> abort_ ABSL_GUARDED_BY(mu_);  // null: none watched
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The poll in progress (owned by Run's frame), null between polls.
  CallCanceller* poll_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread thread_;  // last: starts after the members above exist
};

}  // namespace mend::reducer
