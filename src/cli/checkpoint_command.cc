// mend checkpoint inspect FILE: what a checkpoint holds (header only).
// mend checkpoint verify FILE...: reads every byte and checks every checksum;
// exit 0 when all verify, 1 naming the damage otherwise.
#include <cstdio>

#include "cli/commands.h"
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

int Verify(const std::vector<std::string>& paths) {
  int code = kExitOk;
  for (const std::string& path : paths) {
    auto checkpoint = ReadCheckpoint(path);
    if (!checkpoint.ok()) {
      fmt::print(stderr, "{}: BAD: {}\n", path, checkpoint.status().message());
      code = kExitFailure;
      continue;
    }
    fmt::print("{}: ok (round {}, {} tensors, every checksum verified)\n", path,
               checkpoint->meta.round_id, checkpoint->tensors.size());
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
  CLI::App* verify =
      command->add_subcommand("verify", "Read a checkpoint and check every checksum");
  verify->add_option("files", *verify_paths, "Checkpoint files")->required();
  verify->callback([verify_paths, exit_code]() { *exit_code = Verify(*verify_paths); });
}

}  // namespace mend::cli
