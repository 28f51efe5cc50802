// mend train: one learner process training the example model (a byte-level
// GPT on the fortunes corpus) in diloco, ddp or local mode; what a user
// launches on each host, with the lighthouse address. Prints progress (human
// lines, or JSON lines with --progress-json for `mend demo` and the
// benchmarks) and writes its result as JSON with --result-file.
// SIGTERM/SIGINT stop training cleanly (the learner leaves the job; a join
// it waits on then is called off at once); SIGUSR1 writes a checkpoint of
// the global state into checkpoint_dir.
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <system_error>
#include <thread>

#include "cli/commands.h"
#include "cli/config_flags.h"
#include "cli/signals.h"
#include "core/status_format.h"
#include "fmt/format.h"
#include "mend/logging.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "train/trainer.h"

namespace mend::cli {
namespace {

struct TrainFlags {
  train::TrainOptions options;
  std::string result_file;
  bool progress_json = false;
  int threads = 1;
};

// A progress line on stdout. When stdout is gone (the harness or the pipe's
// reader exited) training goes on without progress lines: a learner must not
// die, or unwind past its round in flight, because nobody reads them.
void PrintProgress(const train::TrainProgress& p, bool json) {
  static bool stdout_gone = false;
  if (stdout_gone) return;
  try {
    if (json) {
      nlohmann::json line = {{"step", p.step},
                             {"steps", p.steps},
                             {"loss", p.loss},
                             {"tokens_per_s", p.tokens_per_s},
                             {"bytes_sent", p.bytes_sent},
                             {"rounds", p.rounds}};
      if (p.eval_loss) line["eval_loss"] = *p.eval_loss;
      fmt::print("{}\n", line.dump());
    } else {
      fmt::print("step {:>6}/{}  loss {:.4f}  {:>8.0f} tokens/s  rounds {}  sent {:.2f} MB{}\n",
                 p.step, p.steps, p.loss, p.tokens_per_s, p.rounds,
                 static_cast<double>(p.bytes_sent) / 1e6,
                 p.eval_loss ? fmt::format("  eval loss {:.4f}", *p.eval_loss) : "");
    }
    if (std::fflush(stdout) != 0)
      throw std::system_error(errno, std::generic_category(), "flushing stdout");
  } catch (const std::exception& error) {
    stdout_gone = true;
    spdlog::warn("cannot write progress to stdout ({}); training goes on without it", error.what());
  }
}

// glibc's malloc gives blocks above 128 KiB back to the kernel when they are
// freed (mmap/munmap, and trimming the heap's top beyond 128 KiB), and its
// adaptive threshold does not keep up with LibTorch's activations and
// gradients, which are freed and allocated again every step. Each new block
// is then faulted in page by page: a learner of the example GPT took about
// 20,000 page faults a second, and training went 15% faster without them
// (measured with the example GPT on the 2-vCPU VM). So a training process keeps freed memory for
// reuse (blocks up to 64 MiB from the heap, up to 256 MiB free at its top); the resident size grows
// by a few MiB. Left alone when the user tuned malloc through the environment.
void KeepFreedMemoryForReuse() {
  if (const char* tunables = std::getenv("GLIBC_TUNABLES");
      tunables && std::strstr(tunables, "glibc.malloc."))
    return;
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"}) {
    if (std::getenv(name)) return;
  }
  if (mallopt(M_MMAP_THRESHOLD, 64 << 20) != 1 || mallopt(M_TRIM_THRESHOLD, 256 << 20) != 1) {
    spdlog::warn("mend train: malloc kept its own thresholds (mallopt refused)");
  }
}

// Started by a harness (--progress-json: mend demo, mend chaos, the
// benchmarks), a learner stops when that harness is gone (killed, or a test
// that gave up on it) instead of training on as an orphan that loads the
// machine: SIGTERM (it leaves the job), and 30 s later it exits.
void StopWhenOrphaned() {
  std::thread([parent = getppid()]() {
    while (getppid() == parent) std::this_thread::sleep_for(std::chrono::seconds(1));
    spdlog::warn("mend train: the process that started it ({}) is gone; stopping", parent);
    kill(getpid(), SIGTERM);
    std::this_thread::sleep_for(std::chrono::seconds(30));
    std::_Exit(kExitFailure);
  }).detach();
}

int RunTrain(const TrainFlags& flags, const Config& config, const std::string& token) {
  KeepFreedMemoryForReuse();
  if (flags.progress_json) StopWhenOrphaned();
  train::TrainSignals control;
  SignalThread signals({SIGINT, SIGTERM, SIGUSR1}, [&control](int signal) {
    if (signal == SIGUSR1) {
      control.checkpoint.store(true);
    } else {
      control.Stop();
    }
  });
  train::SetComputeThreads(flags.threads);
  auto result = train::Train(
      flags.options, config, token, *RealClock(),
      [&flags](const train::TrainProgress& p) { PrintProgress(p, flags.progress_json); }, &control);
  if (!result.ok()) {
    fmt::print(stderr, "mend train {}: {}\n", flags.options.id, result.status().message());
    return ExitCodeOf(result.status());
  }
  if (!flags.progress_json) {
    // A stop during the last evaluation ends it early: its loss is of fewer windows.
    const std::string partial = result->eval_windows < flags.options.eval_windows
                                    ? fmt::format(" (on {} of {} windows: stopped)",
                                                  result->eval_windows, flags.options.eval_windows)
                                    : "";
    fmt::print(
        "{}: {} steps, {} tokens in {:.1f} s ({:.0f} tokens/s), eval loss {:.4f}{}, {:.2f} MB "
        "sent\n",
        flags.options.id, result->steps, result->tokens, result->seconds, result->tokens_per_s,
        result->eval_loss, partial, static_cast<double>(result->bytes_sent) / 1e6);
  }
  if (!flags.result_file.empty()) {
    std::ofstream out(flags.result_file);
    out << result->ToJson().dump(2) << "\n";
    if (!out) {
      fmt::print(stderr, "mend train {}: cannot write {}\n", flags.options.id, flags.result_file);
      return kExitFailure;
    }
  }
  return kExitOk;
}

}  // namespace

void AddTrainCommand(CLI::App& app, int* exit_code) {
  CLI::App* command = app.add_subcommand(
      "train", "One learner training the example byte-level GPT on the fortunes corpus");
  auto flags = std::make_shared<TrainFlags>();
  train::TrainOptions& o = flags->options;
  command->add_option("--id", o.id, "Learner id, unique in the job")->capture_default_str();
  command->add_option("--mode", o.mode, "diloco (the reducer), ddp (gradients every step) or local")
      ->capture_default_str()
      ->check(CLI::IsMember({"diloco", "ddp", "local"}));
  command->add_option("--corpus", o.corpus.dir, "Directory of fortune files")
      ->capture_default_str();
  command->add_option("--shard", o.corpus.shard, "This learner's shard of the training text")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  command->add_option("--shards", o.corpus.shards, "Number of shards (learners)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command->add_option("--steps", o.steps, "Inner steps")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command
      ->add_option("--start-step", o.start_step,
                   "Steps the job already did (a learner restarted into a running job)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  command->add_option("--batch", o.batch, "Sequences per inner step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command->add_option("--context", o.model.context, "Sequence length in bytes")
      ->capture_default_str();
  command->add_option("--dim", o.model.dim, "Model width")->capture_default_str();
  command->add_option("--layers", o.model.layers, "Transformer blocks")->capture_default_str();
  command->add_option("--heads", o.model.heads, "Attention heads")->capture_default_str();
  command->add_option("--lr", o.lr, "Peak inner AdamW learning rate")->capture_default_str();
  command->add_option("--warmup-steps", o.warmup_steps, "Linear warmup steps")
      ->capture_default_str();
  command->add_option("--weight-decay", o.weight_decay, "Inner AdamW weight decay")
      ->capture_default_str();
  command->add_option("--eval-windows", o.eval_windows, "Held-out windows evaluated")
      ->capture_default_str();
  command->add_option("--eval-every", o.eval_every, "Steps between evaluations (0: at the end)")
      ->capture_default_str();
  command
      ->add_option("--init-seed", o.init_seed,
                   "Seed of the initial parameters (same on all learners)")
      ->capture_default_str();
  command
      ->add_option("--data-seed", o.data_seed,
                   "Seed of the batch sampler (mixed with the shard: every learner draws its own)")
      ->capture_default_str();
  command->add_option("--progress-every", o.progress_every, "Steps between progress lines")
      ->capture_default_str();
  command
      ->add_option("--step-time-ms", o.step_time_ms,
                   "Each inner step takes at least this long (a faster one sleeps the rest, as "
                   "if an accelerator computed it; 0: as fast as the CPU goes)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{3600000}));
  command->add_option("--threads", flags->threads, "LibTorch intra-op threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  command->add_option("--result-file", flags->result_file, "Write the result as JSON here");
  command->add_flag("--progress-json", flags->progress_json, "Progress as JSON lines on stdout");
  auto config_flags = std::make_shared<ConfigFlags>(command);
  config_flags->Map("--lighthouse", "lighthouse");
  config_flags->Map("--token-file", "token_file");
  config_flags->Map("--job-id", "job_id");
  config_flags->Map("--rack", "rack");
  config_flags->Map("--group-size", "group_size");
  config_flags->Map("--group-rank", "group_rank");
  config_flags->Map("--sync-every", "sync_period_steps");
  config_flags->Map("--fragments", "fragments");
  config_flags->Map("--codec", "codec");
  config_flags->Map("--min-learners", "quorum_min_learners");
  config_flags->Map("--dataplane-host", "dataplane_host");
  config_flags->Map("--link-latency-ms", "link_latency_ms");
  config_flags->Map("--diagnostics-dir", "diagnostics_dir");
  config_flags->Map("--checkpoint-dir", "checkpoint_dir");
  config_flags->Map("--checkpoint-every-rounds", "checkpoint_every_rounds");
  config_flags->Map("--heal-inner-optimizer", "heal_inner_optimizer");
  config_flags->Map("--log-level", "log_level");
  command->callback([flags, config_flags, exit_code]() {
    auto config = config_flags->Load();
    if (!config.ok()) {
      fmt::print(stderr, "mend train: {}\n", config.status().message());
      *exit_code = kExitBadConfig;
      return;
    }
    std::string token;
    if (flags->options.mode != "local" || (*config)->group_size > 1) {
      auto job_token = JobToken(*config);
      if (!job_token.ok()) {
        fmt::print(stderr, "mend train: {}\n", job_token.status().message());
        *exit_code = kExitBadConfig;
        return;
      }
      token = *job_token;
    }
    (void)InitLogging((*config)->log_level,
                      (*config)->group_size > 1
                          ? fmt::format("{}.{}", flags->options.id, (*config)->group_rank)
                          : flags->options.id);
    if (!flags->result_file.empty()) {
      if (Status writable = CheckWritableFile(flags->result_file, "--result-file");
          !writable.ok()) {
        fmt::print(stderr, "mend train: {}\n", writable.message());
        *exit_code = kExitBadConfig;
        return;
      }
    }
    *exit_code = RunTrain(*flags, *config, token);
  });
}

}  // namespace mend::cli
