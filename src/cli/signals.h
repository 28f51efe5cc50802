// Signal handling without async-signal-safety hazards: a handler for each
// signal writes its number to a self-pipe, and a dedicated thread reads the
// pipe and calls an ordinary function. Handlers (not blocked masks) are used
// because libraries start threads before main() (Debian's OpenBLAS does,
// when LibTorch is loaded), and a signal delivered to one of those threads
// with its default action would kill the process.
// Thread-safety: one SignalThread per process at a time; the destructor
// restores the previous handlers.
#pragma once

#include <signal.h>

#include <atomic>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

namespace mend::cli {

class SignalThread {
 public:
  SignalThread(std::vector<int> signals, std::function<void(int)> on_signal);
  ~SignalThread();

  SignalThread(const SignalThread&) = delete;
  SignalThread& operator=(const SignalThread&) = delete;

 private:
  int read_fd_ = -1;
  int write_fd_ = -1;
  std::vector<std::pair<int, struct sigaction>> previous_;
  std::thread thread_;
};

}  // namespace mend::cli
