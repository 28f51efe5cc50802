// Signal handling without async-signal-safety hazards: the signals are
// blocked in every thread and a dedicated thread receives them with
// sigtimedwait and calls an ordinary function.
// Thread-safety: construct in main() before any other thread starts, so
// every thread inherits the blocked mask.
#pragma once

#include <atomic>
#include <functional>
#include <thread>
#include <vector>

namespace mend::cli {

class SignalThread {
 public:
  SignalThread(std::vector<int> signals, std::function<void(int)> on_signal);
  ~SignalThread();

  SignalThread(const SignalThread&) = delete;
  SignalThread& operator=(const SignalThread&) = delete;

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace mend::cli
