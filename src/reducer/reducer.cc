#include "mend/reducer.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <cstring>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "mend/checkpoint.h"
#include "openssl/evp.h"
#include "mend/codec.h"
#include "mend/communicator.h"
#include "dataplane/lighthouse_rendezvous.h"
#include "mend/outer.h"
#include "core/round_keys.h"
#include "mend/outer_sync.h"
#include "reducer/diagnostics.h"
#include "reducer/heal_stream.h"
#include "outer/overlap_tuner.h"
#include "reducer/moments.h"
#include "spdlog/spdlog.h"
#include "torch/nn/module.h"
#include "core/status_format.h"

namespace mend {
namespace {

// One fragment: the parameters it holds (layer l -> fragment l mod P), laid
// out flat in parameter order, and its global state.
struct Fragment {
  std::vector<at::Tensor> parameters;
  std::vector<std::string> names;  // the parameters' names
  std::unique_ptr<FragmentState> state;
  uint64_t tokens_since_round = 0;
  // The job's boundary step of the last round this fragment completed: no
  // second round is launched for it (after a heal moved the step).
  uint64_t last_round_boundary = 0;
};

size_t TotalValues(const std::vector<at::Tensor>& parameters) {
  size_t n = 0;
  for (const auto& p : parameters) n += static_cast<size_t>(p.numel());
  return n;
}

void GatherParameters(const std::vector<at::Tensor>& parameters, std::span<float> out) {
  size_t offset = 0;
  for (const auto& p : parameters) {
    size_t n = static_cast<size_t>(p.numel());
    std::memcpy(out.data() + offset, p.data_ptr<float>(), n * sizeof(float));
    offset += n;
  }
}

void ScatterParameters(std::span<const float> in, std::vector<at::Tensor>& parameters) {
  size_t offset = 0;
  for (auto& p : parameters) {
    size_t n = static_cast<size_t>(p.numel());
    std::memcpy(p.data_ptr<float>(), in.data() + offset, n * sizeof(float));
    offset += n;
  }
}

// Calls a round's collective off when the lighthouse sets the round's abort
// key (a member was declared dead, or restarted, after the round formed):
// the survivors stop waiting for it at once instead of at the collective's
// deadline. One thread for the reducer's life, long-polling the key of the
// round whose communicator is watched.
class AbortWatch {
 public:
  explicit AbortWatch(LighthouseClient& client) : client_(client), thread_([this]() { Run(); }) {}
  ~AbortWatch() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }

  // Watches `key` for `comm` until Unwatch(); `comm` must stay alive until then.
  void Watch(const std::string& key, Communicator* comm) {
    {
      std::lock_guard lock(mu_);
      key_ = key;
      comm_ = comm;
      ++generation_;
    }
    changed_.notify_all();
  }
  void Unwatch() {
    std::lock_guard lock(mu_);
    comm_ = nullptr;
    ++generation_;
  }

 private:
  static constexpr auto kPoll = std::chrono::milliseconds(200);

  void Run() {
    std::unique_lock lock(mu_);
    while (!stopping_) {
      if (comm_ == nullptr) {
        changed_.wait(lock, [this]() { return stopping_ || comm_ != nullptr; });
        continue;
      }
      const std::string key = key_;
      const uint64_t generation = generation_;
      lock.unlock();
      StatusOr<std::string> why = client_.StoreGet(key, std::chrono::duration_cast<std::chrono::microseconds>(kPoll).count());
      lock.lock();
      if (generation != generation_) continue;  // that round is over
      if (why.ok()) {
        comm_->Abort(*why);
        comm_ = nullptr;
      } else if (why.status().code() != absl::StatusCode::kDeadlineExceeded) {
        // The lighthouse is unreachable (restarting): ask again a little later.
        changed_.wait_for(lock, kPoll, [&]() { return stopping_ || generation != generation_; });
      }
    }
  }

  LighthouseClient& client_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::string key_;
  Communicator* comm_ = nullptr;
  uint64_t generation_ = 0;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after the members above exist
};

// How often a learner waiting at boundary + tau looks whether the lighthouse
// reported its round closed without it.
constexpr auto kPassedOverPoll = std::chrono::milliseconds(20);

class ReducerImpl final : public Reducer {
 public:
  ReducerImpl(const Config& config, LearnerAgent& agent, FragmentSchedule schedule,
              std::unique_ptr<Codec> codec)
      : config_(config), agent_(agent), schedule_(schedule), codec_(std::move(codec)) {
    options_.outer = {static_cast<float>(config.outer_lr), static_cast<float>(config.outer_momentum)};
    options_.token_weighted = config.token_weighted_merge;
    options_.codec = codec_.get();
    options_.error_feedback_beta = static_cast<float>(config.error_feedback_beta);
  }

  // Without shutdown() (the caller is unwinding): a round in flight is called
  // off and its result dropped. The module and optimizer it would be applied
  // to may already be gone.
  ~ReducerImpl() override {
    if (in_flight_) {
      if (!in_flight_->done.load(std::memory_order_acquire)) agent_.Interrupt();
      in_flight_->thread.join();
      in_flight_.reset();
    }
    JoinCheckpointWriter();
  }

  Status Init(NamedParameters named, std::unique_ptr<InnerMoments> moments, uint64_t start_step) {
    stats_.steps = start_step;
    step_now_.store(start_step);
    abort_watch_ = std::make_unique<AbortWatch>(agent_.client());
    diagnostics_ = std::make_unique<reducer::Diagnostics>(config_.diagnostics_dir, agent_.id());
    if (named.empty()) return InvalidArgumentError("reducer: the model has no parameters");
    std::vector<at::Tensor> parameters;
    std::vector<std::string> names;
    std::vector<int64_t> numels;
    std::set<std::string> seen;
    for (auto& [name, p] : named) {
      if (!p.defined()) {
        return InvalidArgumentError(fmt::format("reducer: parameter '{}' is an undefined tensor", name));
      }
      if (p.is_sparse() || p.scalar_type() != at::kFloat || !p.device().is_cpu() || !p.is_contiguous()) {
        return InvalidArgumentError(fmt::format(
            "reducer: parameter '{}' is {} {} on {} ({}contiguous); mend needs dense, contiguous fp32 "
            "CPU parameters",
            name, p.is_sparse() ? "sparse" : "dense", c10::toString(p.scalar_type()), p.device().str(),
            p.is_contiguous() ? "" : "not "));
      }
      if (!seen.insert(name).second) {
        return InvalidArgumentError(fmt::format("reducer: two parameters are named '{}'", name));
      }
      numels.push_back(p.numel());
      parameters.push_back(std::move(p));
      names.push_back(name);
    }
    moments_source_ = std::move(moments);
    if (config_.desloc) MEND_RETURN_IF_ERROR(InitDesloc());
    if (config_.heal_inner_optimizer && !moments_source_) {
      return InvalidArgumentError(
          "heal_inner_optimizer = true: the reducer was given no inner optimizer moments (use Adam "
          "or AdamW)");
    }
    if (moments_source_) moments_.emplace(moments_source_.get(), std::move(numels));
    fragments_.resize(static_cast<size_t>(schedule_.fragments()));
    for (size_t l = 0; l < parameters.size(); ++l) {
      const at::Tensor& p = parameters[l];
      if (p.scalar_type() != at::kFloat || !p.device().is_cpu() || !p.is_contiguous()) {
        return InvalidArgumentError(fmt::format(
            "reducer: parameter {} is {} on {} ({}contiguous); mend needs contiguous fp32 CPU "
            "parameters",
            l, c10::toString(p.scalar_type()), p.device().str(), p.is_contiguous() ? "" : "not "));
      }
      Fragment& fragment =
          fragments_[static_cast<size_t>(FragmentOfLayer(static_cast<int64_t>(l), schedule_.fragments()))];
      fragment.parameters.push_back(p);
      fragment.names.push_back(names[l]);
    }
    for (Fragment& fragment : fragments_) {
      std::vector<float> initial(TotalValues(fragment.parameters));
      Gather(fragment.parameters, initial);
      fragment.state = std::make_unique<FragmentState>(initial);
    }
    if (!config_.checkpoint_dir.empty() && config_.resume) MEND_RETURN_IF_ERROR(Resume());
    return OkStatus();
  }

  // The newest checkpoint that verifies becomes the global state and the
  // local parameters; none is a fresh start.
  Status Resume() {
    CheckpointDirectory directory(config_.checkpoint_dir, static_cast<int>(config_.checkpoint_keep));
    std::vector<std::string> skipped;
    StatusOr<Checkpoint> checkpoint = directory.LoadLatest(&skipped);
    for (const std::string& why : skipped) spdlog::error("skipping a damaged checkpoint: {}", why);
    if (!checkpoint.ok()) {
      if (checkpoint.status().code() != absl::StatusCode::kNotFound) return checkpoint.status();
      spdlog::info("no checkpoint in {}: starting fresh", config_.checkpoint_dir);
      return OkStatus();
    }
    for (Fragment& fragment : fragments_) {
      std::vector<float> global, momentum;
      for (size_t i = 0; i < fragment.parameters.size(); ++i) {
        const std::string& name = fragment.names[i];
        const at::Tensor& p = fragment.parameters[i];
        for (auto [prefix, out] : {std::pair{"global/", &global}, std::pair{"outer_momentum/", &momentum}}) {
          const CheckpointTensor* t = checkpoint->Find(prefix + name);
          if (!t) {
            return InvalidArgumentError(fmt::format(
                "checkpoint of round {} in {}: no tensor '{}{}' (is it from another model?)",
                checkpoint->meta.round_id, config_.checkpoint_dir, prefix, name));
          }
          if (t->shape != p.sizes().vec()) {
            return InvalidArgumentError(fmt::format(
                "checkpoint of round {} in {}: tensor '{}{}' has shape [{}], the model's is [{}]",
                checkpoint->meta.round_id, config_.checkpoint_dir, prefix, name, fmt::join(t->shape, ", "),
                fmt::join(p.sizes().vec(), ", ")));
          }
          out->insert(out->end(), t->values.begin(), t->values.end());
        }
      }
      fragment.state->Assign(global, momentum);
      Scatter(fragment.state->global(), fragment.parameters);
    }
    last_round_id_ = checkpoint->meta.round_id;
    stats_.last_round_id = checkpoint->meta.round_id;
    stats_.steps = checkpoint->meta.step;
    step_now_.store(stats_.steps);
    stats_.resumed_from_round = checkpoint->meta.round_id;
    spdlog::info("resumed from the checkpoint of round {} (step {}, written by {})", checkpoint->meta.round_id,
                 checkpoint->meta.step, checkpoint->meta.written_by);
    return OkStatus();
  }

  // Every fragment's global state and momentum, by parameter name.
  Checkpoint Snapshot(uint64_t round_id, uint32_t members) const {
    Checkpoint checkpoint;
    checkpoint.meta.job_id = config_.job_id;
    checkpoint.meta.round_id = round_id;
    checkpoint.meta.step = stats_.steps;
    checkpoint.meta.tokens = tokens_total_;
    checkpoint.meta.fragments = schedule_.fragments();
    checkpoint.meta.learners = members;
    checkpoint.meta.written_by = agent_.id();
    checkpoint.meta.created_unix_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    checkpoint.meta.config_toml = ConfigToToml(config_);
    for (const Fragment& fragment : fragments_) {
      size_t offset = 0;
      for (size_t i = 0; i < fragment.parameters.size(); ++i) {
        const size_t n = static_cast<size_t>(fragment.parameters[i].numel());
        std::vector<int64_t> shape = fragment.parameters[i].sizes().vec();
        auto slice = [&](std::span<const float> all) {
          return std::vector<float>(all.begin() + static_cast<long>(offset),
                                    all.begin() + static_cast<long>(offset + n));
        };
        checkpoint.tensors.push_back({"global/" + fragment.names[i], shape, slice(fragment.state->global())});
        checkpoint.tensors.push_back(
            {"outer_momentum/" + fragment.names[i], shape, slice(fragment.state->momentum())});
        offset += n;
      }
    }
    return checkpoint;
  }

  Status SaveCheckpoint(const std::string& path) override {
    return WriteCheckpoint(path, Snapshot(stats_.last_round_id, 0));
  }

  // Rank 0 of a round whose id is a multiple of checkpoint_every_rounds
  // writes one, on a background thread (one write at a time).
  void MaybeCheckpoint(uint64_t round_id, uint32_t rank, uint32_t members) {
    if (config_.checkpoint_dir.empty() || config_.checkpoint_every_rounds <= 0 || rank != 0 ||
        round_id % static_cast<uint64_t>(config_.checkpoint_every_rounds) != 0) {
      return;
    }
    JoinCheckpointWriter();
    auto checkpoint = std::make_shared<Checkpoint>(Snapshot(round_id, members));
    checkpoint_writer_ = std::thread([this, checkpoint]() {
      CheckpointDirectory directory(config_.checkpoint_dir, static_cast<int>(config_.checkpoint_keep));
      StatusOr<std::string> written = directory.Save(*checkpoint);
      if (written.ok()) {
        checkpoint_writes_ok_.fetch_add(1);
        spdlog::info("checkpoint of round {} written to {}", checkpoint->meta.round_id, *written);
      } else {
        checkpoint_writes_failed_.fetch_add(1);
        spdlog::error("checkpoint of round {} not written: {}", checkpoint->meta.round_id, written.status());
      }
    });
  }

  void JoinCheckpointWriter() {
    if (checkpoint_writer_.joinable()) checkpoint_writer_.join();
  }

  Status InitDesloc() {
    const int64_t h = config_.sync_period_steps;
    const int64_t periods[2] = {
        config_.momentum_sync_period_steps > 0 ? config_.momentum_sync_period_steps : 3 * h,
        config_.second_moment_sync_period_steps > 0 ? config_.second_moment_sync_period_steps : 6 * h};
    const char* keys[2] = {"momentum_sync_period_steps", "second_moment_sync_period_steps"};
    if (config_.fragments != 1) {
      return InvalidArgumentError(fmt::format(
          "desloc = true with fragments = {}: DES-LOC runs with one fragment", config_.fragments));
    }
    for (int k = 0; k < 2; ++k) {
      if (periods[k] % h != 0) {
        return InvalidArgumentError(fmt::format(
            "{} = {}: must be a multiple of sync_period_steps = {} (moments travel with a round)",
            keys[k], periods[k], h));
      }
      desloc_rounds_[k] = static_cast<uint64_t>(periods[k] / h);
    }
    if (!moments_source_) {
      return InvalidArgumentError(
          "desloc = true: the reducer was given no inner optimizer moments (DES-LOC averages the "
          "moments of Adam or AdamW)");
    }
    return OkStatus();
  }

  Status step(uint64_t tokens) override {
    if (shut_down_) return FailedPreconditionError("reducer: step() after shutdown()");
    MEND_RETURN_IF_ERROR(agent_.fatal_status());
    auto now = std::chrono::steady_clock::now();
    Micros step_time = !stepped_ ? 0
                                         : std::chrono::duration_cast<std::chrono::microseconds>(
                                               now - last_step_)
                                               .count();
    if (stepped_) overlap_.RecordStep(std::chrono::duration<double>(now - last_return_).count());
    last_step_ = now;
    stepped_ = true;
    // The inner step's own time (from the last return) is what tau counts in.
    struct Returned {
      std::chrono::steady_clock::time_point& at;
      ~Returned() { at = std::chrono::steady_clock::now(); }
    } returned{last_return_};
    stats_.steps++;
    step_now_.store(stats_.steps, std::memory_order_relaxed);
    tokens_total_ += tokens;
    for (Fragment& fragment : fragments_) fragment.tokens_since_round += tokens;
    agent_.RecordStep(stats_.steps, tokens_total_, step_time);
    if (diagnostics_->enabled()) {
      diagnostics_->Step({{"step", stats_.steps},
                          {"tokens", tokens},
                          {"step_ms", static_cast<double>(step_time) / kMicrosPerMilli}});
    }
    // A round's result is applied as soon as it has arrived; at step
    // boundary + tau at the latest (waiting for it there), unless the round
    // for that boundary closed without this learner, or the lighthouse is
    // unreachable: then its join waits for the next round (or for the
    // lighthouse) while it trains on.
    if (InFlightDueAt(stats_.steps)) {
      const Awaited awaited = AwaitRound(*in_flight_, in_flight_->boundary_step,
                                         /*train_on_if_lost=*/config_.train_through_lighthouse_outage);
      if (awaited == Awaited::kDone) {
        FinishInFlight();
      } else if (MarkPassedOver(*in_flight_)) {
        if (awaited == Awaited::kPassedOver) {
          spdlog::info("fragment {}: the round for step {} closed without this learner; training on, its "
                       "join waits for the next round",
                       in_flight_->fragment, in_flight_->boundary_step);
        } else {
          spdlog::info("fragment {}: the lighthouse is unreachable; training on, the join for step {} "
                       "waits for it",
                       in_flight_->fragment, in_flight_->boundary_step);
        }
      }
    }
    for (int64_t f = 0; f < schedule_.fragments(); ++f) {
      if (!schedule_.StartsAt(f, static_cast<int64_t>(stats_.steps))) continue;
      if (in_flight_ && in_flight_->passed_over && StillUnformed(*in_flight_)) {
        // The join passed over at an earlier boundary still waits for a
        // round: it trains on rather than wait here too (the others may be
        // far ahead, or done). The steps since go into the next join.
        spdlog::info("fragment {}: boundary at step {} skipped; the join for step {} still waits for a round",
                     f, stats_.steps, in_flight_->boundary_step);
        continue;
      }
      FinishInFlight();
      // A heal may have moved this learner's step off the boundary, or onto
      // one whose round it just took part in.
      if (!schedule_.StartsAt(f, static_cast<int64_t>(stats_.steps)) ||
          stats_.steps <= fragments_[static_cast<size_t>(f)].last_round_boundary) {
        continue;
      }
      Launch(static_cast<int>(f));
      if (!concurrent_) FinishInFlight();  // synchronous DiLoCo: wait here
    }
    return OkStatus();
  }

  Status shutdown() override {
    if (shut_down_) return OkStatus();
    // A join still waiting once the round of the job's last boundary (the
    // last within a fragment period of this final step) closed without it
    // would wait for a round that never comes: it is called off, and the
    // steps since its boundary are not merged.
    if (in_flight_) {
      const uint64_t last_boundary = stats_.steps + 1 - std::min(stats_.steps + 1, FragmentPeriod());
      if (AwaitRound(*in_flight_, std::max(in_flight_->boundary_step, last_boundary),
                     /*train_on_if_lost=*/false) != Awaited::kDone) {
        spdlog::warn("fragment {}: the job's last round closed without this learner; its join for step {} "
                     "is called off ({} step(s) not merged)",
                     in_flight_->fragment, in_flight_->boundary_step, stats_.steps - in_flight_->boundary_step);
        MarkPassedOver(*in_flight_);
        agent_.Interrupt();
      }
    }
    FinishInFlight();
    JoinCheckpointWriter();
    shut_down_ = true;
    return agent_.Leave("training finished");
  }

  bool NextStepMayWait() const override {
    const uint64_t next = stats_.steps + 1;
    if (InFlightDueAt(next)) return true;
    for (int64_t f = 0; f < schedule_.fragments(); ++f) {
      if (schedule_.StartsAt(f, static_cast<int64_t>(next))) return true;
    }
    return false;
  }

  ReducerStats stats() const override {
    ReducerStats stats = stats_;
    stats.checkpoints = checkpoint_writes_ok_.load();
    stats.checkpoint_failures = checkpoint_writes_failed_.load();
    return stats;
  }
  std::span<const float> global(int fragment) const override {
    return fragments_[static_cast<size_t>(fragment)].state->global();
  }
  int fragments() const override { return static_cast<int>(fragments_.size()); }

 private:
  // Whether step() at `step` takes up the round in flight: it has arrived,
  // or `step` is boundary + tau and its join was not passed over (then
  // step() waits for it).
  bool InFlightDueAt(uint64_t step) const {
    return in_flight_ && (in_flight_->done.load(std::memory_order_acquire) ||
                          (step >= in_flight_->apply_at_step && !in_flight_->passed_over));
  }

  // A round in flight: what the boundary snapshot, and the background thread
  // computing the merge (the training thread does not touch the fragments'
  // global state until it is joined).
  struct Outcome {
    RoundResult result;
    std::vector<float> healed;  // every fragment's global + momentum, when this learner healed
    uint64_t round_id = 0;
    uint32_t rank = 0;
    uint32_t members = 0;
    std::vector<float> averaged_moments[2];  // DES-LOC: the members' averages, when synced
    double heal_seconds = 0;   // time in healing (every member takes part)
    uint64_t heal_bytes = 0;   // bytes this learner received when it healed
    std::string heal_source;   // whom it healed from
    uint64_t heal_step = 0;    // the source's step at its boundary (the job's step)
    // The fragment the round exchanged: this learner's own (the flight's),
    // or, for a join passed over in streaming mode that healed into another
    // fragment's round, the source's (this learner then abstained).
    int fragment = 0;
    bool fresh_join = false;   // healed with nothing of the job's state: its progress is dropped
    std::vector<float> healed_moments[2];  // heal_inner_optimizer: the source's moments
  };
  struct InFlight {
    int fragment = 0;
    uint64_t boundary_step = 0;
    uint64_t apply_at_step = 0;
    uint64_t tau = 0;  // apply_at_step - boundary_step
    uint64_t tokens = 0;
    std::chrono::steady_clock::time_point launched;
    std::chrono::steady_clock::time_point finished;  // set by the thread before `done`
    std::vector<float> base;   // the fragment's global state at the boundary
    std::vector<float> delta;  // this learner's pseudo-gradient at the boundary
    std::vector<float> moments[2];  // DES-LOC: the optimizer's moments at the boundary
    std::thread thread;
    std::atomic<bool> done{false};  // set by the thread when `outcome` is final
    StatusOr<Outcome> outcome = AbortedError("not finished");
    // Set by the thread when the lighthouse answered (under `mu`; `done`
    // is signalled on `changed`): the round formed at this learner's step
    // `formed_step`.
    std::mutex mu;
    std::condition_variable changed;
    bool formed = false;
    uint64_t formed_step = 0;
    bool passed_over = false;  // training thread only: not waited for at tau
  };

  // Waits for the round in flight (kDone); returns kPassedOver, without
  // waiting longer, once the lighthouse reports that a round for step `give_up_step` or a
  // later one closed while this learner's join had not formed a round. At
  // boundary + tau (give_up_step = the boundary) that means it was passed
  // over: its join waits for the next round while it trains on, and the
  // result is applied when it arrives. With `train_on_if_lost`, returns
  // kLighthouseLost when the join has not formed and the lighthouse is
  // unreachable (restarting): no round can form before it is back, so the
  // learner trains on likewise, and its join forms one then, with the
  // others' (they trained on as well).
  enum class Awaited { kDone, kPassedOver, kLighthouseLost };
  Awaited AwaitRound(InFlight& flight, uint64_t give_up_step, bool train_on_if_lost) {
    std::unique_lock lock(flight.mu);
    while (!flight.done.load(std::memory_order_acquire)) {
      if (concurrent_ && !flight.formed) {
        if (agent_.latest_round_step() >= give_up_step) return Awaited::kPassedOver;
        if (train_on_if_lost && agent_.lighthouse_lost()) return Awaited::kLighthouseLost;
      }
      // The lighthouse's news comes with heartbeat acknowledgements.
      flight.changed.wait_for(lock, kPassedOverPoll);
    }
    return Awaited::kDone;
  }

  // True while `flight`'s join has not formed a round (nor failed).
  static bool StillUnformed(InFlight& flight) {
    std::lock_guard lock(flight.mu);
    return !flight.done.load(std::memory_order_acquire) && !flight.formed;
  }

  // Counts `flight` as passed over; false when it already was.
  bool MarkPassedOver(InFlight& flight) {
    if (flight.passed_over) return false;
    flight.passed_over = true;
    stats_.passed_over++;
    return true;
  }

  // Steps between two rounds (of consecutive fragments).
  uint64_t FragmentPeriod() const {
    return static_cast<uint64_t>(std::max<int64_t>(1, config_.sync_period_steps / schedule_.fragments()));
  }

  // At fragment f's boundary: snapshot, and start the exchange on a
  // background thread (one round in flight at a time).
  void Launch(int f) {
    FinishInFlight();
    Fragment& fragment = fragments_[static_cast<size_t>(f)];
    auto flight = std::make_unique<InFlight>();
    flight->fragment = f;
    flight->boundary_step = stats_.steps;
    flight->launched = std::chrono::steady_clock::now();
    flight->tau = overlap_.Tau();
    flight->apply_at_step = stats_.steps + flight->tau;
    stats_.overlap_steps = flight->tau;
    flight->tokens = fragment.tokens_since_round;
    fragment.tokens_since_round = 0;
    const size_t n = fragment.state->size();
    flight->base.assign(fragment.state->global().begin(), fragment.state->global().end());
    std::vector<float> local(n);
    Gather(fragment.parameters, local);
    flight->delta.resize(n);
    PseudoGradient(flight->base, local, flight->delta);
    if (moments_) {
      for (auto which : {reducer::AdamMoments::kFirst, reducer::AdamMoments::kSecond}) {
        flight->moments[which].resize(moments_->size());
        if (!moments_->Read(which, flight->moments[which])) flight->moments[which].clear();
      }
    }
    InFlight* raw = flight.get();
    flight->thread = std::thread([this, raw]() {
      raw->outcome = Exchange(*raw);
      raw->finished = std::chrono::steady_clock::now();
      {
        std::lock_guard lock(raw->mu);
        raw->done.store(true, std::memory_order_release);
      }
      raw->changed.notify_all();
    });
    stats_.rounds_started++;
    in_flight_ = std::move(flight);
  }

  // Joins the round in flight (if any) and brings its result in:
  //   healed: every other fragment's base (and local parameters, by the same
  //           amount) becomes the source's; this fragment's base too;
  //   then theta_g' and momentum are committed and the local parameters of
  //   this fragment get the result (exact: + the progress since the boundary).
  // A failed round changes nothing: the local progress goes into the next one.
  void FinishInFlight() {
    if (!in_flight_) return;
    std::unique_ptr<InFlight> flight = std::move(in_flight_);
    flight->thread.join();
    Fragment& fragment = fragments_[static_cast<size_t>(flight->fragment)];
    if (!flight->outcome.ok()) {
      RecordRound(*flight);
      stats_.failed_rounds++;
      fragment.tokens_since_round += flight->tokens;
      spdlog::warn("fragment {}: round failed, training on: {}", flight->fragment,
                   flight->outcome.status());
      return;
    }
    Outcome& outcome = *flight->outcome;
    if (outcome.healed.empty()) {  // a heal's transfer says nothing about the next rounds
      overlap_.RecordRound(std::chrono::duration<double>(flight->finished - flight->launched).count());
    }
    // A round of another fragment than its join's (see Exchange): the
    // learner's progress stays in every fragment, and its own fragment's
    // pseudo-gradient goes into that fragment's next round.
    const bool adopted = outcome.fragment != flight->fragment;
    Fragment& exchanged = fragments_[static_cast<size_t>(outcome.fragment)];
    if (!outcome.healed.empty()) ApplyHeal(outcome.healed, adopted ? nullptr : &fragment);
    if (outcome.fresh_join) {
      // Nothing it trained is the job's: every other fragment starts from
      // the healed state too (this one gets the round's result below).
      for (Fragment& other : fragments_) {
        if (&other == &fragment && !adopted) continue;
        Scatter(other.state->global(), other.parameters);
        other.tokens_since_round = 0;
      }
    }
    stats_.bytes_sent += outcome.result.bytes_sent;
    if (adopted) {
      KeepLocalProgress(exchanged, outcome.result.global);
      outcome.result.residual.clear();  // it sent nothing: its error feedback stays
      OuterRound::Commit(*exchanged.state, std::move(outcome.result));
      if (!outcome.fresh_join) fragment.tokens_since_round += flight->tokens;
    } else {
      OuterRound::Commit(*fragment.state, std::move(outcome.result));
      if (stats_.steps == flight->boundary_step) {
        // Nothing trained since the boundary (synchronous): exactly theta_g'.
        Scatter(fragment.state->global(), fragment.parameters);
      } else {
        std::vector<float> local(fragment.state->size());
        Gather(fragment.parameters, local);
        ApplyOuterResult(local, fragment.state->global(), flight->base, flight->delta, apply_mode_,
                         static_cast<float>(config_.mixing_alpha));
        Scatter(local, fragment.parameters);
      }
    }
    for (auto which : {reducer::AdamMoments::kFirst, reducer::AdamMoments::kSecond}) {
      if (outcome.averaged_moments[which].empty() || flight->moments[which].empty()) continue;
      if (stats_.steps == flight->boundary_step) {
        moments_->Replace(which, outcome.averaged_moments[which]);
      } else {
        moments_->Adjust(which, outcome.averaged_moments[which], flight->moments[which]);
      }
      stats_.moment_syncs++;
    }
    for (auto which : {reducer::AdamMoments::kFirst, reducer::AdamMoments::kSecond}) {
      if (outcome.healed_moments[which].empty()) continue;
      if (stats_.steps == flight->boundary_step || flight->moments[which].empty()) {
        moments_->Replace(which, outcome.healed_moments[which]);
      } else {
        moments_->Adjust(which, outcome.healed_moments[which], flight->moments[which]);
      }
    }
    // A heal puts the learner on the job's step (the steps since this
    // boundary still count): always in a process's first round (a new or
    // restarted learner), and later when it fell a fragment period or more
    // behind (it was stopped or cut off); a lag of a few steps from timing
    // alone is left as it is.
    // The steps that count are those since the round formed (the source
    // was at its boundary then): a learner passed over trained on meanwhile.
    const bool far_behind = outcome.heal_step >= flight->boundary_step + FragmentPeriod();
    fragment.last_round_boundary = flight->boundary_step;
    if (adopted) exchanged.last_round_boundary = outcome.heal_step;
    if (!outcome.healed.empty() && (stats_.rounds == 0 || far_behind) &&
        outcome.heal_step != flight->boundary_step) {
      const uint64_t since = stats_.steps - std::min(stats_.steps, flight->formed_step);
      spdlog::info("healed from {}: step {} becomes the job's step {}", outcome.heal_source, stats_.steps,
                   outcome.heal_step + since);
      stats_.steps = outcome.heal_step + since;
      step_now_.store(stats_.steps, std::memory_order_relaxed);
      exchanged.last_round_boundary = outcome.heal_step;
    }
    stats_.rounds++;
    stats_.last_round_id = outcome.round_id;
    RecordRound(*flight);  // after the commit: its digest is of the new global state
    MaybeCheckpoint(outcome.round_id, outcome.rank, outcome.members);
  }

  // SHA-256 (hex) of every fragment's global parameters and momentum: equal
  // on every member after a shared round (the chaos harness compares them).
  std::string GlobalDigest() const {
    EVP_MD_CTX* context = EVP_MD_CTX_new();
    EVP_DigestInit_ex(context, EVP_sha256(), nullptr);
    for (const Fragment& fragment : fragments_) {
      EVP_DigestUpdate(context, fragment.state->global().data(), fragment.state->size() * sizeof(float));
      EVP_DigestUpdate(context, fragment.state->momentum().data(), fragment.state->size() * sizeof(float));
    }
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int length = 0;
    EVP_DigestFinal_ex(context, digest, &length);
    EVP_MD_CTX_free(context);
    std::string hex;
    for (unsigned int i = 0; i < length; ++i) hex += fmt::format("{:02x}", digest[i]);
    return hex;
  }

  void RecordRound(const InFlight& flight) {
    if (!diagnostics_->enabled()) return;
    nlohmann::json record = {
        {"fragment", flight.fragment},
        {"boundary_step", flight.boundary_step},
        {"applied_step", stats_.steps},
        {"tau", flight.tau},
        {"tokens", flight.tokens},
        {"seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - flight.launched)
                        .count()},
        {"ok", flight.outcome.ok()},
        {"passed_over", flight.passed_over}};
    if (!flight.outcome.ok()) {
      record["error"] = flight.outcome.status().ToString();
    } else {
      const Outcome& outcome = *flight.outcome;
      record["round_id"] = outcome.round_id;
      record["rank"] = outcome.rank;
      record["members"] = outcome.members;
      record["bytes_sent"] = outcome.result.bytes_sent;
      record["dropped"] = outcome.result.dropped;
      record["merged_norm"] = outcome.result.merged_norm;
      record["healed"] = !outcome.healed.empty();
      if (!outcome.healed.empty()) {
        record["heal_step"] = outcome.heal_step;
        record["fresh_join"] = outcome.fresh_join;
        record["heal_seconds"] = outcome.heal_seconds;
        record["heal_bytes"] = outcome.heal_bytes;
        record["heal_source"] = outcome.heal_source;
      }
      record["global_sha256"] = GlobalDigest();
    }
    diagnostics_->Round(std::move(record));
  }

  // The background part of a round: quorum, communicator, healing, merge.
  // Reads the fragments' global state; writes nothing the training thread reads.
  StatusOr<Outcome> Exchange(InFlight& flight) {
    MEND_ASSIGN_OR_RETURN(
        QuorumResult round,
        agent_.Quorum(last_round_id_, flight.tokens, config_.quorum_timeout_ms * kMicrosPerMilli,
                      /*include_members=*/true));
    {
      std::lock_guard lock(flight.mu);
      flight.formed = true;
      flight.formed_step = step_now_.load(std::memory_order_relaxed);
    }
    // A round formed by a lighthouse that has since restarted (this agent
    // registered again) cannot rendezvous: its keys died with it.
    const uint64_t registrations = agent_.registrations();
    CommunicatorOptions options = CommunicatorOptionsForRound(config_, round);
    LighthouseRendezvousStore store(
        agent_.client(), [this, registrations]() { return agent_.registrations() == registrations; },
        round.rendezvous_prefix + kRoundAbortKey);
    MEND_ASSIGN_OR_RETURN(auto comm, Communicator::Connect(store, options));
    abort_watch_->Watch(round.rendezvous_prefix + kRoundAbortKey, comm.get());
    struct Unwatch {
      AbortWatch& watch;
      ~Unwatch() { watch.Unwatch(); }
    } unwatch{*abort_watch_};
    Outcome outcome;
    outcome.fragment = flight.fragment;
    outcome.round_id = round.round_id;
    outcome.rank = round.rank;
    outcome.members = round.world_size;
    MEND_ASSIGN_OR_RETURN(outcome.healed, Heal(*comm, round, flight, &outcome));
    // A learner that joined with nothing of the job's state (a new or
    // restarted process, no checkpoint) trained from its own initial
    // parameters: its pseudo-gradient is not one the job can use.
    outcome.fresh_join = !outcome.healed.empty() && last_round_id_ == 0 && round.heal_round_id > 0;
    // A join passed over in streaming mode may form a round of the others'
    // next fragment (the lighthouse does not know fragments): it healed
    // (it was behind), takes part in that fragment's round without a
    // pseudo-gradient, and keeps its own fragment's progress for that
    // fragment's next round.
    const bool adopted = outcome.fragment != flight.fragment;
    OuterSyncOptions sync_options = options_;
    sync_options.contributes = !outcome.fresh_join && !adopted;
    std::span<const float> delta = flight.delta;
    std::vector<float> no_delta;
    // The merge runs on the healed base when this learner was behind.
    const FragmentState* state = fragments_[static_cast<size_t>(outcome.fragment)].state.get();
    std::unique_ptr<FragmentState> healed_state;
    if (!outcome.healed.empty()) {
      auto [global, momentum] = Slice(outcome.healed, outcome.fragment);
      healed_state = std::make_unique<FragmentState>(global);
      healed_state->Assign(global, momentum);
      state = healed_state.get();
    }
    if (adopted) {
      no_delta.assign(state->size(), 0.0f);
      delta = no_delta;
      spdlog::info("round {}: exchanges fragment {}, not this learner's fragment {} (its join was passed over); "
                   "taking part without a pseudo-gradient",
                   round.round_id, outcome.fragment, flight.fragment);
    }
    MEND_ASSIGN_OR_RETURN(outcome.result,
                          OuterRound::Exchange(*comm, *state, delta,
                                               static_cast<double>(flight.tokens), sync_options));
    MEND_RETURN_IF_ERROR(AverageMoments(*comm, round.round_id, flight, &outcome));
    last_round_id_ = round.round_id;
    return outcome;
  }

  // DES-LOC: every (K_u / H)-th round the first moments, every (K_v / H)-th
  // the second, averaged with the round's weights. The round id decides, so
  // every member of a round agrees. A learner without optimizer state yet
  // takes part with weight 0.
  Status AverageMoments(Communicator& comm, uint64_t round_id, const InFlight& flight,
                        Outcome* outcome) {
    if (!config_.desloc) return OkStatus();
    const uint64_t every[2] = {desloc_rounds_[0], desloc_rounds_[1]};
    for (auto which : {reducer::AdamMoments::kFirst, reducer::AdamMoments::kSecond}) {
      if (round_id % every[which] != 0) continue;
      std::vector<float>& average = outcome->averaged_moments[which];
      const bool have = !flight.moments[which].empty();
      average = have ? flight.moments[which] : std::vector<float>(moments_->size(), 0.0f);
      double weight = have ? (options_.token_weighted ? static_cast<double>(flight.tokens) : 1.0) : 0.0;
      MEND_RETURN_IF_ERROR(comm.WeightedAllReduce(average, weight));
    }
    return OkStatus();
  }

  // The healing buffer's layout: per fragment, its global state then its
  // momentum. Where fragment f starts (f = fragments(): the total size).
  size_t StateOffset(size_t f) const {
    size_t offset = 0;
    for (size_t g = 0; g < f; ++g) offset += 2 * fragments_[g].state->size();
    return offset;
  }

  // Fragment f's global state and momentum inside a healing buffer.
  std::pair<std::span<const float>, std::span<const float>> Slice(const std::vector<float>& buffer,
                                                                  int f) const {
    const size_t offset = StateOffset(static_cast<size_t>(f));
    const size_t size = fragments_[static_cast<size_t>(f)].state->size();
    return {std::span(buffer.data() + offset, size), std::span(buffer.data() + offset + size, size)};
  }

  // `exchanging` (the fragment whose round result follows; nullptr: none
  // of this learner's) is left to that result; every other fragment keeps
  // the learner's progress on top of the healed state.
  void ApplyHeal(const std::vector<float>& healed, const Fragment* exchanging) {
    for (size_t f = 0; f < fragments_.size(); ++f) {
      Fragment& fragment = fragments_[f];
      auto [global, momentum] = Slice(healed, static_cast<int>(f));
      if (&fragment != exchanging) KeepLocalProgress(fragment, global);
      fragment.state->Assign(global, momentum);
    }
    stats_.heals++;
  }

  // Every member takes part: for each healing source (and, on a fresh start,
  // from rank 0) the source streams every fragment's global state and
  // momentum (StreamState). Returns that buffer when this learner heals from
  // it, else nothing.
  StatusOr<std::vector<float>> Heal(Communicator& comm, const QuorumResult& round, const InFlight& flight,
                                    Outcome* outcome) const {
    std::map<std::string, int> rank_of;
    for (size_t r = 0; r < round.members.size(); ++r) rank_of[round.members[r].id] = static_cast<int>(r);
    std::map<int, std::vector<int>> healees;  // source rank -> ranks healing from it
    if (round.heal_round_id == 0) {
      for (int r = 1; r < comm.world_size(); ++r) healees[0].push_back(r);  // a fresh start
    } else {
      for (size_t r = 0; r < round.members.size(); ++r) {
        const std::string& source = round.members[r].heal_from;
        if (!source.empty() && rank_of.count(source)) healees[rank_of[source]].push_back(static_cast<int>(r));
      }
    }
    std::vector<float> mine;
    if (healees.empty()) return mine;
    const auto started = std::chrono::steady_clock::now();
    std::vector<float> buffer(StateOffset(fragments_.size()));
    for (const auto& [source, ranks] : healees) {
      if (comm.rank() == source) {
        for (size_t f = 0; f < fragments_.size(); ++f) {
          const FragmentState& state = *fragments_[f].state;
          auto out = buffer.begin() + static_cast<long>(StateOffset(f));
          out = std::copy(state.global().begin(), state.global().end(), out);
          std::copy(state.momentum().begin(), state.momentum().end(), out);
        }
      }
      const std::string& source_id = round.members[static_cast<size_t>(source)].id;
      MEND_RETURN_IF_ERROR(reducer::StreamState(comm, std::as_writable_bytes(std::span(buffer)), source, source_id));
      // The source's step at its boundary: the healed learner continues
      // the job's schedule (learning rate, fragment boundaries) from there;
      // and the fragment the source exchanges in this round.
      uint64_t boundary[2] = {flight.boundary_step, static_cast<uint64_t>(flight.fragment)};
      MEND_RETURN_IF_ERROR(comm.Broadcast(std::as_writable_bytes(std::span(boundary)), source));
      const uint64_t step = boundary[0];
      // By option the source's inner optimizer moments (as of its boundary)
      // follow, with a flag that says whether it had any yet.
      std::vector<float> moments;
      if (config_.heal_inner_optimizer) {
        const size_t m = moments_->size();
        moments.assign(2 * m + 1, 0.0f);
        if (comm.rank() == source && !flight.moments[0].empty() && !flight.moments[1].empty()) {
          std::copy(flight.moments[0].begin(), flight.moments[0].end(), moments.begin());
          std::copy(flight.moments[1].begin(), flight.moments[1].end(), moments.begin() + static_cast<long>(m));
          moments[2 * m] = 1.0f;
        }
        MEND_RETURN_IF_ERROR(reducer::StreamState(comm, std::as_writable_bytes(std::span(moments)), source, source_id));
      }
      if (std::find(ranks.begin(), ranks.end(), comm.rank()) != ranks.end()) {
        mine = buffer;
        outcome->heal_bytes = (buffer.size() + moments.size()) * sizeof(float) + sizeof(boundary);
        outcome->heal_source = source_id;
        outcome->heal_step = step;
        if (boundary[1] >= fragments_.size()) {
          return InvalidArgumentError(fmt::format("round {}: heal source {} exchanges fragment {}; this job has {}",
                                                  round.round_id, source_id, boundary[1], fragments_.size()));
        }
        outcome->fragment = static_cast<int>(boundary[1]);
        if (!moments.empty() && moments.back() == 1.0f) {
          const long m = static_cast<long>(moments_->size());
          outcome->healed_moments[0].assign(moments.begin(), moments.begin() + m);
          outcome->healed_moments[1].assign(moments.begin() + m, moments.begin() + 2 * m);
        }
      }
    }
    outcome->heal_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    return mine;
  }

  // A fragment whose base is replaced outside its own round: its local
  // parameters move by the same amount, so that what this learner trained
  // since its old base is still its pseudo-gradient, and the base change is
  // not mistaken for training (theta_i <- theta_i + new base - old base).
  // The fragment being exchanged needs none: its pseudo-gradient is taken
  // before the heal and the round replaces its local parameters.
  void KeepLocalProgress(Fragment& fragment, std::span<const float> new_base) {
    std::vector<float> local(fragment.state->size());
    Gather(fragment.parameters, local);
    std::span<const float> old_base = fragment.state->global();
    for (size_t i = 0; i < local.size(); ++i) local[i] += new_base[i] - old_base[i];
    Scatter(local, fragment.parameters);
  }

  // Every copy between the parameters' tensors and the flat fragment state
  // goes through these two; stats().parameter_copies counts them (a step
  // that neither starts nor applies a round makes none).
  void Gather(const std::vector<at::Tensor>& parameters, std::span<float> out) {
    GatherParameters(parameters, out);
    stats_.parameter_copies++;
  }
  void Scatter(std::span<const float> in, std::vector<at::Tensor>& parameters) {
    ScatterParameters(in, parameters);
    stats_.parameter_copies++;
  }

  const Config config_;
  LearnerAgent& agent_;
  const FragmentSchedule schedule_;
  const bool concurrent_ = config_.concurrent_outer_step;
  // tau: overlap_steps, or tuned from this learner's round and step times.
  outer::OverlapTuner overlap_{config_.overlap_steps,
                               static_cast<uint64_t>(std::max<int64_t>(
                                   int64_t{1}, config_.sync_period_steps / std::max<int64_t>(1, schedule_.fragments()) - 1))};
  const OuterApply apply_mode_ = config_.outer_apply == "mix" ? OuterApply::kMix : OuterApply::kExact;
  std::unique_ptr<AbortWatch> abort_watch_;  // before in_flight_: outlives its round
  std::unique_ptr<InFlight> in_flight_;
  std::unique_ptr<reducer::Diagnostics> diagnostics_;
  std::unique_ptr<InnerMoments> moments_source_;  // the inner optimizer's, or null
  std::optional<reducer::AdamMoments> moments_;   // over moments_source_, when there is one
  uint64_t desloc_rounds_[2] = {3, 6};           // rounds between K_u and K_v syncs
  // The last round this learner completed; written by the round's thread,
  // which runs alone (the next round starts only after it was joined).
  uint64_t last_round_id_ = 0;
  std::unique_ptr<Codec> codec_;
  OuterSyncOptions options_;
  std::vector<Fragment> fragments_;
  ReducerStats stats_;
  uint64_t tokens_total_ = 0;
  std::atomic<uint64_t> step_now_{0};  // stats_.steps, for the round's thread
  std::chrono::steady_clock::time_point last_step_;
  std::chrono::steady_clock::time_point last_return_;  // when step() last returned
  bool stepped_ = false;
  bool shut_down_ = false;
  std::thread checkpoint_writer_;
  std::atomic<uint64_t> checkpoint_writes_ok_{0};
  std::atomic<uint64_t> checkpoint_writes_failed_{0};
};

}  // namespace

StatusOr<std::unique_ptr<Reducer>> Reducer::Create(const Config& config, NamedParameters parameters,
                                                   std::unique_ptr<InnerMoments> moments,
                                                   LearnerAgent& agent, uint64_t start_step) {
  MEND_ASSIGN_OR_RETURN(FragmentSchedule schedule,
                        FragmentSchedule::Make(config.fragments, config.sync_period_steps));
  MEND_ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec, MakeCodec(config));
  auto reducer = std::make_unique<ReducerImpl>(config, agent, schedule, std::move(codec));
  MEND_RETURN_IF_ERROR(reducer->Init(std::move(parameters), std::move(moments), start_step));
  return std::unique_ptr<Reducer>(std::move(reducer));
}

StatusOr<std::unique_ptr<Reducer>> Reducer::Create(const Config& config, torch::nn::Module& module,
                                                   torch::optim::Optimizer& optimizer,
                                                   LearnerAgent& agent, uint64_t start_step) {
  NamedParameters named;
  std::vector<at::Tensor> parameters;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    named.emplace_back(item.key(), item.value());
    parameters.push_back(item.value());
  }
  StatusOr<std::unique_ptr<InnerMoments>> moments = TorchAdamMoments(optimizer, std::move(parameters));
  if (!moments.ok()) {  // not Adam: fine unless its moments are needed
    if (config.desloc || config.heal_inner_optimizer) {
      return InvalidArgumentError(fmt::format("{} = true: {}",
                                              config.desloc ? "desloc" : "heal_inner_optimizer",
                                              moments.status().message()));
    }
    moments = std::unique_ptr<InnerMoments>();
  }
  return Create(config, std::move(named), std::move(*moments), agent, start_step);
}

}  // namespace mend
