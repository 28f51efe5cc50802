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
// round whose communicator is watched.
class AbortWatch {
 public:
  explicit AbortWatch(LighthouseClient& client) : client_(client), thread_([this]() { Run(); }) {}
  ~AbortWatch() {
    {
      MutexLock lock(mu_);
      stopping_ = true;
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
    }
    changed_.NotifyAll();
  }
  void Unwatch() {
    MutexLock lock(mu_);
    comm_ = nullptr;
    ++generation_;
  }

 private:
  static constexpr auto kPoll = std::chrono::milliseconds(200);

  void Run();

  LighthouseClient& client_;
  Mutex mu_;
  CondVar changed_;
  std::string key_ ABSL_GUARDED_BY(mu_);
  Communicator* comm_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after the members above exist
};

}  // namespace mend::reducer
