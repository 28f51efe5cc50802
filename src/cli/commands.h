// The subcommands of the `mend` tool. Each Add*Command registers its
// subcommand on `app`; when chosen, its callback stores the process exit code
// in *exit_code.
#pragma once

#include <exception>
#include <functional>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "mend/status.h"

namespace mend::cli {

// In the executable mend-lighthouse, which `mend lighthouse` runs.
void AddLighthouseCommand(CLI::App& app, int* exit_code);
inline constexpr char kLighthouseDescription[] =
    "Run the coordinator: membership, heartbeats, quorum rounds, fail-slow detection, "
    "rendezvous store, status page and /metrics. Prints 'mend lighthouse grpc=HOST:PORT "
    "http=HOST:PORT' on stdout once serving. (The executable mend-lighthouse, which does not "
    "load LibTorch.)";
void AddSimLearnerCommand(CLI::App& app, int* exit_code);
void AddDemoCommand(CLI::App& app, int* exit_code);
void AddFaultDemoCommand(CLI::App& app, int* exit_code);
void AddTrainCommand(CLI::App& app, int* exit_code);
void AddChaosCommand(CLI::App& app, int* exit_code);
void AddCheckpointCommand(CLI::App& app, int* exit_code);
void AddConfigCommand(CLI::App& app, int* exit_code);
void AddStatusCommand(CLI::App& app, int* exit_code);

// Exit codes shared by the commands (README, "Exit status").
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadConfig = 2;
inline constexpr int kExitRefused = 3;
inline constexpr int kExitInternal = 4;  // an exception escaped a command: a bug

// A lighthouse's refusal of the job token (UNAUTHENTICATED,
// PERMISSION_DENIED) is kExitRefused, whichever call met it.
inline bool RefusedByTheLighthouse(const Status& status) {
  return status.code() == absl::StatusCode::kUnauthenticated ||
         status.code() == absl::StatusCode::kPermissionDenied;
}

// The exit status of a command that failed with `status`: kExitRefused for
// the lighthouse's refusal of the token, kExitBadConfig for the command's
// bad input (INVALID_ARGUMENT: a value out of range, another job's id or
// settings the lighthouse refused; NOT_FOUND: a missing corpus or file;
// ALREADY_EXISTS: another process registered under the learner's id),
// else kExitFailure (a lighthouse that cannot be reached among them). An
// INVALID_ARGUMENT that is a bug of mend's own (a malformed request the
// lighthouse refused) reads as bad input too.
inline int ExitCodeOf(const Status& status) {
  if (RefusedByTheLighthouse(status)) return kExitRefused;
  if (status.code() == absl::StatusCode::kInvalidArgument ||
      status.code() == absl::StatusCode::kNotFound ||
      status.code() == absl::StatusCode::kAlreadyExists) {
    return kExitBadConfig;
  }
  return kExitFailure;
}

// A main(): parses the command line into `app` (whose chosen command sets
// `exit_code`) and returns the process's exit status: `exit_code`,
// kExitBadConfig for a command line CLI11 refuses, or, for an exception that escaped the
// command, kExitInternal after one line on stderr, "<app> <command>:
// internal error: <the first line of the message>". `message`, when given,
// renders an exception of its own kinds (LibTorch's without its backtrace);
// nullopt leaves it to what().
int RunCommandLine(
    CLI::App& app, int argc, char** argv, const int& exit_code,
    const std::function<std::optional<std::string>(const std::exception&)>& message = {});

}  // namespace mend::cli
