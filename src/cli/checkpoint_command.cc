// mend checkpoint inspect FILE: what a checkpoint holds (header only).
// mend checkpoint verify [--token-file F] FILE...: reads every byte and checks
// every checksum, and an authenticated checkpoint's MAC under the job token
// (MEND_JOB_TOKEN or --token-file); exit 0 when all verify, 1 naming the
// damage otherwise.
#include <cstdio>

#include "cli/commands.h"
#include "cli/config_flags.h"
#include "core/status_format.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "mend/checkpoint.h"

namespace mend::cli {
namespace {

int Inspect(const std::string& path) {
  auto summary = InspectCheckpoint(path);
  if (!summary.ok()) {
    fmt::print(stderr, "mend checkpoint inspect: {}\n", summary.status().message());
    return ExitCodeOf(summary.status());  // no file, a directory: 2; a damaged one: 1
  }
  const CheckpointMeta& m = summary->meta;
  uint64_t values = 0;
  for (const auto& t : summary->tensors) values += t.bytes / sizeof(float);
  fmt::print("file          {} ({} bytes, format version {})\n", path, summary->file_bytes,
             summary->format_version);
  fmt::print("authenticated {}\n",
             summary->authenticated
                 ? "yes (HMAC-SHA256 under a key from the job token; verify needs the token)"
                 : "no (SHA-256 only: detects damage, not tampering)");
  fmt::print("job           {}\nround         {}\nstep          {}\ntokens        {}\n", m.job_id,
             m.round_id, m.step, m.tokens);
  fmt::print(
      "fragments     {}\nlearners      {} (in the round it was taken; any number can resume)\n",
      m.fragments, m.learners);
  fmt::print("written by    {} at {} ms since the epoch\n", m.written_by, m.created_unix_ms);
  fmt::print("tensors       {} ({} fp32 values)\n", summary->tensors.size(), values);
  for (const auto& t : summary->tensors)
    fmt::print("  {:<48} [{}]\n", t.name, fmt::join(t.shape, ", "));
  fmt::print("configuration:\n{}", m.config_toml);
  fmt::print("(checksums not verified; run mend checkpoint verify)\n");
  return kExitOk;
}

// An authenticated checkpoint is verified under the job token (its MAC);
// one without authentication by its SHA-256, and said to be so.
int Verify(const std::vector<std::string>& paths, const std::string& token_file) {
  Config config;
  config.token_file = token_file;
  const StatusOr<std::string> token = JobToken(config);
  int code = kExitOk;
  for (const std::string& path : paths) {
    const StatusOr<CheckpointSummary> summary = InspectCheckpoint(path);
    const bool authenticated = summary.ok() && summary->authenticated;
    if (authenticated && !token.ok()) {
      fmt::print(stderr, "{}: BAD: authenticated by a job token, and {}\n", path,
                 token.status().message());
      code = kExitFailure;
      continue;
    }
    auto checkpoint = ReadCheckpoint(path, authenticated ? *token : std::string());
    if (!checkpoint.ok()) {
      fmt::print(stderr, "{}: BAD: {}\n", path, checkpoint.status().message());
      code = kExitFailure;
      continue;
    }
    fmt::print("{}: ok (round {}, {} tensors, every checksum verified{})\n", path,
               checkpoint->meta.round_id, checkpoint->tensors.size(),
               authenticated ? ", authenticated by the job token"
                             : "; not authenticated: written without a job token");
  }
  return code;
}

}  // namespace

void AddCheckpointCommand(CLI::App& app, int* exit_code) {
  CLI::App* command = app.add_subcommand("checkpoint", "Inspect and verify checkpoint files");
  command->require_subcommand(1);
  auto inspect_path = std::make_shared<std::string>();
  CLI::App* inspect =
      command->add_subcommand("inspect", "Print what a checkpoint holds (header only)");
  inspect->add_option("file", *inspect_path, "Checkpoint file")->required();
  inspect->callback([inspect_path, exit_code]() { *exit_code = Inspect(*inspect_path); });
  auto verify_paths = std::make_shared<std::vector<std::string>>();
  auto token_file = std::make_shared<std::string>();
  CLI::App* verify = command->add_subcommand(
      "verify", "Read a checkpoint and check every checksum (and its MAC under the job token)");
  verify->add_option("files", *verify_paths, "Checkpoint files")->required();
  verify->add_option("--token-file", *token_file,
                     "A file holding the job token (else MEND_JOB_TOKEN), for authenticated ones");
  verify->callback(
      [verify_paths, token_file, exit_code]() { *exit_code = Verify(*verify_paths, *token_file); });
}

}  // namespace mend::cli
