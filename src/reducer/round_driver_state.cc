// The state around the rounds: construction, resume and restore, export and
// import, checkpoints, and the round records of the diagnostics.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <utility>

#include "core/status_format.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "nlohmann/json.hpp"
#include "reducer/round_driver_impl.h"
#include "spdlog/spdlog.h"

namespace mend::reducer {

RoundDriverImpl::RoundDriverImpl(const Config& config, LearnerAgent& agent, const Clock& clock,
                                 FragmentSchedule schedule, std::unique_ptr<Codec> codec,
                                 std::unique_ptr<RoundPolicy> policy,
                                 std::unique_ptr<FlatParameters> parameters,
                                 std::unique_ptr<FlatMoments> moments)
    : config_(config),
      policy_(std::move(policy)),
      agent_(agent),
      clock_(clock),
      schedule_(schedule),
      parameters_(std::move(parameters)),
      moments_(std::move(moments)),
      book_(*parameters_, schedule_, &stats_.parameter_copies, pool_),
      codec_(std::move(codec)) {
  options_.outer = {static_cast<float>(config.outer_lr), static_cast<float>(config.outer_momentum)};
  options_.token_weighted = config.token_weighted_merge;
  options_.codec = codec_.get();
  options_.error_feedback_beta = static_cast<float>(config.error_feedback_beta);
}

Status RoundDriverImpl::Init(uint64_t start_step, std::unique_ptr<RoundServices> services) {
  stats_.steps = start_step;
  restored_step_ = start_step;
  step_now_.store(start_step);
  services_ = policy_->Services(std::move(services));
  runner_ = std::make_unique<RoundRunner>(config_, schedule_, *services_, book_, *policy_, options_,
                                          moments_ ? moments_->size() : 0);
  diagnostics_ =
      std::make_unique<Diagnostics>(config_.diagnostics_dir, policy_->DiagnosticsName(agent_.id()));
  if (parameters_->count() == 0)
    return InvalidArgumentError("reducer: the model has no parameters");
  if (config_.desloc) MEND_RETURN_IF_ERROR(InitDesloc());
  if (config_.heal_inner_optimizer && !moments_) {
    return InvalidArgumentError(
        "heal_inner_optimizer = true: the reducer was given no inner optimizer moments (use Adam "
        "or AdamW)");
  }
  if (!config_.resume_from.empty()) {
    MEND_RETURN_IF_ERROR(ResumeFrom(config_.resume_from));
  } else if (!config_.checkpoint_dir.empty() && config_.resume) {
    MEND_RETURN_IF_ERROR(Resume());
  }
  if (policy_->group() && (!config_.checkpoint_dir.empty() || !config_.resume_from.empty())) {
    // Each rank resumed its slice (from the same file, shared by the rack's
    // hosts): the same checkpoint everywhere, then into every replica.
    MEND_RETURN_IF_ERROR(AgreeOnRestoredState(
        "resumed from", "they must all see the same checkpoint_dir (or resume_from file)"));
  }
  book_.StartPrefault(/*own=*/concurrent_,
                      /*step=*/concurrent_ && apply_mode_ == OuterApply::kEager);
  return OkStatus();
}

// (CheckConfig held the keys' rules before the learner registered.)
Status RoundDriverImpl::InitDesloc() {
  const int64_t h = config_.sync_period_steps;
  const int64_t periods[2] = {
      config_.momentum_sync_period_steps > 0 ? config_.momentum_sync_period_steps : 3 * h,
      config_.second_moment_sync_period_steps > 0 ? config_.second_moment_sync_period_steps
                                                  : 6 * h};
  for (int k = 0; k < 2; ++k) runner_->desloc_rounds[k] = static_cast<uint64_t>(periods[k] / h);
  if (!moments_) {
    return InvalidArgumentError(
        "desloc = true: the reducer was given no inner optimizer moments (DES-LOC averages the "
        "moments of Adam or AdamW)");
  }
  return OkStatus();
}

// resume_from: that file, or an error naming it.
Status RoundDriverImpl::ResumeFrom(const std::string& path) {
  StatusOr<Checkpoint> checkpoint = ReadCheckpoint(path);
  if (!checkpoint.ok())
    return Annotate(checkpoint.status(), fmt::format("resume_from = \"{}\"", path));
  return ResumeWith(*checkpoint, path);
}

// A checkpoint (from `where`) becomes the state this learner resumes at.
Status RoundDriverImpl::ResumeWith(const Checkpoint& checkpoint, const std::string& where) {
  MEND_RETURN_IF_ERROR(Restore(checkpoint, where));
  stats_.resumed_from_round = checkpoint.meta.round_id;
  spdlog::info("resumed from {}: round {} (step {}, written by {})", where,
               checkpoint.meta.round_id, checkpoint.meta.step, checkpoint.meta.written_by);
  return OkStatus();
}

// The newest checkpoint that verifies becomes the global state and the
// local parameters; none is a fresh start.
Status RoundDriverImpl::Resume() {
  CheckpointDirectory directory(config_.checkpoint_dir, static_cast<int>(config_.checkpoint_keep));
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
void RoundDriverImpl::WarnOfOtherFiles() const {
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
      "starting fresh. To resume from a file of another name, set resume_from = PATH",
      config_.checkpoint_dir, fmt::join(others, ", "), others.size() == 5 ? ", ..." : "");
}

// `checkpoint` becomes every fragment's global state and momentum, the
// local parameters, the last round and the step. `where` names it in errors.
Status RoundDriverImpl::Restore(const Checkpoint& checkpoint, const std::string& where) {
  MEND_ASSIGN_OR_RETURN(auto states,
                        FragmentStates(checkpoint, *parameters_, book_.fragments(), where));
  for (size_t f = 0; f < book_.size(); ++f) {
    Fragment& fragment = book_.at(static_cast<int>(f));
    fragment.state->Assign(states[f].first, states[f].second);
    book_.Scatter(fragment.state->global(), fragment);
  }
  RestoredAt(checkpoint.meta.round_id, checkpoint.meta.step, checkpoint.meta.step);
  return OkStatus();
}

// An exported state as the exporting learner left it: the global state,
// momentum and error feedback, the round, its step and tokens since each
// fragment's round; the parameters stay the caller's (restored with the
// model's own state).
Status RoundDriverImpl::RestoreOuterState(const Checkpoint& checkpoint) {
  const CheckpointMeta& meta = checkpoint.meta;
  if (meta.learner_step == 0 || meta.tokens_since_round.size() != book_.size()) {
    return InvalidArgumentError(fmt::format(
        "import_state(keep_parameters): the state of round {} holds no learner's progress for {} "
        "fragment(s) (a checkpoint file, or another fragment count?); import it with its "
        "parameters instead",
        meta.round_id, book_.size()));
  }
  const std::vector<Fragment>& fragments = book_.fragments();
  MEND_ASSIGN_OR_RETURN(auto states,
                        FragmentStates(checkpoint, *parameters_, fragments, "(imported state)"));
  const auto residuals = FragmentResiduals(checkpoint, *parameters_, fragments);
  for (size_t f = 0; f < book_.size(); ++f) {
    Fragment& fragment = book_.at(static_cast<int>(f));
    fragment.state->Assign(states[f].first, states[f].second);
    if (!residuals[f].empty()) fragment.state->AssignResidual(residuals[f]);
    fragment.tokens_since_round = meta.tokens_since_round[f];
  }
  RestoredAt(meta.round_id, meta.learner_step, meta.step);
  return OkStatus();
}

// After a restore: the last round is `round_id`, this learner is at `step`,
// and the global state is of `state_step` (see FragmentBook::StateStep).
void RoundDriverImpl::RestoredAt(uint64_t round_id, uint64_t step, uint64_t state_step) {
  last_round_id_ = round_id;
  stats_.last_round_id = round_id;
  stats_.steps = step;
  step_now_.store(step);
  restored_step_ = state_step;
  for (Fragment& fragment : book_.fragments()) fragment.last_round_boundary = 0;
}

// A group's ranks each restored their slice: they must have restored the
// same round; then every replica takes the restored parameters.
Status RoundDriverImpl::AgreeOnRestoredState(std::string_view what, std::string_view rule) {
  return policy_->AgreeOnRestored(last_round_id_, what, rule);
}

// The outer state as checkpoint bytes. In a group a collective, like
// SaveCheckpoint: rank 0 gets the whole model, the other ranks nothing.
StatusOr<std::string> RoundDriverImpl::ExportState() {
  if (shut_down_) return FailedPreconditionError("reducer: export_state() after shutdown()");
  book_.AwaitPrefault();
  StatusOr<std::shared_ptr<Checkpoint>> whole = Snapshot(stats_.last_round_id, 0);
  if (!whole.ok()) {
    return Annotate(whole.status(),
                    "export_state: a multi-rank learner's export is collective (every rank of the "
                    "group calls it at the same step)");
  }
  if (!*whole) return std::string();
  // A learner of one rank's own error feedback goes with it.
  if (!policy_->group()) AddResidualTensors(*parameters_, book_.fragments(), whole->get());
  AddLearnerProgress(&(*whole)->meta);
  return EncodeCheckpoint(**whole);
}

// This learner's own step and tokens since each fragment's round.
void RoundDriverImpl::AddLearnerProgress(CheckpointMeta* meta) const {
  meta->learner_step = std::max<uint64_t>(stats_.steps, 1);
  meta->tokens_since_round.clear();
  for (const Fragment& fragment : book_.fragments())
    meta->tokens_since_round.push_back(fragment.tokens_since_round);
}

Status RoundDriverImpl::ImportState(std::string_view bytes, bool keep_parameters) {
  if (shut_down_) return FailedPreconditionError("reducer: import_state() after shutdown()");
  book_.AwaitPrefault();
  if (!flights_.empty()) {
    return FailedPreconditionError(
        fmt::format("import_state: the round of fragment {} for step {} is in flight; import "
                    "between rounds (before the first step, or after shutdown of the job that "
                    "exported it)",
                    flights_.front()->fragment, flights_.front()->boundary_step));
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
  if (!policy_->group()) return OkStatus();
  return AgreeOnRestoredState("imported", "every rank must import the same state");
}

// A checkpoint's description, without tensors.
Checkpoint RoundDriverImpl::Described(uint64_t round_id, uint32_t members) const {
  Checkpoint checkpoint;
  checkpoint.meta.job_id = config_.job_id;
  checkpoint.meta.round_id = round_id;
  checkpoint.meta.step = book_.StateStep(restored_step_);
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

// Every fragment's global state and momentum, by parameter name; in a group
// a collective (null on ranks other than 0). A failed gather breaks the group.
StatusOr<std::shared_ptr<Checkpoint>> RoundDriverImpl::Snapshot(uint64_t round_id,
                                                                uint32_t members) {
  StatusOr<std::shared_ptr<Checkpoint>> checkpoint =
      policy_->Snapshot(book_, Described(round_id, members));
  if (!checkpoint.ok()) return BreakGroup(checkpoint.status());
  return checkpoint;
}

// In a group a collective: every rank calls it at the same step (between
// the same two step() calls), and rank 0 writes the whole model to its `path`.
Status RoundDriverImpl::SaveCheckpoint(const std::string& path) {
  book_.AwaitPrefault();
  StatusOr<std::shared_ptr<Checkpoint>> whole = Snapshot(stats_.last_round_id, 0);
  if (!whole.ok()) {
    return Annotate(whole.status(),
                    "SaveCheckpoint: a multi-rank learner's checkpoint is collective (every rank "
                    "of the group calls it at the same step)");
  }
  return *whole ? WriteCheckpoint(path, **whole) : OkStatus();
}

// Rank 0 of a round whose id is a multiple of checkpoint_every_rounds (or
// `always`: the final merge's last round) writes one, on a background
// thread (one write at a time). In a group every rank of that learner
// gathers the slices and its rank 0 writes the whole model, by parameter
// name: one file, which any group size and fragment count reads.
Status RoundDriverImpl::MaybeCheckpoint(uint64_t round_id, uint32_t rank, uint32_t members,
                                        bool always) {
  if (config_.checkpoint_dir.empty() || config_.checkpoint_every_rounds <= 0 || rank != 0 ||
      (!always && round_id % static_cast<uint64_t>(config_.checkpoint_every_rounds) != 0)) {
    return OkStatus();
  }
  MEND_ASSIGN_OR_RETURN(std::shared_ptr<Checkpoint> whole, Snapshot(round_id, members));
  if (whole) checkpoint_writer_.Write(std::move(whole));
  return OkStatus();
}

Status RoundDriverImpl::SetBuffers(bool from_first_member,
                                   std::unique_ptr<FlatParameters> buffers) {
  if (stepped_ || !flights_.empty()) {
    return FailedPreconditionError(
        "reducer: the model's buffers are handed over before the first step");
  }
  buffers_[from_first_member ? kFirstMembersBuffers : kAveragedBuffers] = std::move(buffers);
  return OkStatus();
}

void RoundDriverImpl::RecordRound(const InFlight& flight) {
  if (!diagnostics_->enabled()) return;
  nlohmann::json record = {
      {"fragment", flight.fragment},
      {"boundary_step", flight.boundary_step},
      {"applied_step", stats_.steps},
      {"tau", flight.apply_at_step - flight.boundary_step},
      {"tokens", flight.tokens},
      {"seconds", static_cast<double>(clock_.NowMicros() - flight.launched) / kMicrosPerSecond},
      {"round_seconds",
       static_cast<double>(std::max<Micros>(0, flight.finished - flight.launched)) /
           kMicrosPerSecond},
      {"in_flight", flight.in_flight},
      {"waited", flight.waited},
      {"ok", flight.outcome.ok()},
      {"passed_over", flight.passed_over}};
  if (!flight.outcome.ok()) {
    record["error"] = flight.outcome.status().ToString();
    diagnostics_->Round(std::move(record));
    return;
  }
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
  record["global_sha256"] = book_.GlobalDigest();  // in a group: of this rank's slice
  policy_->AddToRecord(record);
  diagnostics_->Round(std::move(record));
}

StatusOr<std::unique_ptr<RoundDriver>> RoundDriver::Create(
    const Config& config, LearnerAgent& agent, const Clock& clock,
    std::unique_ptr<FlatParameters> parameters, std::unique_ptr<FlatMoments> moments,
    uint64_t start_step, std::unique_ptr<RoundServices> services) {
  MEND_RETURN_IF_ERROR(CheckConfig(config));
  MEND_ASSIGN_OR_RETURN(FragmentSchedule schedule,
                        FragmentSchedule::Make(config.fragments, config.sync_period_steps));
  MEND_ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec, MakeCodec(config));
  std::unique_ptr<RoundDriverImpl> driver;
  if (config.group_size > 1) {
    if (parameters->count() == 0)
      return InvalidArgumentError("reducer: the model has no parameters");
    MEND_ASSIGN_OR_RETURN(std::unique_ptr<LearnerGroup> group,
                          LearnerGroup::Join(config, agent, *parameters));
    std::unique_ptr<FlatParameters> slice = group->Slice();
    std::unique_ptr<FlatMoments> moment_slice = moments ? group->Slice(*moments) : nullptr;
    driver = std::make_unique<RoundDriverImpl>(
        config, agent, clock, schedule, std::move(codec),
        GroupPolicy(std::move(group), std::move(parameters), std::move(moments)), std::move(slice),
        std::move(moment_slice));
  } else {
    driver = std::make_unique<RoundDriverImpl>(config, agent, clock, schedule, std::move(codec),
                                               SingleRankPolicy(), std::move(parameters),
                                               std::move(moments));
  }
  if (!services) services = LighthouseRoundServices(agent, clock);
  MEND_RETURN_IF_ERROR(driver->Init(start_step, std::move(services)));
  return std::unique_ptr<RoundDriver>(std::move(driver));
}

}  // namespace mend::reducer
