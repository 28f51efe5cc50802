// The abort watch of the round driver: one thread for the reducer's life.
//
// Thread-safety: Watch and Unwatch may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "core/mutex.h"
#include "mend/communicator.h"
#include "mend/lighthouse_client.h"

namespace mend::reducer {

// Calls a round's collective off when the lighthouse sets the round's abort
// key (a member was declared dead, or restarted, after the round formed):
// the survivors stop waiting for it at once instead of at the collective's
// deadline. One thread for the reducer's life, long-polling the key of the
// round whose communicator is watched. A poll lasts kPoll, or until the
// watch moves on (Unwatch, Watch, destruction), which cancels it: a round in
// flight costs the lighthouse one call per kPoll, not one per few hundred
// milliseconds (each call wakes threads on both sides, which the training
// threads beside them feel on a machine with few cores).
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

  // Watches `key` for `comm` until Unwatch(); `comm` must stay alive until then.
  void Watch(const std::string& key, Communicator* comm) {
    {
      MutexLock lock(mu_);
      key_ = key;
      comm_ = comm;
      ++generation_;
      CancelPoll();
    }
    changed_.NotifyAll();
  }
  void Unwatch() {
    MutexLock lock(mu_);
    comm_ = nullptr;
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
  Communicator* comm_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The poll in progress (owned by Run's frame), null between polls.
  CallCanceller* poll_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread thread_;  // last: starts after the members above exist
};

}  // namespace mend::reducer
