#include "cli/signals.h"

#include <signal.h>

#include <cerrno>
#include <ctime>

namespace mend::cli {

SignalThread::SignalThread(std::vector<int> signals, std::function<void(int)> on_signal) {
  sigset_t set;
  sigemptyset(&set);
  for (int signal : signals) sigaddset(&set, signal);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  thread_ = std::thread([this, set, on_signal = std::move(on_signal)]() {
    // Checks stop_ every 100 ms; a signal is handled as soon as it arrives.
    timespec timeout{0, 100'000'000};
    while (!stop_.load()) {
      int signal = sigtimedwait(&set, nullptr, &timeout);
      if (signal > 0) on_signal(signal);
    }
  });
}

SignalThread::~SignalThread() {
  stop_ = true;
  thread_.join();
}

}  // namespace mend::cli
