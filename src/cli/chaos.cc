#include "cli/chaos.h"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "cli/chaos_analysis.h"
#include "cli/commands.h"
#include "core/free_ports.h"
#include "core/status_format.h"
#include "fmt/format.h"
#include "mend/lighthouse.h"

namespace mend::cli {
namespace {

using json = nlohmann::json;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// One process slot (a learner, or one rank of a learner's group): the
// process now running in it, and its progress.
struct Slot {
  std::unique_ptr<Subprocess> process;
  std::thread reader;
  LearnerProgressView view;  // guarded by the harness mutex
  bool done = false;         // exited 0 after its last step
  bool down = false;         // killed (or its group broke), not restarted yet
  bool nonfinite = false;    // a non-finite loss in any of its processes
  int64_t last_step = 0;     // the step it had reached when it went down
};

// The fault being injected now.
struct Active {
  FaultRecord record;
  int64_t until_ms = 0;    // stop / slow / lighthouse: when the fault ends
  int64_t give_up_ms = 0;  // recovery is not waited for past this
  bool ended = false;      // the fault itself is over; waiting for recovery
  bool stopped = false;    // slow: inside the stopped part of the duty cycle
  int64_t next_toggle_ms = 0;
  uint64_t rounds_then = 0;  // rounds (target's, or the job's) when it ended
};

class Harness {
 public:
  Harness(const ChaosOptions& options, std::string mend, std::string dir,
          const std::function<void(const std::string&)>& say, const std::atomic<bool>& interrupted)
      : o_(options),
        mend_(std::move(mend)),
        dir_(std::move(dir)),
        say_(say),
        interrupted_(interrupted),
        random_(options.seed) {}

  StatusOr<ChaosReport> Run() {
    MEND_RETURN_IF_ERROR(Prepare());
    const int64_t started = NowMs();
    const Micros deadline = RealClock()->NowMicros() + o_.job.timeout;
    Status failure = OkStatus();
    next_fault_ms_ = started + static_cast<int64_t>(1000 * Gap());
    while (failure.ok()) {
      {
        std::unique_lock lock(mu_);
        changed_.wait_for(lock, std::chrono::milliseconds(50));
      }
      if (interrupted_.load()) {
        failure = AbortedError("chaos: interrupted");
        break;
      }
      if (RealClock()->NowMicros() > deadline) {
        failure =
            DeadlineExceededError(fmt::format("chaos: the job ran past its {} s limit{}",
                                              o_.job.timeout / kMicrosPerSecond, Unfinished()));
        break;
      }
      failure = ReapExited();
      if (!failure.ok()) break;
      if (std::all_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.done; })) break;
      failure = active_ ? Advance() : MaybeStartFault();
    }
    if (active_) {  // leave nothing stopped; the fault still counts
      if (!active_->ended && active_->record.kind != "kill") (void)EndFault();
      over_ms_.push_back(NowMs());
      report_.faults.push_back(active_->record);
      active_.reset();
    }
    for (Slot& slot : slots_) {
      if (slot.process) slot.process->Kill();
      if (slot.reader.joinable()) slot.reader.join();
    }
    if (server_) server_->Shutdown();
    if (!failure.ok()) return failure;
    report_.wall_s = static_cast<double>(NowMs() - started) / 1000;
    ChaosRun run{o_, spec_, dir_ + "/diagnostics", {}, {}, over_ms_};
    for (size_t i = 0; i < slots_.size(); ++i) {
      run.result_files.push_back(ResultFile(static_cast<int>(i)));
      run.nonfinite.push_back(slots_[i].nonfinite);
    }
    MEND_RETURN_IF_ERROR(AnalyzeChaosRun(run, &report_));
    if (o_.reference) MEND_RETURN_IF_ERROR(RunReference());
    SummarizeChaosRun(run, &report_);
    return report_;
  }

 private:
  Status Prepare() {
    if (o_.job.mode != "diloco")
      return InvalidArgumentError("chaos: the job must be in diloco mode");
    if (o_.job.learners < 2) return InvalidArgumentError("chaos: needs at least 2 learners");
    if (o_.job.ranks_per_learner < 1) {
      return InvalidArgumentError(fmt::format("chaos: --ranks-per-learner {}: must be at least 1",
                                              o_.job.ranks_per_learner));
    }
    if (o_.stop_min_s > o_.stop_max_s) {
      return InvalidArgumentError(fmt::format("chaos: --stop-min-s {} is above --stop-max-s {}",
                                              o_.stop_min_s, o_.stop_max_s));
    }
    if (o_.faults.empty()) return InvalidArgumentError("chaos: no fault kinds given");
    for (const std::string& kind : o_.faults) {
      if (kind != "kill" && kind != "stop" && kind != "slow" && kind != "lighthouse") {
        return InvalidArgumentError(fmt::format(
            "chaos: unknown fault '{}' (choose from kill, stop, slow, lighthouse)", kind));
      }
    }
    kinds_ = o_.faults;
    std::shuffle(kinds_.begin(), kinds_.end(), random_);
    spec_ = o_.job;
    spec_.train_args.insert(spec_.train_args.end(),
                            {"--step-time-ms", std::to_string(o_.step_time_ms)});
    spec_.settings.insert(
        spec_.settings.end(),
        {fmt::format("diagnostics_dir={}/diagnostics", dir_),
         fmt::format("checkpoint_dir={}/checkpoints", dir_), "checkpoint_every_rounds=2"});
    if (GroupedJob(spec_) && spec_.group_stores.empty()) {
      // Each group's own store, on the same port across the group's restarts.
      MEND_ASSIGN_OR_RETURN(std::vector<int> ports, FreeLoopbackPorts(spec_.learners));
      for (int port : ports) spec_.group_stores.push_back(fmt::format("127.0.0.1:{}", port));
    }
    std::error_code error;
    std::filesystem::remove_all(dir_ + "/diagnostics", error);
    std::filesystem::remove_all(dir_ + "/checkpoints", error);
    std::filesystem::create_directories(dir_, error);
    if (error)
      return InternalError(fmt::format("chaos: cannot create {}: {}", dir_, error.message()));

    token_file_ = dir_ + "/token";
    lighthouse_config_ = JobLighthouseConfig(spec_, token_file_);
    MEND_ASSIGN_OR_RETURN(server_, StartLocalLighthouse(lighthouse_config_));
    MEND_ASSIGN_OR_RETURN(token_, ReadJobToken(lighthouse_config_, nullptr));
    address_ = server_->grpc_address();
    lighthouse_config_.bind = address_;  // a restart comes back on the same port
    report_.stall_bound_s =
        static_cast<double>(spec_.grace_window_ms + spec_.heartbeat_timeout_ms) / 1000 +
        o_.stall_slack_s;

    slots_ = std::vector<Slot>(static_cast<size_t>(JobProcesses(spec_)));
    for (int i = 0; i < JobProcesses(spec_); ++i) MEND_RETURN_IF_ERROR(Spawn(i, 0));
    return OkStatus();
  }

  // Ranks per learner (1 for learners of one process).
  int Ranks() const { return ChaosRanks(spec_); }
  int LearnerOf(int slot) const { return slot / Ranks(); }
  Slot& SlotOf(int learner, int rank) {
    return slots_[static_cast<size_t>(learner * Ranks() + rank)];
  }
  bool LearnerDone(int learner) {
    for (int r = 0; r < Ranks(); ++r) {
      if (!SlotOf(learner, r).done) return false;
    }
    return true;
  }

  // "learner-2", or "learner-2.1" for rank 1 of a group (its log and result).
  std::string Label(int slot) const {
    return GroupedJob(spec_) ? fmt::format("learner-{}.{}", LearnerOf(slot) + 1, slot % Ranks())
                             : fmt::format("learner-{}", slot + 1);
  }
  // A fault's target: "learner-2", or "learner-2 rank 1".
  std::string Target(const FaultRecord& r) const {
    return r.rank >= 0 ? fmt::format("learner-{} rank {}", r.learner + 1, r.rank)
                       : fmt::format("learner-{}", r.learner + 1);
  }

  // The processes still training, with their step and the end of their log.
  std::string Unfinished() {
    std::string out;
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].done) continue;
      int64_t step = 0;
      {
        std::lock_guard lock(mu_);
        step = slots_[i].view.step;
      }
      const int slot = static_cast<int>(i);
      out += fmt::format("\n{} still at step {} of {}; log {}:\n{}", Label(slot), step, o_.steps,
                         Log(slot), FileTail(Log(slot), 1500));
    }
    return out;
  }

  std::string Log(int slot) const { return fmt::format("{}/{}.log", dir_, Label(slot)); }
  std::string ResultFile(int slot) const {
    return fmt::format("{}/{}.result.json", dir_, Label(slot));
  }

  Status Spawn(int slot, int64_t start_step) {
    Slot& s = slots_[static_cast<size_t>(slot)];
    std::vector<std::string> argv =
        LearnerArgv(spec_, mend_, slot, address_, token_file_, ResultFile(slot));
    if (start_step > 0) {
      argv.push_back("--start-step");
      argv.push_back(std::to_string(start_step));
    }
    MEND_ASSIGN_OR_RETURN(s.process, SpawnLearner(std::move(argv), Log(slot)));
    {
      std::lock_guard lock(mu_);
      s.view = LearnerProgressView{};
    }
    s.down = false;
    s.reader =
        std::thread([this, &s]() { ReadLearnerProgress(*s.process, mu_, changed_, s.view); });
    return OkStatus();
  }

  // SIGKILLs the process in `s`, and keeps the step it had reached.
  void KillSlot(Slot& s) {
    s.process->Kill();
    if (s.reader.joinable()) s.reader.join();
    std::lock_guard lock(mu_);
    s.nonfinite |= s.view.nonfinite_loss;
    s.last_step = s.view.step;
    s.down = true;
  }

  // Processes that exited: 0 after training is done; anything else, unless
  // the harness killed it, fails the run. One exception: the other ranks of
  // a group that lost a rank to a kill may exit with an error (their group
  // is broken) before the group is restarted.
  Status ReapExited() {
    for (size_t i = 0; i < slots_.size(); ++i) {
      Slot& s = slots_[i];
      const int slot = static_cast<int>(i);
      if (s.done || s.down || !s.process) continue;
      StatusOr<int> status = s.process->Wait(0);
      if (!status.ok()) continue;  // still running
      if (s.reader.joinable()) s.reader.join();
      {
        std::lock_guard lock(mu_);
        s.nonfinite |= s.view.nonfinite_loss;
        s.last_step = s.view.step;
      }
      if (WIFEXITED(*status) && WEXITSTATUS(*status) == 0) {
        s.done = true;
        say_(fmt::format("{} finished", Label(slot)));
        continue;
      }
      if (GroupRestartPending(LearnerOf(slot))) {
        s.down = true;
        say_(fmt::format("  {} stopped: its group lost a rank", Label(slot)));
        continue;
      }
      // `mend train` exits 2 when it refuses its configuration or flags:
      // the job's bad input (a --set, a model flag), not a fault's effect.
      const bool bad_config = WIFEXITED(*status) && WEXITSTATUS(*status) == kExitBadConfig;
      return Status(
          bad_config ? absl::StatusCode::kInvalidArgument : absl::StatusCode::kInternal,
          fmt::format("chaos: {} {} ({}); log {}:\n{}", Label(slot),
                      bad_config ? "refused its configuration or flags" : "failed on its own",
                      DescribeWaitStatus(*status), Log(slot), FileTail(Log(slot), 1500)));
    }
    return OkStatus();
  }

  // A rank of `learner`'s group was killed and the group not restarted yet.
  bool GroupRestartPending(int learner) const {
    return GroupedJob(spec_) && active_ && active_->record.kind == "kill" && !active_->ended &&
           active_->record.learner == learner;
  }

  double Gap() {
    std::exponential_distribution<double> gap(1.0 / std::max(0.1, o_.mean_gap_s));
    return std::max(o_.min_gap_s, gap(random_));
  }
  double Uniform(double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, std::max(lo, hi))(random_);
  }

  // A learner's rounds: its rank 0's (every rank takes the same rounds up).
  uint64_t RoundsOf(int learner) {
    std::lock_guard lock(mu_);
    return SlotOf(learner, 0).view.rounds;
  }
  uint64_t JobRounds() {
    uint64_t rounds = 0;
    for (int l = 0; l < spec_.learners; ++l) rounds += RoundsOf(l);
    return rounds;
  }

  Status MaybeStartFault() {
    const int64_t now = NowMs();
    if (now < next_fault_ms_) return OkStatus();
    int64_t least_step = INT64_MAX;
    {
      std::lock_guard lock(mu_);
      for (const Slot& s : slots_) {
        if (s.done || s.down) return OkStatus();
        least_step = std::min(least_step, s.view.step);
      }
    }
    if (least_step == 0) return OkStatus();  // not training yet
    if (static_cast<double>(least_step) > (1 - o_.quiet_end) * static_cast<double>(o_.steps))
      return OkStatus();

    auto active = std::make_unique<Active>();
    FaultRecord& r = active->record;
    r.kind = kinds_[fault_count_++ % kinds_.size()];
    r.start_ms = now;
    r.learner = r.kind == "lighthouse"
                    ? -1
                    : std::uniform_int_distribution<int>(0, spec_.learners - 1)(random_);
    if (r.learner >= 0 && GroupedJob(spec_))
      r.rank = std::uniform_int_distribution<int>(0, Ranks() - 1)(random_);
    Slot* target = r.learner >= 0 ? &SlotOf(r.learner, std::max(r.rank, 0)) : nullptr;
    if (target) {
      std::lock_guard lock(mu_);
      r.step = target->view.step;
    }
    if (r.kind == "kill") {
      KillSlot(*target);
      active->until_ms = now + static_cast<int64_t>(1000 * o_.restart_delay_s);
      say_(fmt::format("fault {}: SIGKILL {} at step {}", fault_count_, Target(r), r.step));
    } else if (r.kind == "stop") {
      MEND_RETURN_IF_ERROR(target->process->Signal(SIGSTOP));
      active->until_ms = now + static_cast<int64_t>(1000 * Uniform(o_.stop_min_s, o_.stop_max_s));
      say_(fmt::format("fault {}: SIGSTOP {} at step {} for {:.1f} s", fault_count_, Target(r),
                       r.step, static_cast<double>(active->until_ms - now) / 1000));
    } else if (r.kind == "slow") {
      active->until_ms = now + static_cast<int64_t>(1000 * o_.slow_s);
      active->next_toggle_ms = now;
      say_(fmt::format("fault {}: throttling {} at step {} ({:.0f}% stopped) for {:.1f} s",
                       fault_count_, Target(r), r.step, 100 * o_.slow_duty, o_.slow_s));
    } else {
      server_->Shutdown();
      server_.reset();
      active->until_ms = now + static_cast<int64_t>(1000 * o_.lighthouse_down_s);
      say_(fmt::format("fault {}: lighthouse shut down for {:.1f} s", fault_count_,
                       o_.lighthouse_down_s));
    }
    active_ = std::move(active);
    return OkStatus();
  }

  // Ends the fault itself (restart, SIGCONT, lighthouse up).
  Status EndFault() {
    Active& a = *active_;
    FaultRecord& r = a.record;
    const int64_t now = NowMs();
    if (r.kind == "kill") {
      // As torchrun does when a worker fails: the group's other ranks are
      // stopped, and every rank is started again. The learner goes on from
      // its ranks' last boundary; a checkpoint or a heal moves it to the
      // job's step.
      int64_t step = INT64_MAX;
      for (int rank = 0; rank < Ranks(); ++rank) {
        Slot& s = SlotOf(r.learner, rank);
        if (!s.down) KillSlot(s);
        step = std::min(step, s.last_step);
      }
      const int64_t h = std::max<int64_t>(1, o_.sync_period_steps);
      for (int rank = 0; rank < Ranks(); ++rank)
        MEND_RETURN_IF_ERROR(Spawn(r.learner * Ranks() + rank, step / h * h));
      say_(Ranks() > 1
               ? fmt::format("  learner-{} restarted (all {} ranks)", r.learner + 1, Ranks())
               : fmt::format("  learner-{} restarted", r.learner + 1));
    } else if (r.kind == "stop" || r.kind == "slow") {
      Slot& target = SlotOf(r.learner, std::max(r.rank, 0));
      MEND_RETURN_IF_ERROR(target.process->Signal(SIGCONT));
      if (r.kind == "stop") say_(fmt::format("  {} continued (SIGCONT)", Target(r)));
      if (r.kind == "slow") say_(fmt::format("  {} at full speed again", Target(r)));
    } else {
      StatusOr<std::unique_ptr<LighthouseServer>> server =
          LighthouseServer::Start(lighthouse_config_, token_, *RealClock());
      if (!server.ok())
        return Status(server.status().code(), "chaos: restarting the lighthouse: " +
                                                  std::string(server.status().message()));
      server_ = std::move(*server);
      say_(fmt::format("  lighthouse up again on {}", address_));
    }
    r.end_ms = now;
    a.ended = true;
    a.give_up_ms = now + 120'000;
    a.rounds_then = r.learner >= 0 ? RoundsOf(r.learner) : JobRounds();
    return OkStatus();
  }

  Status Advance() {
    Active& a = *active_;
    FaultRecord& r = a.record;
    const int64_t now = NowMs();
    if (!a.ended) {
      if (r.kind == "slow" && now < a.until_ms && now >= a.next_toggle_ms) {
        Slot& target = SlotOf(r.learner, std::max(r.rank, 0));
        constexpr int64_t kPeriodMs = 200;
        a.stopped = !a.stopped;
        MEND_RETURN_IF_ERROR(target.process->Signal(a.stopped ? SIGSTOP : SIGCONT));
        const double share = a.stopped ? o_.slow_duty : 1 - o_.slow_duty;
        a.next_toggle_ms = now + std::max<int64_t>(1, static_cast<int64_t>(share * kPeriodMs));
      }
      if (now >= a.until_ms) MEND_RETURN_IF_ERROR(EndFault());
      return OkStatus();
    }
    // Recovered: the target completed a round again (or, for the
    // lighthouse, the job did); or it finished; or we stop waiting.
    bool recovered = now >= a.give_up_ms;
    if (r.learner >= 0) {
      recovered |= RoundsOf(r.learner) > a.rounds_then || LearnerDone(r.learner);
    } else {
      recovered |= JobRounds() > a.rounds_then;
    }
    if (!recovered) return OkStatus();
    over_ms_.push_back(now);
    report_.faults.push_back(r);
    active_.reset();
    next_fault_ms_ = now + static_cast<int64_t>(1000 * Gap());
    return OkStatus();
  }

  Status RunReference() {
    say_("fault-free reference run of the same job ...");
    TrainingJobSpec reference = o_.job;
    reference.name = "fault-free reference";
    const std::string dir = dir_ + "/reference";
    reference.settings.push_back(fmt::format("diagnostics_dir={}/diagnostics", dir));
    MEND_ASSIGN_OR_RETURN(TrainingJobResult result,
                          RunTrainingJob(reference, mend_, dir, nullptr, interrupted_));
    report_.reference_eval_loss = result.eval_loss;
    report_.reference_wall_s = result.wall_s;
    return OkStatus();
  }

  const ChaosOptions& o_;
  const std::string mend_;
  const std::string dir_;
  const std::function<void(const std::string&)>& say_;
  const std::atomic<bool>& interrupted_;
  std::mt19937_64 random_;
  TrainingJobSpec spec_;
  std::vector<std::string> kinds_;
  size_t fault_count_ = 0;
  std::string token_file_, token_, address_;
  Config lighthouse_config_;
  std::unique_ptr<LighthouseServer> server_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<Slot> slots_;  // by process: learner x ranks + rank
  std::unique_ptr<Active> active_;
  int64_t next_fault_ms_ = 0;
  std::vector<int64_t> over_ms_;  // per recorded fault: when it had recovered
  ChaosReport report_;
};

}  // namespace

StatusOr<ChaosReport> RunChaos(const ChaosOptions& options, const std::string& mend,
                               const std::string& work_dir,
                               const std::function<void(const std::string&)>& say,
                               const std::atomic<bool>& interrupted) {
  Harness harness(options, mend, work_dir, say, interrupted);
  return harness.Run();
}

}  // namespace mend::cli
