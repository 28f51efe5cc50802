// A round's connect, on a thread of its own, so that it can be called off.
//
// Gloo's connect cannot be interrupted: when a member died after the
// rendezvous (its addresses in the store) and before it connected, the
// side of each of its pairs that waits for it to connect waits until
// connect_timeout_ms. Called off (the lighthouse's abort key, or
// shutdown), the round's wait ends at once with ABORTED, and the connect
// runs out its own timeouts in the background; its thread is joined at the
// next start or at destruction.
//
// Thread-safety: Start from any thread (the rounds' threads, several at
// once); a Pending's Await from the one thread that started it, its CallOff
// from any; Stop from any.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/mutex.h"
#include "mend/communicator.h"
#include "mend/status.h"

namespace mend::reducer {

class ConnectThreads {
 public:
  using Connect = std::function<StatusOr<std::unique_ptr<Communicator>>()>;

  // One connect in progress: its communicator, or the reason it was called off.
  class Pending {
   public:
    // Ends Await() with ABORTED and `why`, unless the connect returned first.
    void CallOff(const std::string& why);
    // Until the connect returned (its result) or was called off (ABORTED,
    // "<what>: called off while its members connected: <why>").
    [[nodiscard]] StatusOr<std::unique_ptr<Communicator>> Await(const std::string& what);

   private:
    friend class ConnectThreads;
    void Return(StatusOr<std::unique_ptr<Communicator>> result);
    bool returned() const {
      MutexLock lock(mu_);
      return returned_;
    }

    mutable Mutex mu_;
    CondVar changed_;
    bool returned_ ABSL_GUARDED_BY(mu_) = false;
    bool awaited_ ABSL_GUARDED_BY(mu_) = false;  // Await took the result
    std::optional<std::string> called_off_ ABSL_GUARDED_BY(mu_);
    StatusOr<std::unique_ptr<Communicator>> result_ ABSL_GUARDED_BY(mu_) =
        InternalError("connect: no result yet");
  };

  ConnectThreads() = default;
  ConnectThreads(const ConnectThreads&) = delete;
  ConnectThreads& operator=(const ConnectThreads&) = delete;
  // Joins every connect still running (each ends within its own timeouts).
  ~ConnectThreads();

  // Runs `connect` on a thread of its own (none after Stop: the Pending is
  // called off). What it touches must outlive this object, or be owned by
  // the function.
  [[nodiscard]] std::shared_ptr<Pending> Start(Connect connect);
  // Calls off every connect in progress, and every later one at its start
  // (shutdown).
  void Stop(const std::string& why);

  // Threads started and not yet joined (finished or not).
  size_t threads() const {
    MutexLock lock(mu_);
    return running_.size();
  }

 private:
  struct Running {
    std::thread thread;
    std::shared_ptr<Pending> pending;
  };

  mutable Mutex mu_;
  std::vector<Running> running_ ABSL_GUARDED_BY(mu_);
  std::optional<std::string> stopped_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mend::reducer
