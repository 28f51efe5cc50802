#include "core/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>

#include "core/status_format.h"
#include "fmt/format.h"

extern char** environ;

namespace mend {
namespace {

int PidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

Status Errno(std::string_view what) {
  return InternalError(fmt::format("{}: {}", what, std::strerror(errno)));
}

// Waits until `fd` is readable or `timeout` passes; true when readable.
bool PollReadable(int fd, Micros timeout) {
  Micros deadline = RealClock()->NowMicros() + timeout;
  while (true) {
    Micros left = deadline - RealClock()->NowMicros();
    if (left < 0) left = 0;
    pollfd entry{fd, POLLIN, 0};
    int ready = poll(&entry, 1, static_cast<int>((left + 999) / 1000));
    if (ready > 0) return true;
    if (ready == 0) return false;
    if (errno != EINTR) return false;
  }
}

}  // namespace

std::string SelfExecutable() {
  std::error_code error;
  auto path = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? std::string() : path.string();
}

namespace {

// The child starts with default signal dispositions and no blocked signals,
// in a process group of its own when `new_process_group`.
void InitAttributes(posix_spawnattr_t* attributes, bool new_process_group) {
  posix_spawnattr_init(attributes);
  sigset_t all;
  sigfillset(&all);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(attributes, &all);
  posix_spawnattr_setsigmask(attributes, &none);
  short flags = POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK;
  if (new_process_group) {
    flags |= POSIX_SPAWN_SETPGROUP;
    posix_spawnattr_setpgroup(attributes, 0);
  }
  posix_spawnattr_setflags(attributes, flags);
}

// The child's environment: this process's, less options.unset_env, with
// options.extra_env added or replacing; "NAME=value" each.
std::vector<std::string> ChildEnvironment(const SubprocessOptions& options) {
  std::map<std::string, std::string> env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    std::string line(*entry);
    env[line.substr(0, line.find('='))] = line;
  }
  for (const auto& name : options.unset_env) env.erase(name);
  for (const auto& line : options.extra_env) env[line.substr(0, line.find('='))] = line;
  std::vector<std::string> lines;
  for (auto& [name, line] : env) lines.push_back(std::move(line));
  return lines;
}

}  // namespace

StatusOr<std::unique_ptr<Subprocess>> Subprocess::Spawn(const SubprocessOptions& options) {
  if (options.argv.empty()) return InvalidArgumentError("Subprocess: empty argv");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_t attributes;
  InitAttributes(&attributes, options.new_process_group);

  int pipe_fds[2] = {-1, -1};
  auto redirect = [&](const std::string& to, int target) -> Status {
    if (to.empty()) return OkStatus();
    if (to == "pipe") {
      if (target != STDOUT_FILENO) return InvalidArgumentError("only stdout can be a pipe");
      if (pipe2(pipe_fds, O_CLOEXEC) != 0) return Errno("pipe2");
      posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], target);
      return OkStatus();
    }
    posix_spawn_file_actions_addopen(&actions, target, to.c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                     0644);
    return OkStatus();
  };
  Status status = redirect(options.stdout_to, STDOUT_FILENO);
  if (status.ok()) status = redirect(options.stderr_to, STDERR_FILENO);

  std::vector<std::string> env = ChildEnvironment(options);
  std::vector<char*> envp;
  for (std::string& line : env) envp.push_back(line.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = options.argv;
  std::vector<char*> argv;
  for (auto& arg : argv_copy) argv.push_back(arg.data());
  argv.push_back(nullptr);

  std::unique_ptr<Subprocess> child(new Subprocess());
  if (status.ok()) {
    int error = posix_spawn(&child->pid_, argv[0], &actions, &attributes, argv.data(), envp.data());
    if (error != 0) {
      status = InternalError(fmt::format("cannot start {}: {}", argv[0], std::strerror(error)));
      child->pid_ = -1;
    }
  }
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (pipe_fds[1] >= 0) close(pipe_fds[1]);
  if (!status.ok()) {
    if (pipe_fds[0] >= 0) close(pipe_fds[0]);
    return status;
  }
  child->stdout_fd_ = pipe_fds[0];
  child->pidfd_ = PidfdOpen(child->pid_);
  if (child->pidfd_ < 0) return Errno("pidfd_open");
  return child;
}

Subprocess::~Subprocess() {
  Kill();
  if (pidfd_ >= 0) close(pidfd_);
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

Status Subprocess::Signal(int signal) {
  if (exit_status_ || pid_ <= 0) return OkStatus();
  if (kill(pid_, signal) != 0 && errno != ESRCH) return Errno("kill");
  return OkStatus();
}

StatusOr<int> Subprocess::Wait(Micros timeout) {
  if (exit_status_) return *exit_status_;
  if (!PollReadable(pidfd_, timeout)) {
    return DeadlineExceededError(
        fmt::format("process {} still running after {} ms", pid_, timeout / kMicrosPerMilli));
  }
  int wait_status = 0;
  pid_t reaped;
  do {
    reaped = waitpid(pid_, &wait_status, 0);
  } while (reaped < 0 && errno == EINTR);
  if (reaped != pid_) return Errno("waitpid");
  exit_status_ = wait_status;
  return wait_status;
}

bool Subprocess::running() {
  if (exit_status_) return false;
  return !Wait(0).ok();
}

StatusOr<std::string> Subprocess::ReadLine(Micros timeout) {
  if (stdout_fd_ < 0) return FailedPreconditionError("stdout is not a pipe");
  Micros deadline = RealClock()->NowMicros() + timeout;
  while (true) {
    size_t newline = buffer_.find('\n');
    if (newline != std::string::npos) {
      std::string line = buffer_.substr(0, newline);
      buffer_.erase(0, newline + 1);
      return line;
    }
    Micros left = deadline - RealClock()->NowMicros();
    if (left <= 0 || !PollReadable(stdout_fd_, left)) {
      return DeadlineExceededError(
          fmt::format("no line from process {} within {} ms", pid_, timeout / kMicrosPerMilli));
    }
    char chunk[4096];
    ssize_t got = read(stdout_fd_, chunk, sizeof chunk);
    if (got == 0) return OutOfRangeError(fmt::format("process {} closed its stdout", pid_));
    if (got < 0 && errno != EINTR) return Errno("read");
    if (got > 0) buffer_.append(chunk, static_cast<size_t>(got));
  }
}

void Subprocess::Kill() {
  if (pid_ <= 0 || exit_status_) return;
  kill(pid_, SIGKILL);
  (void)Wait(60 * kMicrosPerSecond);
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return fmt::format("killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  }
  return fmt::format("stopped or continued (wait status {:#x})", status);
}

}  // namespace mend
