// Linked into every test binary: a test process still running after
// HANG_DUMP_AFTER_S seconds (default 240, under the test command's
// 300 s ctest timeout; 0: never) prints every thread's stack to stderr
// once, with gdb when it is installed. A hang on a loaded CI machine then
// leaves its stacks in ctest's output instead of only "Timeout". (Not
// MEND_*: that prefix is the configuration's, and the mend processes that
// tests start refuse a variable of it they do not know.)
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

extern char** environ;

namespace {

void DumpStacks() {
  const std::string pid = std::to_string(getpid());
  std::fprintf(stderr, "\n[hang dump] pid %s still running after HANG_DUMP_AFTER_S; stacks:\n",
               pid.c_str());
  std::fflush(stderr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, STDERR_FILENO, STDOUT_FILENO);
  const char* argv[] = {"gdb", "-p",  pid.c_str(),           "-batch",
                        "-nx", "-ex", "thread apply all bt", nullptr};
  pid_t child = 0;
  if (posix_spawnp(&child, "gdb", &actions, nullptr, const_cast<char**>(argv), environ) != 0) {
    std::fprintf(stderr, "[hang dump] gdb is not installed; no stacks\n");
  } else {
    int status = 0;
    while (waitpid(child, &status, 0) < 0) {
    }
  }
  posix_spawn_file_actions_destroy(&actions);
}

struct HangDump {
  HangDump() {
    const char* env = std::getenv("HANG_DUMP_AFTER_S");
    const long after = env ? std::atol(env) : 240;
    if (after <= 0) return;
    // gdb runs as this process's child: let it trace its parent (YAMA).
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    // A timer, not a synchronisation: the process normally exits long
    // before it fires (a detached thread ends with the process).
    std::thread([after] {
      std::this_thread::sleep_for(std::chrono::seconds(after));
      DumpStacks();
    }).detach();
  }
};

const HangDump hang_dump;

}  // namespace
