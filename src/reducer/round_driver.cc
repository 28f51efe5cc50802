#include "reducer/round_driver.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "core/buffer_pool.h"
#include "core/round_keys.h"
#include "core/status_format.h"
#include "dataplane/hierarchy.h"
#include "dataplane/lighthouse_rendezvous.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "mend/checkpoint.h"
#include "mend/codec.h"
#include "mend/communicator.h"
#include "mend/outer.h"
#include "mend/outer_sync.h"
#include "nlohmann/json.hpp"
#include "openssl/evp.h"
#include "outer/overlap_tuner.h"
#include "reducer/abort_watch.h"
#include "reducer/diagnostics.h"
#include "reducer/fragment_checkpoint.h"
#include "reducer/fragments.h"
#include "reducer/healing.h"
#include "reducer/learner_group.h"
#include "spdlog/spdlog.h"

namespace mend::reducer {
namespace {

// How often a learner waiting at boundary + tau looks whether the lighthouse
// reported its round closed without it.
constexpr auto kPassedOverPoll = std::chrono::milliseconds(20);

// SHA-256 of float runs, as hex (the diagnostics' state digests).
class Sha256 {
 public:
  Sha256() : context_(EVP_MD_CTX_new()) { EVP_DigestInit_ex(context_, EVP_sha256(), nullptr); }
  ~Sha256() { EVP_MD_CTX_free(context_); }
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void Update(std::span<const float> values) {
    EVP_DigestUpdate(context_, values.data(), values.size_bytes());
  }
  std::string Hex() {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int length = 0;
    EVP_DigestFinal_ex(context_, digest, &length);
    std::string hex;
    for (unsigned int i = 0; i < length; ++i) hex += fmt::format("{:02x}", digest[i]);
    return hex;
  }

 private:
  EVP_MD_CTX* context_;
};

class RoundDriverImpl final : public RoundDriver {
 public:
  // With a group, `parameters` is this rank's slice of `whole` (see
  // learner_group.h), and `agent` the group's view of the control plane.
  RoundDriverImpl(const Config& config, LearnerAgent& agent, const Clock& clock,
                  FragmentSchedule schedule, std::unique_ptr<Codec> codec,
                  std::unique_ptr<FlatParameters> parameters, std::unique_ptr<FlatMoments> moments,
                  std::unique_ptr<FlatParameters> whole = nullptr,
                  std::unique_ptr<FlatMoments> whole_moments = nullptr,
                  std::unique_ptr<LearnerGroup> group = nullptr)
      : config_(config),
        whole_(std::move(whole)),
        whole_moments_(std::move(whole_moments)),
        group_(std::move(group)),
        agent_(agent),
        clock_(clock),
        schedule_(schedule),
        parameters_(std::move(parameters)),
        moments_(std::move(moments)),
        codec_(std::move(codec)) {
    options_.outer = {static_cast<float>(config.outer_lr),
                      static_cast<float>(config.outer_momentum)};
    options_.token_weighted = config.token_weighted_merge;
    options_.codec = codec_.get();
    options_.error_feedback_beta = static_cast<float>(config.error_feedback_beta);
  }

  // Without shutdown() (the caller is unwinding): a round in flight is called
  // off and its result dropped. The module and optimizer it would be applied
  // to may already be gone.
  ~RoundDriverImpl() override {
    if (in_flight_) {
      if (!in_flight_->done.load(std::memory_order_acquire)) agent_.Interrupt();
      in_flight_->thread.join();
      in_flight_.reset();
    }
    checkpoint_writer_.Join();
  }

  Status Init(uint64_t start_step) {
    stats_.steps = start_step;
    restored_step_ = start_step;
    step_now_.store(start_step);
    abort_watch_ = std::make_unique<AbortWatch>(agent_.client());
    diagnostics_ = std::make_unique<Diagnostics>(
        config_.diagnostics_dir,
        group_ ? fmt::format("{}.rank{}", agent_.id(), group_->rank()) : agent_.id());
    if (parameters_->count() == 0)
      return InvalidArgumentError("reducer: the model has no parameters");
    if (config_.desloc) MEND_RETURN_IF_ERROR(InitDesloc());
    if (config_.heal_inner_optimizer && !moments_) {
      return InvalidArgumentError(
          "heal_inner_optimizer = true: the reducer was given no inner optimizer moments (use Adam "
          "or AdamW)");
    }
    fragments_.resize(static_cast<size_t>(schedule_.fragments()));
    for (size_t l = 0; l < parameters_->count(); ++l) {
      Fragment& fragment = fragments_[static_cast<size_t>(
          FragmentOfLayer(static_cast<int64_t>(parameters_->layer(l)), schedule_.fragments()))];
      fragment.parameters.push_back(l);
    }
    for (Fragment& fragment : fragments_) {
      size_t values = 0;
      for (size_t l : fragment.parameters) values += parameters_->numel(l);
      std::vector<float> initial(values);
      Gather(fragment, initial);
      fragment.state = std::make_unique<FragmentState>(initial);
    }
    if (!config_.resume_from.empty()) {
      MEND_RETURN_IF_ERROR(ResumeFrom(config_.resume_from));
    } else if (!config_.checkpoint_dir.empty() && config_.resume) {
      MEND_RETURN_IF_ERROR(Resume());
    }
    if (group_ && (!config_.checkpoint_dir.empty() || !config_.resume_from.empty())) {
      // Each rank resumed its slice (from the same file, shared by the
      // rack's hosts): the same checkpoint everywhere, then into every replica.
      MEND_RETURN_IF_ERROR(AgreeOnRestoredState(
          "resumed from", "they must all see the same checkpoint_dir (or resume_from file)"));
    }
    return OkStatus();
  }

  // resume_from: that file, or an error naming it.
  Status ResumeFrom(const std::string& path) {
    StatusOr<Checkpoint> checkpoint = ReadCheckpoint(path);
    if (!checkpoint.ok())
      return Annotate(checkpoint.status(), fmt::format("resume_from = \"{}\"", path));
    return ResumeWith(*checkpoint, path);
  }

  // A checkpoint (from `where`) becomes the state this learner resumes at.
  Status ResumeWith(const Checkpoint& checkpoint, const std::string& where) {
    MEND_RETURN_IF_ERROR(Restore(checkpoint, where));
    stats_.resumed_from_round = checkpoint.meta.round_id;
    spdlog::info("resumed from {}: round {} (step {}, written by {})", where,
                 checkpoint.meta.round_id, checkpoint.meta.step, checkpoint.meta.written_by);
    return OkStatus();
  }

  // An exported state as the exporting learner left it: the global state,
  // momentum and error feedback, the round, its step and tokens since each
  // fragment's round; the parameters stay the caller's (restored with the
  // model's own state).
  Status RestoreOuterState(const Checkpoint& checkpoint) {
    const CheckpointMeta& meta = checkpoint.meta;
    if (meta.learner_step == 0 || meta.tokens_since_round.size() != fragments_.size()) {
      return InvalidArgumentError(fmt::format(
          "import_state(keep_parameters): the state of round {} holds no learner's progress for {} "
          "fragment(s) (a "
          "checkpoint file, or another fragment count?); import it with its parameters instead",
          meta.round_id, fragments_.size()));
    }
    MEND_ASSIGN_OR_RETURN(auto states,
                          FragmentStates(checkpoint, *parameters_, fragments_, "(imported state)"));
    const auto residuals = FragmentResiduals(checkpoint, *parameters_, fragments_);
    for (size_t f = 0; f < fragments_.size(); ++f) {
      fragments_[f].state->Assign(states[f].first, states[f].second);
      if (!residuals[f].empty()) fragments_[f].state->AssignResidual(residuals[f]);
      fragments_[f].tokens_since_round = meta.tokens_since_round[f];
    }
    RestoredAt(meta.round_id, meta.learner_step, meta.step);
    return OkStatus();
  }

  // After a restore: the last round is `round_id`, this learner is at
  // `step`, and the global state is of `state_step` (see StateStep).
  void RestoredAt(uint64_t round_id, uint64_t step, uint64_t state_step) {
    last_round_id_ = round_id;
    stats_.last_round_id = round_id;
    stats_.steps = step;
    step_now_.store(step);
    restored_step_ = state_step;
    for (Fragment& fragment : fragments_) fragment.last_round_boundary = 0;
  }

  // A group's ranks each restored their slice: they must have restored the
  // same round; then every replica takes the restored parameters.
  Status AgreeOnRestoredState(std::string_view what, std::string_view rule) {
    MEND_ASSIGN_OR_RETURN(auto restored, group_->Compare(last_round_id_));
    if (!restored.second) {
      return FailedPreconditionError(
          fmt::format("learner '{}' group rank {}: the group's ranks {} different states (rank 0: "
                      "round {}, this rank: round {}); "
                      "{}",
                      agent_.id(), group_->rank(), what, restored.first, last_round_id_, rule));
    }
    return group_->ShareParameters();
  }

  // The newest checkpoint that verifies becomes the global state and the
  // local parameters; none is a fresh start.
  Status Resume() {
    CheckpointDirectory directory(config_.checkpoint_dir,
                                  static_cast<int>(config_.checkpoint_keep));
    std::vector<std::string> skipped;
    StatusOr<Checkpoint> checkpoint = directory.LoadLatest(&skipped);
    for (const std::string& why : skipped) spdlog::error("skipping a damaged checkpoint: {}", why);
    if (!checkpoint.ok()) {
      if (checkpoint.status().code() != absl::StatusCode::kNotFound) return checkpoint.status();
      WarnOfOtherFiles();
      return OkStatus();
    }
    return ResumeWith(*checkpoint, config_.checkpoint_dir);
  }

  // No checkpoint in checkpoint_dir: a fresh start, said louder when the
  // directory holds other files (one saved under a name of the user's?).
  void WarnOfOtherFiles() const {
    std::vector<std::string> others;
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(config_.checkpoint_dir, error)) {
      if (others.size() == 5) break;
      others.push_back(entry.path().filename().string());
    }
    if (others.empty()) {
      spdlog::info("no checkpoint in {}: starting fresh", config_.checkpoint_dir);
      return;
    }
    spdlog::warn(
        "checkpoint_dir {} holds no checkpoint named ckpt-<round, 12 digits>.mend (it has {}{}); "
        "starting "
        "fresh. To resume from a file of another name, set resume_from = PATH",
        config_.checkpoint_dir, fmt::join(others, ", "), others.size() == 5 ? ", ..." : "");
  }

  // `checkpoint` becomes every fragment's global state and momentum, the
  // local parameters, the last round and the step. `where` names it in errors.
  Status Restore(const Checkpoint& checkpoint, const std::string& where) {
    MEND_ASSIGN_OR_RETURN(auto states, FragmentStates(checkpoint, *parameters_, fragments_, where));
    for (size_t f = 0; f < fragments_.size(); ++f) {
      fragments_[f].state->Assign(states[f].first, states[f].second);
      Scatter(fragments_[f].state->global(), fragments_[f]);
    }
    RestoredAt(checkpoint.meta.round_id, checkpoint.meta.step, checkpoint.meta.step);
    return OkStatus();
  }

  // The job's step the global state is of: the boundary of the newest round
  // it includes (or the step it was started or restored at).
  uint64_t StateStep() const {
    uint64_t step = restored_step_;
    for (const Fragment& fragment : fragments_) step = std::max(step, fragment.last_round_boundary);
    return step;
  }

  // The outer state as checkpoint bytes. In a group a collective, like
  // SaveCheckpoint: rank 0 gets the whole model, the other ranks nothing.
  StatusOr<std::string> ExportState() override {
    if (shut_down_) return FailedPreconditionError("reducer: export_state() after shutdown()");
    if (!group_) {
      Checkpoint checkpoint = Snapshot(stats_.last_round_id, 0);
      AddResidualTensors(*parameters_, fragments_, &checkpoint);
      AddLearnerProgress(&checkpoint.meta);
      return EncodeCheckpoint(checkpoint);
    }
    StatusOr<std::shared_ptr<Checkpoint>> whole = GroupSnapshot(stats_.last_round_id, 0);
    if (!whole.ok()) {
      return Annotate(whole.status(),
                      "export_state: a multi-rank learner's export is collective (every rank of "
                      "the group calls it "
                      "at the same step)");
    }
    if (!*whole) return std::string();
    AddLearnerProgress(&(*whole)->meta);
    return EncodeCheckpoint(**whole);
  }

  // This learner's own step and tokens since each fragment's round.
  void AddLearnerProgress(CheckpointMeta* meta) const {
    meta->learner_step = std::max<uint64_t>(stats_.steps, 1);
    meta->tokens_since_round.clear();
    for (const Fragment& fragment : fragments_)
      meta->tokens_since_round.push_back(fragment.tokens_since_round);
  }

  Status ImportState(std::string_view bytes, bool keep_parameters) override {
    if (shut_down_) return FailedPreconditionError("reducer: import_state() after shutdown()");
    if (in_flight_) {
      return FailedPreconditionError(
          fmt::format("import_state: the round of fragment {} for step {} is in flight; import "
                      "between rounds (before the "
                      "first step, or after shutdown of the job that exported it)",
                      in_flight_->fragment, in_flight_->boundary_step));
    }
    MEND_ASSIGN_OR_RETURN(Checkpoint checkpoint, DecodeCheckpoint(bytes, "(imported state)"));
    if (keep_parameters) {
      MEND_RETURN_IF_ERROR(RestoreOuterState(checkpoint));
    } else {
      MEND_RETURN_IF_ERROR(Restore(checkpoint, "(imported state)"));
    }
    spdlog::info(
        "imported the outer state of round {} (step {}, written by {}){}", checkpoint.meta.round_id,
        checkpoint.meta.step, checkpoint.meta.written_by,
        keep_parameters ? fmt::format("; going on at its learner's step {}", stats_.steps) : "");
    if (group_) {
      MEND_RETURN_IF_ERROR(
          AgreeOnRestoredState("imported", "every rank must import the same state"));
    }
    return OkStatus();
  }

  // Every fragment's global state and momentum, by parameter name.
  Checkpoint Snapshot(uint64_t round_id, uint32_t members) const {
    Checkpoint checkpoint = Described(round_id, members);
    AddFragmentTensors(*parameters_, fragments_, &checkpoint);
    return checkpoint;
  }

  // A checkpoint's description, without tensors.
  Checkpoint Described(uint64_t round_id, uint32_t members) const {
    Checkpoint checkpoint;
    checkpoint.meta.job_id = config_.job_id;
    checkpoint.meta.round_id = round_id;
    checkpoint.meta.step = StateStep();
    checkpoint.meta.tokens = tokens_total_;
    checkpoint.meta.fragments = schedule_.fragments();
    checkpoint.meta.learners = members;
    checkpoint.meta.written_by = agent_.id();
    checkpoint.meta.created_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                          std::chrono::system_clock::now().time_since_epoch())
                                          .count();
    checkpoint.meta.config_toml = ConfigToToml(config_);
    return checkpoint;
  }

  // In a group a collective: every rank calls it at the same step (between
  // the same two step() calls), and rank 0 writes the whole model to its
  // `path`.
  Status SaveCheckpoint(const std::string& path) override {
    if (!group_) return WriteCheckpoint(path, Snapshot(stats_.last_round_id, 0));
    StatusOr<std::shared_ptr<Checkpoint>> whole = GroupSnapshot(stats_.last_round_id, 0);
    if (!whole.ok()) {
      return Annotate(whole.status(),
                      "SaveCheckpoint: a multi-rank learner's checkpoint is collective (every rank "
                      "of the group "
                      "calls it at the same step)");
    }
    return *whole ? WriteCheckpoint(path, **whole) : OkStatus();
  }

  // Rank 0 of a round whose id is a multiple of checkpoint_every_rounds
  // (or `always`: the final merge's last round) writes one, on a background
  // thread (one write at a time). In a group
  // every rank of that learner gathers the slices and its rank 0 writes the
  // whole model, by parameter name: one file, which any group size and
  // fragment count reads.
  Status MaybeCheckpoint(uint64_t round_id, uint32_t rank, uint32_t members, bool always = false) {
    if (config_.checkpoint_dir.empty() || config_.checkpoint_every_rounds <= 0 || rank != 0 ||
        (!always && round_id % static_cast<uint64_t>(config_.checkpoint_every_rounds) != 0)) {
      return OkStatus();
    }
    if (!group_) {
      checkpoint_writer_.Write(std::make_shared<const Checkpoint>(Snapshot(round_id, members)));
      return OkStatus();
    }
    MEND_ASSIGN_OR_RETURN(std::shared_ptr<Checkpoint> whole, GroupSnapshot(round_id, members));
    if (whole) checkpoint_writer_.Write(std::move(whole));
    return OkStatus();
  }

  // A group's checkpoint, a collective of its ranks: each puts its
  // fragments' pieces back in slice order, the slices are gathered, and
  // rank 0 gets the whole model as one fragment of its parameters, by
  // parameter name (null on the other ranks). A failed gather breaks the
  // group.
  StatusOr<std::shared_ptr<Checkpoint>> GroupSnapshot(uint64_t round_id, uint32_t members) {
    // This rank's slice of the global state and momentum, its pieces in
    // order (each fragment holds some of them), then all the slices.
    std::vector<size_t> at(parameters_->count() + 1, 0);
    for (size_t i = 0; i < parameters_->count(); ++i) at[i + 1] = at[i] + parameters_->numel(i);
    std::vector<float> slice_global(at.back()), slice_momentum(at.back());
    for (const Fragment& fragment : fragments_) {
      ForEachPiece(fragment, [&](size_t i, size_t from, size_t n) {
        std::copy_n(fragment.state->global().begin() + static_cast<long>(from), n,
                    slice_global.begin() + static_cast<long>(at[i]));
        std::copy_n(fragment.state->momentum().begin() + static_cast<long>(from), n,
                    slice_momentum.begin() + static_cast<long>(at[i]));
      });
    }
    std::vector<float> global(group_->total()), momentum(group_->total());
    for (auto [slice, whole] :
         {std::pair{std::span<const float>(slice_global), std::span<float>(global)},
          std::pair{std::span<const float>(slice_momentum), std::span<float>(momentum)}}) {
      if (Status gathered = group_->GatherWhole(slice, whole); !gathered.ok())
        return BreakGroup(gathered);
    }
    if (group_->rank() != 0) return std::shared_ptr<Checkpoint>();
    std::vector<Fragment> whole_model(1);
    for (size_t i = 0; i < whole_->count(); ++i) whole_model[0].parameters.push_back(i);
    whole_model[0].state = std::make_unique<FragmentState>(global);
    whole_model[0].state->Assign(global, momentum);
    auto checkpoint = std::make_shared<Checkpoint>(Described(round_id, members));
    AddFragmentTensors(*whole_, whole_model, checkpoint.get());
    return checkpoint;
  }

  Status InitDesloc() {
    const int64_t h = config_.sync_period_steps;
    const int64_t periods[2] = {
        config_.momentum_sync_period_steps > 0 ? config_.momentum_sync_period_steps : 3 * h,
        config_.second_moment_sync_period_steps > 0 ? config_.second_moment_sync_period_steps
                                                    : 6 * h};
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
    if (!moments_) {
      return InvalidArgumentError(
          "desloc = true: the reducer was given no inner optimizer moments (DES-LOC averages the "
          "moments of Adam or AdamW)");
    }
    return OkStatus();
  }

  Status step(uint64_t tokens) override {
    if (shut_down_) return FailedPreconditionError("reducer: step() after shutdown()");
    MEND_RETURN_IF_ERROR(group_broken_);
    MEND_RETURN_IF_ERROR(agent_.fatal_status());
    // A group's ranks each pass their own tokens; the group trained R times
    // as many (DDP: the same batch size on every rank).
    if (group_) tokens *= static_cast<uint64_t>(group_->size());
    const Micros now = clock_.NowMicros();
    const Micros step_time = !stepped_ ? 0 : now - last_step_;
    if (stepped_) overlap_.RecordStep(static_cast<double>(now - last_return_) / kMicrosPerSecond);
    last_step_ = now;
    stepped_ = true;
    stats_.steps++;
    step_now_.store(stats_.steps, std::memory_order_relaxed);
    tokens_total_ += tokens;
    for (Fragment& fragment : fragments_) fragment.tokens_since_round += tokens;
    if (group_ && step_time > 0) {
      rank_step_sum_ += step_time;
      rank_steps_++;
    }
    // A group reports its slowest rank's step time (known as of the last
    // round), so that a slow rank makes its group fail-slow even where
    // nothing inside the group waits for it.
    agent_.RecordStep(stats_.steps, tokens_total_,
                      group_ ? std::max(step_time, slowest_rank_step_) : step_time);
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
      StatusOr<Awaited> agreed =
          AwaitRoundAgreed(*in_flight_, in_flight_->boundary_step,
                           /*train_on_if_lost=*/config_.train_through_lighthouse_outage);
      if (!agreed.ok()) return BreakGroup(agreed.status());
      const Awaited awaited = *agreed;
      if (awaited == Awaited::kDone) {
        MEND_RETURN_IF_ERROR(FinishInFlight());
      } else if (MarkPassedOver(*in_flight_)) {
        if (awaited == Awaited::kPassedOver) {
          spdlog::info(
              "fragment {}: the round for step {} closed without this learner; training on, its "
              "join waits for the next round",
              in_flight_->fragment, in_flight_->boundary_step);
        } else if (awaited == Awaited::kShortOfQuorum) {
          spdlog::info(
              "fragment {}: fewer learners are alive than the quorum's minimum; training on, the "
              "join for step {} waits for them",
              in_flight_->fragment, in_flight_->boundary_step);
        } else {
          spdlog::info(
              "fragment {}: the lighthouse is unreachable; training on, the join for step {} "
              "waits for it",
              in_flight_->fragment, in_flight_->boundary_step);
        }
      }
    }
    // A group's join passed over: its ranks agree at every step whether all
    // slices of its round have arrived (then all apply it now), and whether
    // rank 0's join formed a round yet (a boundary meanwhile is skipped).
    bool group_join_waits = false;
    if (group_ && in_flight_ && in_flight_->passed_over) {
      StatusOr<std::pair<bool, bool>> state = group_->AllArrived(
          in_flight_->done.load(std::memory_order_acquire), !StillUnformed(*in_flight_));
      if (!state.ok()) return BreakGroup(state.status());
      if (state->first) {
        MEND_RETURN_IF_ERROR(FinishInFlight());
      } else {
        group_join_waits = !state->second;
      }
    }
    for (int64_t f = 0; f < schedule_.fragments(); ++f) {
      if (!schedule_.StartsAt(f, static_cast<int64_t>(stats_.steps))) continue;
      if (InFinalPeriod(stats_.steps)) {
        spdlog::info(
            "fragment {}: no round at step {}: it could not be taken up before the job's last step "
            "{}",
            f, stats_.steps, config_.total_steps);
        continue;
      }
      if (in_flight_ && in_flight_->passed_over &&
          (group_ ? group_join_waits : StillUnformed(*in_flight_))) {
        // The join passed over at an earlier boundary still waits for a
        // round: it trains on rather than wait here too (the others may be
        // far ahead, or done). The steps since go into the next join.
        spdlog::info(
            "fragment {}: boundary at step {} skipped; the join for step {} still waits for a "
            "round",
            f, stats_.steps, in_flight_->boundary_step);
        continue;
      }
      MEND_RETURN_IF_ERROR(FinishInFlight());
      // A heal may have moved this learner's step off the boundary, or onto
      // one whose round it just took part in.
      if (!schedule_.StartsAt(f, static_cast<int64_t>(stats_.steps)) ||
          stats_.steps <= fragments_[static_cast<size_t>(f)].last_round_boundary) {
        continue;
      }
      MEND_RETURN_IF_ERROR(Launch(static_cast<int>(f)));
      if (!concurrent_) MEND_RETURN_IF_ERROR(FinishInFlight());  // synchronous DiLoCo: wait here
    }
    // The inner step's own time (from here to the next call) is what tau counts in.
    last_return_ = clock_.NowMicros();
    planned_step_ = 0;
    return OkStatus();
  }

  Status shutdown() override {
    if (shut_down_) return OkStatus();
    if (!group_broken_.ok()) {
      // A rank of this group is gone: no collective of the group can
      // complete, so the round in flight is called off, not waited for.
      if (in_flight_) {
        agent_.Interrupt();
        in_flight_->thread.join();
        in_flight_.reset();
      }
      shut_down_ = true;
      if (group_) group_->StopPulse(/*done=*/false);
      (void)agent_.Leave(std::string(group_broken_.message()));
      return group_broken_;
    }
    // A join still waiting once the round of the job's last boundary (the
    // last within a fragment period of this final step) closed without it
    // would wait for a round that never comes: it is called off, and the
    // steps since its boundary are not merged, nor is there a final merge
    // for it (the others have merged, or will without it). So is one that
    // is short of a quorum: the others have left (their joins and this one's
    // were not paired up alike), and none may ever come back.
    bool called_off = false;
    if (in_flight_) {
      // (None was launched in the job's last fragment period, when known.)
      const auto total = static_cast<uint64_t>(config_.total_steps);
      const uint64_t end =
          !InFinalPeriod(stats_.steps) ? stats_.steps : total - std::min(total, FragmentPeriod());
      const uint64_t last_boundary = end + 1 - std::min(end + 1, FragmentPeriod());
      StatusOr<Awaited> awaited =
          AwaitRoundAgreed(*in_flight_, std::max(in_flight_->boundary_step, last_boundary),
                           /*train_on_if_lost=*/false);
      if (!awaited.ok()) {
        (void)BreakGroup(awaited.status());
        return shutdown();  // as a broken group
      }
      if (*awaited != Awaited::kDone) {
        spdlog::warn("fragment {}: {}; its join for step {} is called off ({} step(s) not merged)",
                     in_flight_->fragment,
                     *awaited == Awaited::kShortOfQuorum
                         ? "too few learners are left to form its round"
                         : "the job's last round closed without this learner",
                     in_flight_->boundary_step, stats_.steps - in_flight_->boundary_step);
        CallOff(*in_flight_);
        called_off = true;
      }
    }
    Status finished = FinishInFlight();
    if (finished.ok() && group_broken_.ok() && !called_off) finished = FinalMerge();
    if (!group_broken_.ok()) return shutdown();  // as a broken group
    checkpoint_writer_.Join();
    shut_down_ = true;
    if (group_) group_->StopPulse(/*done=*/true);
    Status left = agent_.Leave("training finished");
    if (group_) group_->Forget();
    MEND_RETURN_IF_ERROR(finished);
    return left;
  }

  bool NextStepMayWait() const override {
    const uint64_t next = stats_.steps + 1;
    return InFlightDueAt(next) || LaunchesAt(next);
  }

  StepPlan PlanStep() override {
    const uint64_t next = stats_.steps + 1;
    planned_step_ = next;
    planned_arrival_ = in_flight_ && in_flight_->done.load(std::memory_order_acquire);
    StepPlan plan;
    plan.may_wait = NextStepMayWait();
    // A group's join passed over is looked at (and maybe applied) at every step.
    plan.touches_parameters = plan.may_wait || (group_ && in_flight_ && in_flight_->passed_over);
    return plan;
  }

  ReducerStats stats() const override {
    ReducerStats stats = stats_;
    stats.checkpoints = checkpoint_writer_.written();
    stats.checkpoint_failures = checkpoint_writer_.failed();
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
  // In a group only the second: every rank applies at the same step (a join
  // passed over is applied once every rank's slice arrived, which the ranks
  // agree on at every step).
  bool InFlightDueAt(uint64_t step) const {
    if (group_) return in_flight_ && step >= in_flight_->apply_at_step && !in_flight_->passed_over;
    return in_flight_ &&
           (Arrived(step) || (step >= in_flight_->apply_at_step && !in_flight_->passed_over));
  }

  // Whether the round in flight has arrived, as the step at `step` sees it:
  // as PlanStep found it for that step (so that a front end that staged the
  // parameters for the step's plan is not overtaken by a late arrival), else now.
  bool Arrived(uint64_t step) const {
    if (!in_flight_) return false;
    if (planned_step_ == step) return planned_arrival_;
    return in_flight_->done.load(std::memory_order_acquire);
  }

  // Whether a fragment's round is launched at `step`.
  bool LaunchesAt(uint64_t step) const {
    for (int64_t f = 0; f < schedule_.fragments(); ++f) {
      if (schedule_.StartsAt(f, static_cast<int64_t>(step)) && !InFinalPeriod(step)) return true;
    }
    return false;
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
    double heal_seconds = 0;                 // time in healing (every member takes part)
    uint64_t heal_bytes = 0;                 // bytes this learner received when it healed
    std::string heal_source;                 // whom it healed from
    uint64_t heal_step = 0;                  // the source's step at its boundary (the job's step)
    // The fragment the round exchanged: this learner's own (the flight's),
    // or, for a join passed over in streaming mode that healed into another
    // fragment's round, the source's (this learner then abstained).
    int fragment = 0;
    bool fresh_join = false;    // healed with nothing of the job's state: its progress is dropped
    bool outer_warmup = false;  // an outer warm-up round: averaged, momentum untouched
    bool final_merge = false;   // the job's final merge: averaged (fp32), momentum untouched
    std::vector<float> healed_moments[2];  // heal_inner_optimizer: the source's moments
    std::vector<float>
        synced_buffers[2];          // sync_buffers: the members' averages; the first member's
    uint64_t cross_rack_bytes = 0;  // sent to other racks in this round (healing included)
  };
  struct InFlight {
    int fragment = 0;
    uint64_t boundary_step = 0;
    uint64_t apply_at_step = 0;
    uint64_t tokens = 0;
    uint64_t previous_round_id = 0;  // last_round_id_ at launch
    Micros launched = 0;
    Micros finished = 0;            // set by the thread before `done`
    std::vector<float> base;        // the fragment's global state at the boundary
    std::vector<float> delta;       // this learner's pseudo-gradient at the boundary
    std::vector<float> moments[2];  // DES-LOC: the optimizer's moments at the boundary
    std::vector<float> buffers[2];  // sync_buffers: the model's buffers at the boundary
    std::thread thread;
    std::atomic<bool> done{false};  // set by the thread when `outcome` is final
    ~InFlight() {
      GiveBack(std::move(base));
      GiveBack(std::move(delta));
    }
    StatusOr<Outcome> outcome = AbortedError("not finished");
    // Set by the thread when the lighthouse answered (under `mu`; `done`
    // is signalled on `changed`): the round formed at this learner's step
    // `formed_step`.
    std::mutex mu;
    std::condition_variable changed;
    bool formed = false;
    uint64_t formed_step = 0;
    bool passed_over = false;  // training thread only: not waited for at tau
    bool final_merge = false;  // launched at shutdown after the job's last step
    bool checkpoint = false;   // write a checkpoint after it, whatever checkpoint_every_rounds says
    bool called_off = false;   // at shutdown: its join was interrupted on purpose
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
  // Likewise kShortOfQuorum, when the lighthouse reports that fewer
  // learners are alive than the quorum's minimum (the others left or died):
  // the join cannot form a round until some come back; at the end of the job
  // it is called off (a learner alone cannot wait for the others' return).
  // Only a concurrent learner is passed over this way, and a final merge's.
  enum class Awaited { kDone, kPassedOver, kLighthouseLost, kShortOfQuorum };
  Awaited AwaitRound(InFlight& flight, uint64_t give_up_step, bool train_on_if_lost) {
    std::unique_lock lock(flight.mu);
    while (!flight.done.load(std::memory_order_acquire)) {
      // A group's ranks cannot each decide this on their own timing: rank 0
      // decides for them (AwaitRoundAgreed).
      if (MayBePassedOver(flight) && !flight.formed && !group_) {
        if (std::optional<Awaited> why = TrainOnBecause(flight, give_up_step, train_on_if_lost))
          return *why;
      }
      // The lighthouse's news comes with heartbeat acknowledgements.
      flight.changed.wait_for(lock, kPassedOverPoll);
    }
    return Awaited::kDone;
  }

  // AwaitRound, for a group: rank 0 applies the rule above and every rank
  // follows it at this same step (kDone: take the round up now, or all
  // train on). The ranks meet every kPassedOverPoll while rank 0 has not
  // decided, and FinishInFlight has them wait for their slices the same
  // way, so no group collective waits on a rank that waits for its slice.
  StatusOr<Awaited> AwaitRoundAgreed(InFlight& flight, uint64_t give_up_step,
                                     bool train_on_if_lost) {
    if (!group_ || !MayBePassedOver(flight))
      return AwaitRound(flight, give_up_step, train_on_if_lost);
    // Rank 0's verdict: 0 while undecided, else 1 + the Awaited value
    // (kDone: FinishInFlight waits for every slice, the ranks together).
    constexpr uint64_t kUndecided = 0;
    while (true) {
      uint64_t verdict = kUndecided;
      if (group_->rank() == 0) {
        std::optional<Awaited> decided;
        if (PollDone(flight) || !StillUnformed(flight)) {
          decided = Awaited::kDone;
        } else {
          decided = TrainOnBecause(flight, give_up_step, train_on_if_lost);
        }
        if (decided) verdict = 1 + static_cast<uint64_t>(*decided);
      }
      MEND_ASSIGN_OR_RETURN(auto rank0, group_->Compare(verdict));
      if (rank0.first == kUndecided) continue;
      if (rank0.first - 1 > static_cast<uint64_t>(Awaited::kShortOfQuorum))
        return InternalError(
            fmt::format("group: rank 0's round verdict {} is unknown", rank0.first));
      return static_cast<Awaited>(rank0.first - 1);
    }
  }

  // Why a learner whose join in `flight` has not formed a round trains on
  // at step `give_up_step` instead of waiting (see AwaitRound); nullopt:
  // it waits.
  std::optional<Awaited> TrainOnBecause(const InFlight& flight, uint64_t give_up_step,
                                        bool train_on_if_lost) const {
    if (ClosedWithout(flight, give_up_step)) return Awaited::kPassedOver;
    if (train_on_if_lost && agent_.lighthouse_lost()) return Awaited::kLighthouseLost;
    if (agent_.short_of_quorum()) return Awaited::kShortOfQuorum;
    return std::nullopt;
  }

  bool MayBePassedOver(const InFlight& flight) const { return concurrent_ || flight.final_merge; }

  // Whether the lighthouse reported a round of step `step` or later that is
  // newer than this learner's last round when `flight` was launched (its
  // join, unformed, was not in it). The id matters for a final merge's
  // second fragment: the first one's round is of the same step.
  bool ClosedWithout(const InFlight& flight, uint64_t step) const {
    return agent_.latest_round_step() >= step &&
           agent_.latest_round_id() > flight.previous_round_id;
  }

  // Waits up to kPassedOverPoll for `flight` to end; whether it has.
  static bool PollDone(InFlight& flight) {
    std::unique_lock lock(flight.mu);
    return flight.changed.wait_for(lock, kPassedOverPoll,
                                   [&]() { return flight.done.load(std::memory_order_acquire); });
  }

  // True while `flight`'s join has not formed a round (nor failed).
  static bool StillUnformed(InFlight& flight) {
    std::lock_guard lock(flight.mu);
    return !flight.done.load(std::memory_order_acquire) && !flight.formed;
  }

  // At shutdown: gives up `flight`'s join (counted as passed over, not as a
  // failed round) and interrupts it.
  void CallOff(InFlight& flight) {
    MarkPassedOver(flight);
    flight.called_off = true;
    agent_.Interrupt();
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
    return static_cast<uint64_t>(
        std::max<int64_t>(1, config_.sync_period_steps / schedule_.fragments()));
  }

  // Whether a round of (the lighthouse's) step `step` that exchanges
  // `fragment` is the job's final merge: total_steps known and reached, and
  // not the fragment's own boundary round there (synchronous mode launches
  // that one; concurrent mode none in the last fragment period). Every
  // member decides alike, from the round and the job's configuration.
  bool IsFinalMerge(uint64_t step, int fragment) const {
    const uint64_t total = FinalMergeStep();
    return total > 0 && step >= total &&
           (concurrent_ || !schedule_.StartsAt(fragment, static_cast<int64_t>(total)));
  }

  // The step of the job's final merge: total_steps with final_merge on; 0: none.
  uint64_t FinalMergeStep() const {
    return config_.final_merge && config_.total_steps > 0
               ? static_cast<uint64_t>(config_.total_steps)
               : 0;
  }

  // The final merge (final_merge, at shutdown after the job's last step):
  // one round per fragment whose state is of an earlier step, taken up
  // at once, so that every member ends with the members' average model,
  // global and local alike. A join whose round closed without it (it came
  // too late: the others merged and left) is called off; it keeps its own
  // model, and says so.
  Status FinalMerge() {
    if (FinalMergeStep() == 0 || stats_.steps != FinalMergeStep()) return OkStatus();
    std::vector<int> due;
    for (int f = 0; f < static_cast<int>(fragments_.size()); ++f) {
      // (A learner restored at this step from a checkpoint holds its merged state.)
      if (std::max(fragments_[static_cast<size_t>(f)].last_round_boundary, restored_step_) <
          stats_.steps) {
        due.push_back(f);
      }
    }
    const Micros begin = clock_.NowMicros();
    int merged = 0;
    for (int f : due) {
      MEND_RETURN_IF_ERROR(Launch(f, /*final_merge=*/true));
      // The job's last checkpoint (checkpoint_dir with checkpoint_every_rounds) holds the merged
      // model.
      in_flight_->checkpoint = f == due.back();
      StatusOr<Awaited> awaited =
          AwaitRoundAgreed(*in_flight_, stats_.steps, /*train_on_if_lost=*/false);
      if (!awaited.ok()) return BreakGroup(awaited.status());
      if (*awaited != Awaited::kDone) {
        spdlog::warn("fragment {}: the final merge at step {} {}; it keeps its own parameters", f,
                     stats_.steps,
                     *awaited == Awaited::kShortOfQuorum
                         ? "has too few learners left to form its round"
                         : "closed without this learner (the others merged and left)");
        CallOff(*in_flight_);
        return FinishInFlight();
      }
      const uint64_t rounds = stats_.rounds;
      MEND_RETURN_IF_ERROR(FinishInFlight());
      if (stats_.rounds == rounds) {
        spdlog::warn("fragment {}: the final merge failed; this learner keeps its own parameters",
                     f);
        return OkStatus();
      }
      stats_.final_rounds++;
      merged++;
    }
    if (merged > 0) {
      spdlog::info(
          "final merge: {} round(s) at step {} in {:.3f} s; every member holds the same model",
          merged, stats_.steps, static_cast<double>(clock_.NowMicros() - begin) / kMicrosPerSecond);
    }
    return OkStatus();
  }

  // Whether `step` lies in the job's last fragment period (total_steps
  // known, concurrent rounds): a round launched there could be taken up only
  // after the last step (the tuned tau is below a fragment period), so every learner
  // would wait for it at shutdown; none is launched. The rule follows from
  // the configuration alone, so that every learner skips the same boundaries.
  bool InFinalPeriod(uint64_t step) const {
    if (!concurrent_ || config_.total_steps <= 0) return false;
    const auto total = static_cast<uint64_t>(config_.total_steps);
    return step <= total && step + FragmentPeriod() > total;
  }

  // At fragment f's boundary: snapshot, and start the exchange on a
  // background thread (one round in flight at a time). A final merge's is
  // taken up at once (shutdown waits for it).
  Status Launch(int f, bool final_merge = false) {
    MEND_RETURN_IF_ERROR(FinishInFlight());
    Fragment& fragment = fragments_[static_cast<size_t>(f)];
    auto flight = std::make_unique<InFlight>();
    flight->fragment = f;
    flight->boundary_step = stats_.steps;
    flight->previous_round_id = last_round_id_;
    flight->launched = clock_.NowMicros();
    flight->final_merge = final_merge;
    if (!final_merge) {
      stats_.overlap_steps = overlap_.Tau();
      if (group_ && concurrent_) {
        StatusOr<uint64_t> tau = group_->AgreeTau(stats_.overlap_steps);
        if (!tau.ok()) return BreakGroup(tau.status());
        stats_.overlap_steps = *tau;
      }
    }
    flight->apply_at_step = stats_.steps + (final_merge ? 0 : stats_.overlap_steps);
    flight->tokens = fragment.tokens_since_round;
    fragment.tokens_since_round = 0;
    const size_t n = fragment.state->size();
    flight->base = TakeFloats(n);
    std::copy(fragment.state->global().begin(), fragment.state->global().end(),
              flight->base.begin());
    std::vector<float> local = TakeFloats(n);
    Gather(fragment, local);
    flight->delta = TakeFloats(n);
    PseudoGradient(flight->base, local, flight->delta);
    GiveBack(std::move(local));
    if (moments_) {
      for (auto which : {FlatMoments::kFirst, FlatMoments::kSecond}) {
        flight->moments[which].resize(moments_->size());
        if (!moments_->Read(which, flight->moments[which])) flight->moments[which].clear();
      }
    }
    for (int kind = 0; kind < 2; ++kind) {
      if (buffers_[kind]) flight->buffers[kind] = ReadAll(*buffers_[kind]);
    }
    InFlight* raw = flight.get();
    flight->thread = std::thread([this, raw]() {
      raw->outcome = Exchange(*raw);
      raw->finished = clock_.NowMicros();
      {
        std::lock_guard lock(raw->mu);
        raw->done.store(true, std::memory_order_release);
      }
      raw->changed.notify_all();
    });
    stats_.rounds_started++;
    in_flight_ = std::move(flight);
    return OkStatus();
  }

  // Joins the round in flight (if any) and brings its result in:
  //   healed: every other fragment's base (and local parameters, by the same
  //           amount) becomes the source's; this fragment's base too;
  //   then theta_g' and momentum are committed and the local parameters of
  //   this fragment get the result (exact: + the progress since the boundary).
  // A failed round changes nothing: the local progress goes into the next one.
  //
  // In a group the round commits only when every rank's slice succeeded;
  // then the committed slices go into every replica. An error is the
  // group's own (a rank is gone): the group is the unit of failure.
  Status FinishInFlight() {
    if (!in_flight_) return OkStatus();
    std::unique_ptr<InFlight> flight = std::move(in_flight_);
    if (group_) {
      // The ranks' slices end at different times (a failing rendezvous may
      // take a collective timeout on one rank and none on another): they
      // meet every kPassedOverPoll until every slice has ended, so that no
      // group collective waits on a rank that still waits for its slice.
      while (true) {
        StatusOr<std::pair<bool, bool>> all = group_->AllArrived(PollDone(*flight), false);
        if (!all.ok()) {
          agent_.Interrupt();
          flight->thread.join();
          return BreakGroup(all.status());
        }
        if (all->first) break;
      }
    }
    flight->thread.join();
    if (group_) {
      uint64_t step_us = rank_steps_ == 0 ? 0 : static_cast<uint64_t>(rank_step_sum_) / rank_steps_;
      StatusOr<bool> all_ok = group_->AllOk(flight->outcome.ok(), &flight->formed_step, &step_us);
      if (!all_ok.ok()) return BreakGroup(all_ok.status());
      slowest_rank_step_ = static_cast<Micros>(step_us);
      rank_step_sum_ = 0;
      rank_steps_ = 0;
      if (!*all_ok && flight->outcome.ok()) {
        flight->outcome = AbortedError(fmt::format(
            "round {}: another rank of this group failed its slice", flight->outcome->round_id));
        last_round_id_ = flight->previous_round_id;
      }
    }
    Fragment& fragment = fragments_[static_cast<size_t>(flight->fragment)];
    if (!flight->outcome.ok()) {
      RecordRound(*flight);
      fragment.tokens_since_round += flight->tokens;
      if (flight->called_off) return OkStatus();  // (said when it was called off)
      stats_.failed_rounds++;
      spdlog::warn("fragment {}: round failed, training on: {}", flight->fragment,
                   flight->outcome.status());
      return OkStatus();
    }
    Outcome& outcome = *flight->outcome;
    if (outcome.healed.empty()) {  // a heal's transfer says nothing about the next rounds
      overlap_.RecordRound(static_cast<double>(flight->finished - flight->launched) /
                           kMicrosPerSecond);
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
        Scatter(other.state->global(), other);
        other.tokens_since_round = 0;
      }
    }
    stats_.bytes_sent += outcome.result.bytes_sent;
    stats_.cross_rack_bytes_sent += outcome.cross_rack_bytes;
    if (adopted) {
      KeepLocalProgress(exchanged, outcome.result.global);
      outcome.result.residual.clear();  // it sent nothing: its error feedback stays
      OuterRound::Commit(*exchanged.state, std::move(outcome.result));
      if (!outcome.fresh_join) fragment.tokens_since_round += flight->tokens;
    } else {
      OuterRound::Commit(*fragment.state, std::move(outcome.result));
      if (stats_.steps == flight->boundary_step) {
        // Nothing trained since the boundary (synchronous): exactly theta_g'.
        Scatter(fragment.state->global(), fragment);
      } else {
        std::vector<float> local = TakeFloats(fragment.state->size());
        Gather(fragment, local);
        ApplyOuterResult(local, fragment.state->global(), flight->base, flight->delta, apply_mode_,
                         static_cast<float>(config_.mixing_alpha));
        Scatter(local, fragment);
        GiveBack(std::move(local));
      }
    }
    bool moments_changed = false;
    for (auto which : {FlatMoments::kFirst, FlatMoments::kSecond}) {
      if (outcome.averaged_moments[which].empty() || flight->moments[which].empty()) continue;
      if (stats_.steps == flight->boundary_step) {
        moments_->Replace(which, outcome.averaged_moments[which]);
      } else {
        moments_->Adjust(which, outcome.averaged_moments[which], flight->moments[which]);
      }
      stats_.moment_syncs++;
      moments_changed = true;
    }
    for (auto which : {FlatMoments::kFirst, FlatMoments::kSecond}) {
      if (outcome.healed_moments[which].empty()) continue;
      moments_changed = true;
      if (stats_.steps == flight->boundary_step || flight->moments[which].empty()) {
        moments_->Replace(which, outcome.healed_moments[which]);
      } else {
        moments_->Adjust(which, outcome.healed_moments[which], flight->moments[which]);
      }
    }
    for (int kind = 0; kind < 2; ++kind) {
      if (!outcome.synced_buffers[kind].empty())
        WriteAll(*buffers_[kind], outcome.synced_buffers[kind]);
    }
    if (group_ && whole_moments_ && moments_changed) {
      // Each rank changed its slice of the moments: into every replica.
      if (Status shared = group_->ShareMoments(*whole_moments_); !shared.ok())
        return BreakGroup(shared);
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
      spdlog::info("healed from {}: step {} becomes the job's step {}", outcome.heal_source,
                   stats_.steps, outcome.heal_step + since);
      stats_.steps = outcome.heal_step + since;
      step_now_.store(stats_.steps, std::memory_order_relaxed);
      exchanged.last_round_boundary = outcome.heal_step;
    }
    stats_.rounds++;
    stats_.last_round_id = outcome.round_id;
    if (group_) {
      if (Status shared = group_->ShareParameters(); !shared.ok()) return BreakGroup(shared);
    }
    RecordRound(*flight);  // after the commit: its digest is of the new global state
    return MaybeCheckpoint(outcome.round_id, outcome.rank, outcome.members, flight->checkpoint);
  }

  // SHA-256 (hex) of every fragment's global parameters and momentum: equal
  // on every member after a shared round (the chaos harness compares them).
  std::string GlobalDigest() const {
    Sha256 hash;
    for (const Fragment& fragment : fragments_) {
      hash.Update(fragment.state->global());
      hash.Update(fragment.state->momentum());
    }
    return hash.Hex();
  }

  // The group lost a rank (a collective among its ranks failed): every
  // later step() and shutdown() report it; the group is the unit of failure.
  Status BreakGroup(Status status) {
    spdlog::error("{}; this rank stops (the group is restarted as a whole)", status);
    group_broken_ = status;
    return status;
  }

  // SHA-256 (hex) of a group rank's whole model, parameter by parameter.
  std::string ParametersDigest() const {
    Sha256 hash;
    std::vector<float> values;
    for (size_t i = 0; i < whole_->count(); ++i) {
      values.resize(whole_->numel(i));
      whole_->CopyOut(i, values);
      hash.Update(values);
    }
    return hash.Hex();
  }

  void RecordRound(const InFlight& flight) {
    if (!diagnostics_->enabled()) return;
    nlohmann::json record = {
        {"fragment", flight.fragment},
        {"boundary_step", flight.boundary_step},
        {"applied_step", stats_.steps},
        {"tau", flight.apply_at_step - flight.boundary_step},
        {"tokens", flight.tokens},
        {"seconds", static_cast<double>(clock_.NowMicros() - flight.launched) / kMicrosPerSecond},
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
      record["cross_rack_bytes"] = outcome.cross_rack_bytes;
      record["dropped"] = outcome.result.dropped;
      record["merged_norm"] = outcome.result.merged_norm;
      record["outer_step"] = outcome.outer_warmup || outcome.final_merge ? "average" : "nesterov";
      record["final_merge"] = outcome.final_merge;
      record["healed"] = !outcome.healed.empty();
      if (!outcome.healed.empty()) {
        record["heal_step"] = outcome.heal_step;
        record["fresh_join"] = outcome.fresh_join;
        record["heal_seconds"] = outcome.heal_seconds;
        record["heal_bytes"] = outcome.heal_bytes;
        record["heal_source"] = outcome.heal_source;
      }
      record["global_sha256"] = GlobalDigest();  // in a group: of this rank's slice
      if (group_) {
        // The whole replica: the same on every rank of the group.
        record["group_rank"] = group_->rank();
        record["parameters_sha256"] = ParametersDigest();
      }
    }
    diagnostics_->Round(std::move(record));
  }

  // The background part of a round: quorum, communicator, healing, merge.
  // Reads the fragments' global state; writes nothing the training thread reads.
  StatusOr<Outcome> Exchange(InFlight& flight) {
    MEND_ASSIGN_OR_RETURN(
        QuorumResult round,
        agent_.Quorum(last_round_id_, flight.tokens, config_.quorum_timeout_ms * kMicrosPerMilli,
                      /*include_members=*/true, flight.boundary_step));
    {
      std::lock_guard lock(flight.mu);
      flight.formed = true;
      flight.formed_step = step_now_.load(std::memory_order_relaxed);
    }
    // A round formed by a lighthouse that has since restarted (this agent
    // registered again) cannot rendezvous: its keys died with it.
    const uint64_t registrations = agent_.registrations();
    CommunicatorOptions options = CommunicatorOptionsForRound(config_, round);
    // The round's prefix stays the lighthouse's (its abort key is there); a
    // group's slices rendezvous apart.
    if (group_) options.prefix = group_->SlicePrefix(round.rendezvous_prefix);
    LighthouseRendezvousStore store(
        agent_.client(),
        [this, registrations]() { return agent_.registrations() == registrations; },
        round.rendezvous_prefix + kRoundAbortKey);
    std::vector<std::string> racks;
    for (const RoundMember& member : round.members) racks.push_back(member.rack);
    // The fp32 merge sums by rack, as the rack-aware one does: the same bits
    // with rack_aware or without.
    options.member_racks = racks;
    MEND_ASSIGN_OR_RETURN(auto comm, Communicator::Connect(store, options));
    if (config_.rack_aware) {
      // Learners sharing a rack merge there first (see dataplane/hierarchy.h).
      MEND_ASSIGN_OR_RETURN(comm, ConnectRackAware(store, options, std::move(comm), racks));
    }
    const CommunicatorStats connected = comm->stats();
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
    HealOffer offer;
    offer.boundary_step = flight.boundary_step;
    offer.fragment = flight.fragment;
    offer.send_moments = config_.heal_inner_optimizer;
    offer.moment_values = moments_ ? moments_->size() : 0;
    offer.moments[0] = &flight.moments[0];
    offer.moments[1] = &flight.moments[1];
    // On a fresh start (no round of the job completed yet) every member
    // takes rank 0's state, unless all of them hold it already (the usual
    // case: the same seed or checkpoint), which they learn through the
    // round's store: then no model crosses the link.
    Healed healed;
    bool agree = false;
    if (round.heal_round_id == 0 && !config_.heal_inner_optimizer) {
      MEND_ASSIGN_OR_RETURN(agree, StatesAgree(store, round, flight, options.timeout));
    }
    if (!agree) {
      MEND_ASSIGN_OR_RETURN(healed, HealRound(*comm, round, fragments_, offer, clock_));
    }
    outcome.heal_seconds = healed.seconds;
    if (!healed.state.empty()) {
      outcome.healed = std::move(healed.state);
      outcome.heal_bytes = healed.bytes;
      outcome.heal_source = healed.source;
      outcome.heal_step = healed.step;
      outcome.fragment = healed.fragment;
      outcome.healed_moments[0] = std::move(healed.moments[0]);
      outcome.healed_moments[1] = std::move(healed.moments[1]);
    }
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
    // The round's step is the lighthouse's (its members' largest), the same
    // for every member, so all take the same kind of outer step.
    sync_options.warmup =
        round.step > 0 && round.step <= static_cast<uint64_t>(config_.outer_warmup_steps);
    outcome.outer_warmup = sync_options.warmup;
    outcome.final_merge = IsFinalMerge(round.step, outcome.fragment);
    if (outcome.final_merge) {
      // The members' models averaged exactly: lossless, and no error
      // feedback (what a sparse codec held back stays this learner's).
      sync_options.warmup = true;
      sync_options.codec = nullptr;
    }
    std::span<const float> delta = flight.delta;
    std::vector<float> no_delta;
    // The merge runs on the healed base when this learner was behind.
    const FragmentState* state = fragments_[static_cast<size_t>(outcome.fragment)].state.get();
    std::unique_ptr<FragmentState> healed_state;
    if (!outcome.healed.empty()) {
      auto [global, momentum] =
          HealSlice(fragments_, outcome.healed, static_cast<size_t>(outcome.fragment));
      healed_state = std::make_unique<FragmentState>(global);
      healed_state->Assign(global, momentum);
      state = healed_state.get();
    }
    if (adopted) {
      no_delta.assign(state->size(), 0.0f);
      delta = no_delta;
      spdlog::info(
          "round {}: exchanges fragment {}, not this learner's fragment {} (its join was passed "
          "over); "
          "taking part without a pseudo-gradient",
          round.round_id, outcome.fragment, flight.fragment);
    }
    // The merge weight: the tokens of one rank. Every group of the job has
    // the same size, so the ratios are the groups', and a group's slices are
    // merged by the arithmetic of a learner of one rank (the fp32 sum
    // multiplies by the weights themselves).
    const uint64_t weight =
        group_ ? flight.tokens / static_cast<uint64_t>(group_->size()) : flight.tokens;
    MEND_ASSIGN_OR_RETURN(
        outcome.result,
        OuterRound::Exchange(*comm, *state, delta, static_cast<double>(weight), sync_options));
    MEND_RETURN_IF_ERROR(AverageMoments(*comm, round.round_id, flight, &outcome));
    MEND_RETURN_IF_ERROR(SyncBuffers(*comm, round.rank, flight, &outcome));
    outcome.cross_rack_bytes = CrossRackBytes(connected, comm->stats(), racks, round.rank);
    last_round_id_ = round.round_id;
    return outcome;
  }

  // What this member sent to members of other racks (or of no rack, or when
  // the member list is unknown: everything) between two stats.
  static uint64_t CrossRackBytes(const CommunicatorStats& before, const CommunicatorStats& after,
                                 const std::vector<std::string>& racks, uint32_t me) {
    if (racks.size() <= me || racks[me].empty()) return after.bytes_sent - before.bytes_sent;
    uint64_t bytes = 0;
    for (size_t p = 0; p < after.bytes_sent_to.size(); ++p) {
      if (p < racks.size() && racks[p] == racks[me]) continue;
      bytes +=
          after.bytes_sent_to[p] - (p < before.bytes_sent_to.size() ? before.bytes_sent_to[p] : 0);
    }
    return bytes;
  }

  // Whether every member of `round` holds the same global state at the same
  // boundary step and fragment: each publishes its digest under the round's
  // prefix and reads all the others' (so all decide alike).
  StatusOr<bool> StatesAgree(RendezvousStore& store, const QuorumResult& round,
                             const InFlight& flight, Micros timeout) const {
    const std::string prefix =
        group_ ? group_->SlicePrefix(round.rendezvous_prefix) : round.rendezvous_prefix;
    auto key = [&](uint32_t rank) { return fmt::format("{}state/{}", prefix, rank); };
    const std::string mine =
        fmt::format("{} {} {}", GlobalDigest(), flight.boundary_step, flight.fragment);
    MEND_RETURN_IF_ERROR(store.Set(key(round.rank), mine));
    bool agree = true;
    for (uint32_t r = 0; r < round.world_size; ++r) {
      if (r == round.rank) continue;
      MEND_ASSIGN_OR_RETURN(std::string theirs, store.Get(key(r), timeout));
      agree = agree && theirs == mine;
    }
    return agree;
  }

  // DES-LOC: every (K_u / H)-th round the first moments, every (K_v / H)-th
  // the second, averaged with the round's weights. The round id decides, so
  // every member of a round agrees. A learner without optimizer state yet
  // takes part with weight 0.
  Status AverageMoments(Communicator& comm, uint64_t round_id, const InFlight& flight,
                        Outcome* outcome) {
    if (!config_.desloc) return OkStatus();
    const uint64_t every[2] = {desloc_rounds_[0], desloc_rounds_[1]};
    for (auto which : {FlatMoments::kFirst, FlatMoments::kSecond}) {
      if (round_id % every[which] != 0) continue;
      std::vector<float>& average = outcome->averaged_moments[which];
      const bool have = !flight.moments[which].empty();
      average = have ? flight.moments[which] : std::vector<float>(moments_->size(), 0.0f);
      double weight =
          have ? (options_.token_weighted ? static_cast<double>(flight.tokens) : 1.0) : 0.0;
      MEND_RETURN_IF_ERROR(comm.WeightedAllReduce(average, weight));
    }
    return OkStatus();
  }

  // sync_buffers: the model's floating-point buffers averaged with the
  // round's weights, its integer ones (carried as floats) taken from the
  // round's first member; every member then holds the same values.
  Status SyncBuffers(Communicator& comm, uint32_t rank, const InFlight& flight, Outcome* outcome) {
    if (!flight.buffers[kAveragedBuffers].empty()) {
      outcome->synced_buffers[kAveragedBuffers] = flight.buffers[kAveragedBuffers];
      const double weight =
          options_.token_weighted ? static_cast<double>(std::max<uint64_t>(flight.tokens, 1)) : 1.0;
      MEND_RETURN_IF_ERROR(
          comm.WeightedAllReduce(outcome->synced_buffers[kAveragedBuffers], weight));
    }
    if (!flight.buffers[kFirstMembersBuffers].empty()) {
      outcome->synced_buffers[kFirstMembersBuffers] = flight.buffers[kFirstMembersBuffers];
      MEND_RETURN_IF_ERROR(comm.WeightedAllReduce(outcome->synced_buffers[kFirstMembersBuffers],
                                                  rank == 0 ? 1.0 : 0.0));
    }
    return OkStatus();
  }

  static std::vector<float> ReadAll(const FlatParameters& values) {
    size_t total = 0;
    for (size_t i = 0; i < values.count(); ++i) total += values.numel(i);
    std::vector<float> all(total);
    size_t at = 0;
    for (size_t i = 0; i < values.count(); ++i) {
      values.CopyOut(i, std::span(all).subspan(at, values.numel(i)));
      at += values.numel(i);
    }
    return all;
  }

  static void WriteAll(FlatParameters& values, std::span<const float> all) {
    size_t at = 0;
    for (size_t i = 0; i < values.count(); ++i) {
      values.CopyIn(i, all.subspan(at, values.numel(i)));
      at += values.numel(i);
    }
  }

  Status SetBuffers(bool from_first_member, std::unique_ptr<FlatParameters> buffers) override {
    if (stepped_ || in_flight_) {
      return FailedPreconditionError(
          "reducer: the model's buffers are handed over before the first step");
    }
    buffers_[from_first_member ? kFirstMembersBuffers : kAveragedBuffers] = std::move(buffers);
    return OkStatus();
  }

  // `exchanging` (the fragment whose round result follows; nullptr: none
  // of this learner's) is left to that result; every other fragment keeps
  // the learner's progress on top of the healed state.
  void ApplyHeal(const std::vector<float>& healed, const Fragment* exchanging) {
    for (size_t f = 0; f < fragments_.size(); ++f) {
      Fragment& fragment = fragments_[f];
      auto [global, momentum] = HealSlice(fragments_, healed, f);
      if (&fragment != exchanging) KeepLocalProgress(fragment, global);
      fragment.state->Assign(global, momentum);
    }
    stats_.heals++;
  }

  // A fragment whose base is replaced outside its own round: its local
  // parameters move by the same amount, so that what this learner trained
  // since its old base is still its pseudo-gradient, and the base change is
  // not mistaken for training (theta_i <- theta_i + new base - old base).
  // The fragment being exchanged needs none: its pseudo-gradient is taken
  // before the heal and the round replaces its local parameters.
  void KeepLocalProgress(Fragment& fragment, std::span<const float> new_base) {
    std::vector<float> local = TakeFloats(fragment.state->size());
    Gather(fragment, local);
    std::span<const float> old_base = fragment.state->global();
    for (size_t i = 0; i < local.size(); ++i) local[i] += new_base[i] - old_base[i];
    Scatter(local, fragment);
    GiveBack(std::move(local));
  }

  // `visit(l, offset, n)` for each of the fragment's parameters: its n
  // values lie at `offset` in the fragment's flat state.
  template <typename Visit>
  void ForEachPiece(const Fragment& fragment, Visit&& visit) const {
    size_t offset = 0;
    for (size_t l : fragment.parameters) {
      const size_t n = parameters_->numel(l);
      visit(l, offset, n);
      offset += n;
    }
  }

  // Every copy between the parameters and the flat fragment state goes
  // through Gather and Scatter; stats().parameter_copies counts them (a
  // step that neither starts nor applies a round makes none).
  template <typename Copy>
  void ForEachParameter(const Fragment& fragment, Copy&& copy) {
    ForEachPiece(fragment, copy);
    stats_.parameter_copies++;
  }
  void Gather(const Fragment& fragment, std::span<float> out) {
    ForEachParameter(fragment, [&](size_t l, size_t offset, size_t n) {
      parameters_->CopyOut(l, out.subspan(offset, n));
    });
  }
  void Scatter(std::span<const float> in, const Fragment& fragment) {
    ForEachParameter(fragment, [&](size_t l, size_t offset, size_t n) {
      parameters_->CopyIn(l, in.subspan(offset, n));
    });
  }

  const Config config_;
  // A multi-rank learner's whole model and group (null otherwise); before
  // everything that uses them, so that they go last.
  const std::unique_ptr<FlatParameters> whole_;
  const std::unique_ptr<FlatMoments> whole_moments_;
  const std::unique_ptr<LearnerGroup> group_;
  LearnerAgent& agent_;
  const Clock& clock_;
  const FragmentSchedule schedule_;
  const std::unique_ptr<FlatParameters> parameters_;
  const std::unique_ptr<FlatMoments> moments_;  // null without an Adam inner optimizer
  const bool concurrent_ = config_.concurrent_outer_step;
  // tau: overlap_steps, or tuned from this learner's round and step times.
  outer::OverlapTuner overlap_{
      config_.overlap_steps,
      static_cast<uint64_t>(std::max<int64_t>(
          int64_t{1},
          config_.sync_period_steps / std::max<int64_t>(1, schedule_.fragments()) - 1))};
  const OuterApply apply_mode_ =
      config_.outer_apply == "mix" ? OuterApply::kMix : OuterApply::kExact;
  std::unique_ptr<AbortWatch> abort_watch_;  // before in_flight_: outlives its round
  std::unique_ptr<InFlight> in_flight_;
  std::unique_ptr<Diagnostics> diagnostics_;
  uint64_t desloc_rounds_[2] = {3, 6};  // rounds between K_u and K_v syncs
  // The last round this learner completed; written by the round's thread,
  // which runs alone (the next round starts only after it was joined).
  uint64_t last_round_id_ = 0;
  std::unique_ptr<Codec> codec_;
  OuterSyncOptions options_;
  std::vector<Fragment> fragments_;
  ReducerStats stats_;
  uint64_t tokens_total_ = 0;
  std::atomic<uint64_t> step_now_{0};  // stats_.steps, for the round's thread
  Micros last_step_ = 0;
  Micros last_return_ = 0;  // when step() last returned
  bool stepped_ = false;
  bool shut_down_ = false;
  // sync_buffers: the model's buffers averaged at every round, and those
  // taken from the round's first member (null: none).
  static constexpr int kAveragedBuffers = 0;
  static constexpr int kFirstMembersBuffers = 1;
  std::unique_ptr<FlatParameters> buffers_[2];
  // PlanStep's view for the step it planned (0: none planned).
  uint64_t planned_step_ = 0;
  bool planned_arrival_ = false;
  // The step the global state was started or last restored at (see StateStep).
  uint64_t restored_step_ = 0;
  Status group_broken_ = OkStatus();
  // In a group: this rank's step times since the last round, and the
  // slowest rank's mean step as of it (what rank 0's heartbeats carry).
  Micros rank_step_sum_ = 0;
  uint64_t rank_steps_ = 0;
  Micros slowest_rank_step_ = 0;
  CheckpointWriter checkpoint_writer_{config_.checkpoint_dir,
                                      static_cast<int>(config_.checkpoint_keep)};
};

}  // namespace

StatusOr<std::unique_ptr<RoundDriver>> RoundDriver::Create(
    const Config& config, LearnerAgent& agent, const Clock& clock,
    std::unique_ptr<FlatParameters> parameters, std::unique_ptr<FlatMoments> moments,
    uint64_t start_step) {
  MEND_ASSIGN_OR_RETURN(FragmentSchedule schedule,
                        FragmentSchedule::Make(config.fragments, config.sync_period_steps));
  MEND_ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec, MakeCodec(config));
  std::unique_ptr<RoundDriverImpl> driver;
  if (config.group_size > 1) {
    MEND_RETURN_IF_ERROR(CheckConfig(config));
    if (parameters->count() == 0)
      return InvalidArgumentError("reducer: the model has no parameters");
    MEND_ASSIGN_OR_RETURN(std::unique_ptr<LearnerGroup> group,
                          LearnerGroup::Join(config, agent, *parameters));
    std::unique_ptr<FlatParameters> slice = group->Slice();
    std::unique_ptr<FlatMoments> moment_slice = moments ? group->Slice(*moments) : nullptr;
    LearnerAgent& group_agent = group->agent();
    driver = std::make_unique<RoundDriverImpl>(
        config, group_agent, clock, schedule, std::move(codec), std::move(slice),
        std::move(moment_slice), std::move(parameters), std::move(moments), std::move(group));
  } else {
    driver = std::make_unique<RoundDriverImpl>(config, agent, clock, schedule, std::move(codec),
                                               std::move(parameters), std::move(moments));
  }
  MEND_RETURN_IF_ERROR(driver->Init(start_step));
  return std::unique_ptr<RoundDriver>(std::move(driver));
}

}  // namespace mend::reducer
