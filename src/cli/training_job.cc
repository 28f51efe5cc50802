#include "cli/training_job.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "cli/commands.h"
#include "cli/json_fields.h"
#include "core/free_ports.h"
#include "core/status_format.h"
#include "core/subprocess.h"
#include "fmt/format.h"
#include "mend/lighthouse.h"

namespace mend::cli {
namespace {

using json = nlohmann::json;

std::string RandomToken() {
  std::random_device device;
  std::string token;
  for (int i = 0; i < 4; ++i) token += fmt::format("{:08x}", device());
  return token;
}

}  // namespace

std::string FileTail(const std::string& path, size_t bytes) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::string all = text.str();
  return all.size() > bytes ? "..." + all.substr(all.size() - bytes) : all;
}

void ReadLearnerProgress(Subprocess& child, std::mutex& mu, std::condition_variable& changed,
                         LearnerProgressView& view) {
  while (true) {
    StatusOr<std::string> line = child.ReadLine(kMicrosPerSecond);
    if (!line.ok()) {
      if (line.status().code() == absl::StatusCode::kDeadlineExceeded) continue;
      break;  // end of file: the learner exited
    }
    json parsed = json::parse(*line, nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_object() || !parsed.contains("step")) continue;
    std::lock_guard lock(mu);
    view.step = Field(parsed, "step", int64_t{0});
    view.steps = Field(parsed, "steps", int64_t{0});
    // A missing loss, and a non-finite one (null in JSON), is not finite.
    view.loss = Field(parsed, "loss", std::nan(""));
    view.nonfinite_loss |= !std::isfinite(view.loss);
    view.tokens_per_s = Field(parsed, "tokens_per_s", 0.0);
    view.bytes_sent = Field(parsed, "bytes_sent", uint64_t{0});
    view.rounds = Field(parsed, "rounds", uint64_t{0});
    if (parsed.contains("eval_loss")) {
      view.eval_loss = Field(parsed, "eval_loss", std::nan(""));
      view.nonfinite_loss |= !std::isfinite(*view.eval_loss);
    }
    changed.notify_all();
  }
  std::lock_guard lock(mu);
  view.finished = true;
  changed.notify_all();
}

std::vector<std::string> ExampleTrainArgs(const ExampleLearner& learner) {
  std::vector<std::string> args = {"--steps",
                                   std::to_string(learner.steps),
                                   "--batch",
                                   std::to_string(learner.batch),
                                   "--dim",
                                   std::to_string(learner.dim),
                                   "--layers",
                                   std::to_string(learner.layers),
                                   "--progress-every",
                                   "5"};
  if (!learner.corpus.empty()) args.insert(args.end(), {"--corpus", learner.corpus});
  return args;
}

bool GroupedJob(const TrainingJobSpec& spec) {
  return spec.ranks_per_learner > 1 && spec.mode != "ddp";
}

int JobProcesses(const TrainingJobSpec& spec) { return spec.learners * spec.ranks_per_learner; }

// Learners the lighthouse sees: the groups, or every process.
static int JobLearners(const TrainingJobSpec& spec) {
  return GroupedJob(spec) ? spec.learners : JobProcesses(spec);
}

Config JobLighthouseConfig(const TrainingJobSpec& spec, const std::string& token_file) {
  Config config;
  config.job_id = "train";
  config.bind = "127.0.0.1:0";
  config.http = spec.http;
  config.quorum_min_learners = spec.min_learners > 0 ? spec.min_learners : JobLearners(spec);
  config.grace_window_ms = spec.grace_window_ms;
  config.heartbeat_ms = spec.heartbeat_ms;
  config.heartbeat_timeout_ms = spec.heartbeat_timeout_ms;
  config.token_file = token_file;
  // The job's control plane is its lighthouse's too: learners given
  // --set control_plane=udp find a lighthouse that serves datagrams. (A bad
  // value is the learners' error to report, with the key named.)
  for (const std::string& setting : spec.settings) {
    const ConfigSources::Override set = SetFlagOverride(setting);
    if (set.key == "control_plane") (void)SetConfigValue(config, set.key, set.text, set.source);
  }
  return config;
}

Status CheckSettings(const std::vector<std::string>& settings) {
  // Split as `mend train`'s --set splits them (ConfigFlags), so that the
  // error is the one a learner would print.
  Config config;
  for (const std::string& setting : settings) {
    const ConfigSources::Override set = SetFlagOverride(setting);
    MEND_RETURN_IF_ERROR(SetConfigValue(config, set.key, set.text, set.source));
  }
  return OkStatus();
}

std::vector<std::string> LearnerArgv(const TrainingJobSpec& spec, const std::string& mend,
                                     int index, const std::string& lighthouse,
                                     const std::string& token_file,
                                     const std::string& result_file) {
  const bool grouped = GroupedJob(spec);
  const int learner = grouped ? index / spec.ranks_per_learner : index;
  std::vector<std::string> argv = {mend,
                                   "train",
                                   "--id",
                                   fmt::format("learner-{}", learner + 1),
                                   "--mode",
                                   spec.mode,
                                   "--shard",
                                   std::to_string(learner),
                                   "--shards",
                                   std::to_string(JobLearners(spec)),
                                   "--progress-json",
                                   "--result-file",
                                   result_file};
  if (grouped) {
    const std::vector<std::string> group = {"--group-size", std::to_string(spec.ranks_per_learner),
                                            "--group-rank",
                                            std::to_string(index % spec.ranks_per_learner)};
    argv.insert(argv.end(), group.begin(), group.end());
    if (static_cast<size_t>(learner) < spec.group_stores.size()) {
      argv.push_back("--set");
      argv.push_back("group_store=" + spec.group_stores[static_cast<size_t>(learner)]);
    }
  }
  if (!lighthouse.empty()) {
    const int min_learners = spec.min_learners > 0 ? spec.min_learners : JobLearners(spec);
    const std::vector<std::string> flags = {
        "--lighthouse", lighthouse, "--token-file",   token_file,
        "--job-id",     "train",    "--min-learners", std::to_string(min_learners)};
    argv.insert(argv.end(), flags.begin(), flags.end());
  }
  argv.insert(argv.end(), spec.train_args.begin(), spec.train_args.end());
  for (const std::string& setting : spec.settings) {
    argv.push_back("--set");
    argv.push_back(setting);
  }
  return argv;
}

StatusOr<std::unique_ptr<Subprocess>> SpawnLearner(std::vector<std::string> argv,
                                                   const std::string& log) {
  SubprocessOptions child;
  child.argv = std::move(argv);
  // One BLAS thread per learner from the start (no spinning pool).
  child.extra_env = {"OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1"};
  // The job's own token is in the token file its lighthouse wrote; the
  // caller's MEND_JOB_TOKEN (of another job) would override it.
  child.unset_env = {std::string(kJobTokenVariable)};
  child.stdout_to = "pipe";
  child.stderr_to = log;
  child.new_process_group = true;  // Ctrl-C reaches the caller, which stops them in order
  return Subprocess::Spawn(child);
}

StatusOr<std::unique_ptr<LighthouseServer>> StartLocalLighthouse(const Config& config) {
  {
    std::ofstream out(config.token_file);
    out << RandomToken() << "\n";
    if (!out)
      return InternalError(fmt::format("cannot write the job token to {}", config.token_file));
  }
  chmod(config.token_file.c_str(), 0600);
  MEND_ASSIGN_OR_RETURN(std::string token, ReadJobToken(config, nullptr));
  return LighthouseServer::Start(config, token, *RealClock());
}

StatusOr<std::string> MakeWorkDir(const std::string& given, std::string mkdtemp_pattern) {
  std::string dir = given;
  if (dir.empty()) {
    if (!mkdtemp(mkdtemp_pattern.data())) {
      return InternalError(fmt::format("cannot create a work directory {}: {}", mkdtemp_pattern,
                                       std::strerror(errno)));
    }
    dir = mkdtemp_pattern;
  }
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error)
    return InternalError(
        fmt::format("cannot create the work directory {}: {}", dir, error.message()));
  return dir;
}

namespace {

// A job's learner processes, by process (learner x ranks + rank).
struct LearnerProcesses {
  std::vector<std::unique_ptr<Subprocess>> children;
  std::vector<std::string> labels;  // "learner-2", or "learner-2.1" for rank 1 of a group
  std::vector<std::string> logs, result_files;
};

StatusOr<LearnerProcesses> SpawnJobLearners(const TrainingJobSpec& spec, const std::string& mend,
                                            const std::string& work_dir,
                                            const std::string& lighthouse,
                                            const std::string& token_file) {
  LearnerProcesses learners;
  for (int i = 0; i < JobProcesses(spec); ++i) {
    const std::string id = GroupedJob(spec)
                               ? fmt::format("learner-{}.{}", i / spec.ranks_per_learner + 1,
                                             i % spec.ranks_per_learner)
                               : fmt::format("learner-{}", i + 1);
    learners.labels.push_back(id);
    learners.logs.push_back(fmt::format("{}/{}.log", work_dir, id));
    learners.result_files.push_back(fmt::format("{}/{}.result.json", work_dir, id));
    std::error_code error;
    std::filesystem::remove(learners.result_files.back(), error);
    MEND_ASSIGN_OR_RETURN(auto spawned,
                          SpawnLearner(LearnerArgv(spec, mend, i, lighthouse, token_file,
                                                   learners.result_files.back()),
                                       learners.logs.back()));
    learners.children.push_back(std::move(spawned));
  }
  return learners;
}

// Until every learner finished (its progress says so), showing their
// progress; an interrupt asks them to stop (SIGTERM), and past the job's
// timeout they are killed. Whether it was.
bool AwaitLearners(const TrainingJobSpec& spec, LearnerProcesses& learners,
                   const std::function<void(const std::vector<LearnerProgressView>&)>& on_progress,
                   const std::atomic<bool>& interrupted) {
  std::mutex mu;
  std::condition_variable changed;
  std::vector<LearnerProgressView> views(learners.children.size());
  for (size_t i = 0; i < views.size(); ++i) views[i].label = learners.labels[i];
  std::vector<std::thread> readers;
  for (size_t i = 0; i < learners.children.size(); ++i) {
    readers.emplace_back(
        [&, i]() { ReadLearnerProgress(*learners.children[i], mu, changed, views[i]); });
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(spec.timeout);
  bool timed_out = false;
  {
    std::unique_lock lock(mu);
    auto all_finished = [&]() {
      return std::all_of(views.begin(), views.end(),
                         [](const auto& view) { return view.finished; });
    };
    while (!all_finished()) {
      // A redraw at least 4 times a second while the learners run.
      changed.wait_for(lock, std::chrono::milliseconds(250));
      if (on_progress) on_progress(views);
      if (interrupted.load()) {
        for (auto& child : learners.children) (void)child->Signal(SIGTERM);
      }
      if (std::chrono::steady_clock::now() > deadline) {
        timed_out = true;
        for (auto& child : learners.children) child->Kill();
      }
    }
    if (on_progress) on_progress(views);
  }
  for (auto& reader : readers) reader.join();
  return timed_out;
}

// Every learner's exit: OK when all exited 0. Every learner that failed
// refused its configuration or flags (`mend train`'s exit status 2): the
// job's bad input (INVALID_ARGUMENT), not a failure of its run (INTERNAL).
Status LearnerExits(const TrainingJobSpec& spec, LearnerProcesses& learners, bool timed_out,
                    bool interrupted) {
  std::string failures;
  bool only_bad_config = true;
  for (size_t i = 0; i < learners.children.size(); ++i) {
    StatusOr<int> status = learners.children[i]->Wait(30 * kMicrosPerSecond);
    if (!status.ok()) {
      learners.children[i]->Kill();
      status = W_EXITCODE(0, SIGKILL);
    }
    if (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
      only_bad_config =
          only_bad_config && WIFEXITED(*status) && WEXITSTATUS(*status) == kExitBadConfig;
      failures +=
          fmt::format("\n{} {} (log {}):\n{}", learners.labels[i], DescribeWaitStatus(*status),
                      learners.logs[i], FileTail(learners.logs[i], 1500));
    }
  }
  if (timed_out) {
    return DeadlineExceededError(fmt::format("{}: the job ran past its {} s limit{}", spec.name,
                                             spec.timeout / kMicrosPerSecond, failures));
  }
  if (interrupted) return AbortedError(fmt::format("{}: interrupted", spec.name));
  if (!failures.empty() && only_bad_config) {
    return InvalidArgumentError(
        fmt::format("{}: a learner refused its configuration or flags{}", spec.name, failures));
  }
  if (!failures.empty())
    return InternalError(fmt::format("{}: a learner failed{}", spec.name, failures));
  return OkStatus();
}

// The learners' result files, summed or averaged into `result`.
Status ReadLearnerResults(const TrainingJobSpec& spec, const std::vector<std::string>& files,
                          TrainingJobResult* result) {
  const int processes = JobProcesses(spec);
  result->rounds = UINT64_MAX;
  result->final_rounds = UINT64_MAX;
  for (const std::string& path : files) {
    std::ifstream in(path);
    json parsed = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_object())
      return InternalError(fmt::format("{}: no result in {}", spec.name, path));
    result->tokens_per_s += Field(parsed, "tokens_per_s", 0.0);
    result->eval_loss += Field(parsed, "eval_loss", std::nan("")) / processes;
    result->bytes_per_learner += Field(parsed, "bytes_sent", 0.0) / JobLearners(spec);
    result->bytes_per_process += Field(parsed, "bytes_sent", 0.0) / processes;
    result->tokens += Field(parsed, "tokens", uint64_t{0});
    result->inner_step_ms += Field(parsed, "inner_step_ms", 0.0) / processes;
    result->compute_fraction += Field(parsed, "compute_fraction", 0.0) / processes;
    result->reducer_step_us += Field(parsed, "reducer_step_us_median", 0.0) / processes;
    result->rounds = std::min(result->rounds, Field(parsed, "rounds", uint64_t{0}));
    result->failed_rounds += Field(parsed, "failed_rounds", uint64_t{0});
    result->final_merge_s =
        std::max(result->final_merge_s, Field(parsed, "final_merge_seconds", 0.0));
    result->final_rounds =
        std::min(result->final_rounds, Field(parsed, "final_rounds", uint64_t{0}));
    result->results.push_back(std::move(parsed));
  }
  return OkStatus();
}

}  // namespace

StatusOr<TrainingJobResult> RunTrainingJob(
    const TrainingJobSpec& given_spec, const std::string& mend, const std::string& work_dir,
    const std::function<void(const std::vector<LearnerProgressView>&)>& on_progress,
    const std::atomic<bool>& interrupted) {
  std::error_code error;
  std::filesystem::create_directories(work_dir, error);
  if (error) return InternalError(fmt::format("cannot create {}: {}", work_dir, error.message()));
  TrainingJobSpec spec = given_spec;
  if (GroupedJob(spec) && spec.group_stores.empty()) {
    MEND_ASSIGN_OR_RETURN(std::vector<int> ports, FreeLoopbackPorts(spec.learners));
    for (int port : ports) spec.group_stores.push_back(fmt::format("127.0.0.1:{}", port));
  }
  TrainingJobResult result;
  result.name = spec.name;
  result.mode = spec.mode;
  result.learners = spec.learners;
  result.processes = JobProcesses(spec);

  // The lighthouse (not needed by local training of single ranks; a
  // group's ranks meet in its store).
  const std::string token_file = work_dir + "/token";
  std::unique_ptr<LighthouseServer> server;
  if (spec.mode != "local" || GroupedJob(spec)) {
    MEND_ASSIGN_OR_RETURN(server, StartLocalLighthouse(JobLighthouseConfig(spec, token_file)));
    result.http_address = server->http_address();
  }
  MEND_ASSIGN_OR_RETURN(
      LearnerProcesses learners,
      SpawnJobLearners(spec, mend, work_dir, server ? server->grpc_address() : "", token_file));
  const auto started = std::chrono::steady_clock::now();
  const bool timed_out = AwaitLearners(spec, learners, on_progress, interrupted);
  result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const Status exits = LearnerExits(spec, learners, timed_out, interrupted.load());
  if (server) server->Shutdown();
  MEND_RETURN_IF_ERROR(exits);
  MEND_RETURN_IF_ERROR(ReadLearnerResults(spec, learners.result_files, &result));
  return result;
}

ProgressBars::ProgressBars() : tty_(isatty(STDOUT_FILENO) != 0) {}

void ProgressBars::Draw(const std::vector<LearnerProgressView>& learners) {
  constexpr int kWidth = 24;
  std::vector<std::string> lines;
  for (size_t i = 0; i < learners.size(); ++i) {
    const LearnerProgressView& v = learners[i];
    const double fraction =
        v.steps > 0 ? static_cast<double>(v.step) / static_cast<double>(v.steps) : 0.0;
    const int filled = static_cast<int>(fraction * kWidth);
    lines.push_back(fmt::format(
        "  {:<12} [{}{}] {:>3.0f}%  step {:>5}/{:<5} loss {:>6.3f}  {:>7.0f} tokens/s  rounds "
        "{:>3}  "
        "sent {:>8.3f} MB{}",
        v.label.empty() ? fmt::format("learner-{}", i + 1) : v.label,
        std::string(static_cast<size_t>(filled), '#'),
        std::string(static_cast<size_t>(kWidth - filled), '.'), 100 * fraction, v.step, v.steps,
        v.loss, v.tokens_per_s, v.rounds, static_cast<double>(v.bytes_sent) / 1e6,
        v.eval_loss ? fmt::format("  eval {:.3f}", *v.eval_loss) : ""));
  }
  if (tty_) {
    if (drawn_lines_ > 0) fmt::print("\x1b[{}F", drawn_lines_);
    for (const std::string& line : lines) fmt::print("{}\x1b[K\n", line);
    drawn_lines_ = static_cast<int>(lines.size());
  } else {
    printed_quarter_.resize(learners.size(), -1);
    for (size_t i = 0; i < learners.size(); ++i) {
      const LearnerProgressView& v = learners[i];
      const int quarter = v.steps > 0 ? static_cast<int>(4 * v.step / v.steps) : -1;
      if (quarter > printed_quarter_[i] && v.step > 0) {
        printed_quarter_[i] = quarter;
        fmt::print("{}\n", lines[i]);
      }
    }
  }
  std::fflush(stdout);
}

}  // namespace mend::cli
