#include "cli/signals.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <map>

namespace mend::cli {
namespace {

// The write end of the self-pipe; the handler only writes one byte to it.
std::atomic<int> g_signal_pipe{-1};

void OnSignal(int signal) {
  const int saved = errno;
  const int fd = g_signal_pipe.load();
  if (fd >= 0) {
    const unsigned char byte = static_cast<unsigned char>(signal);
    [[maybe_unused]] ssize_t written = write(fd, &byte, 1);
  }
  errno = saved;
}

}  // namespace

SignalThread::SignalThread(std::vector<int> signals, std::function<void(int)> on_signal) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    std::perror("mend: pipe2 for signals");
    return;
  }
  read_fd_ = fds[0];
  write_fd_ = fds[1];
  g_signal_pipe.store(write_fd_);
  for (int signal : signals) {
    struct sigaction action {};
    action.sa_handler = OnSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    struct sigaction previous {};
    sigaction(signal, &action, &previous);
    previous_.emplace_back(signal, previous);
  }
  thread_ = std::thread([this, on_signal = std::move(on_signal)]() {
    while (true) {
      pollfd ready{read_fd_, POLLIN, 0};
      if (poll(&ready, 1, -1) < 0 && errno != EINTR) return;
      unsigned char byte = 0;
      while (read(read_fd_, &byte, 1) == 1) {
        if (byte == 0) return;  // the destructor's wake-up
        on_signal(byte);
      }
    }
  });
}

SignalThread::~SignalThread() {
  if (write_fd_ < 0) return;
  for (const auto& [signal, previous] : previous_) sigaction(signal, &previous, nullptr);
  g_signal_pipe.store(-1);
  const unsigned char stop = 0;
  [[maybe_unused]] ssize_t written = write(write_fd_, &stop, 1);
  thread_.join();
  close(read_fd_);
  close(write_fd_);
}

}  // namespace mend::cli
