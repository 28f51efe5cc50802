#include "reducer/connect_threads.h"

#include <utility>

namespace mend::reducer {

void ConnectThreads::Pending::CallOff(const std::string& why) {
  {
    MutexLock lock(mu_);
    if (!called_off_) called_off_ = why;
  }
  changed_.NotifyAll();
}

void ConnectThreads::Pending::Return(StatusOr<std::unique_ptr<Communicator>> result) {
  StatusOr<std::unique_ptr<Communicator>> unused = InternalError("connect: given up");
  {
    MutexLock lock(mu_);
    returned_ = true;
    if (awaited_) {
      // Given up: the communicator closes here, on the connect's thread.
      unused = std::move(result);
    } else {
      result_ = std::move(result);
    }
  }
  changed_.NotifyAll();
}

StatusOr<std::unique_ptr<Communicator>> ConnectThreads::Pending::Await(const std::string& what) {
  MutexLock lock(mu_);
  while (!returned_ && !called_off_) changed_.Wait(mu_);
  awaited_ = true;
  // A connect that returned wins over a call-off that came after it: the
  // round's abort watch then calls off its communicator.
  if (!returned_) {
    return AbortedError(what + ": called off while its members connected: " + *called_off_);
  }
  return std::move(result_);
}

ConnectThreads::~ConnectThreads() {
  std::vector<Running> running;
  {
    MutexLock lock(mu_);
    running.swap(running_);
  }
  for (Running& r : running) r.thread.join();
}

std::shared_ptr<ConnectThreads::Pending> ConnectThreads::Start(Connect connect) {
  auto pending = std::make_shared<Pending>();
  std::vector<Running> finished;
  {
    MutexLock lock(mu_);
    for (auto it = running_.begin(); it != running_.end();) {
      if (it->pending->returned()) {
        finished.push_back(std::move(*it));
        it = running_.erase(it);
      } else {
        ++it;
      }
    }
    if (stopped_) {
      pending->CallOff(*stopped_);  // (and not started)
    } else {
      running_.push_back(
          {std::thread([pending, connect = std::move(connect)]() { pending->Return(connect()); }),
           pending});
    }
  }
  // (They returned: each join waits for no more than the thread's exit.)
  for (Running& r : finished) r.thread.join();
  return pending;
}

void ConnectThreads::Stop(const std::string& why) {
  MutexLock lock(mu_);
  stopped_ = why;
  for (Running& r : running_) r.pending->CallOff(why);
}

}  // namespace mend::reducer
