// mend::Subprocess: a child process started with posix_spawn, for the demo,
// the chaos harness, benchmarks and multi-process tests. Waiting for exit
// uses a pidfd, so a wait with a timeout needs no polling.
//
// Thread-safety: one owner thread per Subprocess. The destructor kills
// (SIGKILL) and reaps a child that is still running, so no child outlives
// its owner by accident.
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mend/clock.h"
#include "mend/status.h"

namespace mend {

struct SubprocessOptions {
  std::vector<std::string> argv;  // argv[0] is the program path
  // Added to (or replacing in) the parent's environment, "NAME=value".
  std::vector<std::string> extra_env;
  // Where stdout and stderr go: "" inherits the parent's; "pipe" (stdout
  // only) makes ReadLine available; anything else is a file path (appended).
  std::string stdout_to;
  std::string stderr_to;
  // Start the child in a new process group (so a signal can reach its
  // whole tree); it is also what keeps a terminal's Ctrl-C from the child.
  bool new_process_group = false;
  // Names taken out of the parent's environment.
  std::vector<std::string> unset_env = {};
};

class Subprocess {
 public:
  [[nodiscard]] static StatusOr<std::unique_ptr<Subprocess>> Spawn(
      const SubprocessOptions& options);
  ~Subprocess();

  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  // Sends `signal` (no-op once the child was reaped).
  [[nodiscard]] Status Signal(int signal);
  // Waits up to `timeout` for the child to exit. Returns its wait status
  // (decode with WIFEXITED etc.), or DEADLINE_EXCEEDED if it still runs.
  [[nodiscard]] StatusOr<int> Wait(Micros timeout);
  // True while the child has not been reaped.
  bool running();
  // One line of the child's stdout (without '\n'), waiting up to `timeout`.
  // Requires stdout_to = "pipe". OUT_OF_RANGE at end of file.
  [[nodiscard]] StatusOr<std::string> ReadLine(Micros timeout);
  // SIGKILL, then reap.
  void Kill();

 private:
  Subprocess() = default;

  pid_t pid_ = -1;
  int pidfd_ = -1;
  int stdout_fd_ = -1;
  std::string buffer_;
  std::optional<int> exit_status_;
};

// The path of the running executable (/proc/self/exe resolved).
std::string SelfExecutable();

// A wait status in words: "exited with 3", "killed by signal 9 (Killed)".
std::string DescribeWaitStatus(int status);

}  // namespace mend
