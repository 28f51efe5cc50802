#include "reducer/outer_state.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

#include "core/status_format.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "spdlog/spdlog.h"

namespace mend::reducer {

OuterState::OuterState(CheckpointOptions options, FlatParameters& parameters,
                       const FragmentSchedule& schedule, uint64_t* copies, ThreadPool& pool,
                       ReplicaState& policy, std::string learner_id)
    : options_(std::move(options)),
      parameters_(parameters),
      policy_(policy),
      learner_id_(std::move(learner_id)),
      book_(parameters, schedule, copies, pool),
      writer_(CheckpointDirectory(options_.dir, options_.keep, options_.secret)) {}

OuterState::~OuterState() { writer_.Join(); }

namespace {

// checkpoint_dir, when checkpoints are to be written there: made if missing,
// and writable. Otherwise every checkpoint would fail (logged at each round)
// in a job that believes it is checkpointing.
Status CheckCheckpointDirectory(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (!error && !std::filesystem::is_directory(dir, error) && !error) {
    error = std::make_error_code(std::errc::not_a_directory);
  }
  if (!error && ::access(dir.c_str(), W_OK | X_OK) != 0) {
    error = std::error_code(errno, std::generic_category());
  }
  if (error) {
    return InvalidArgumentError(
        fmt::format("checkpoint_dir = \"{}\": checkpoints cannot be written there ({}); "
                    "checkpoint_every_rounds "
                    "asks for them",
                    dir, error.message()));
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::optional<Restored>> OuterState::Start(uint64_t start_step) {
  restored_step_ = start_step;
  if (!options_.dir.empty() && options_.every_rounds > 0) {
    MEND_RETURN_IF_ERROR(CheckCheckpointDirectory(options_.dir));
  }
  std::optional<Restored> restored;
  if (!options_.resume_from.empty()) {
    StatusOr<Checkpoint> checkpoint = ReadCheckpoint(options_.resume_from, options_.secret);
    if (!checkpoint.ok()) {
      return Annotate(checkpoint.status(),
                      fmt::format("resume_from = \"{}\"", options_.resume_from));
    }
    MEND_ASSIGN_OR_RETURN(restored, ResumeWith(*checkpoint, options_.resume_from));
  } else if (!options_.dir.empty() && options_.resume) {
    MEND_RETURN_IF_ERROR(Resume(&restored));
  }
  if (options_.dir.empty() && options_.resume_from.empty()) return restored;
  // A group's ranks each resumed their slice (from the same file, shared by
  // the rack's hosts): the same checkpoint everywhere, then into every replica.
  MEND_RETURN_IF_ERROR(
      policy_.AgreeOnRestored(restored ? restored->round_id : 0, "resumed from",
                              "they must all see the same checkpoint_dir (or resume_from file)"));
  return restored;
}

// The newest checkpoint in checkpoint_dir that verifies (in a group, the
// one rank 0 found: ResumeRound); none is a fresh start. Checkpoints that
// are all damaged are refused, not passed over: a fresh start would drop the
// job's progress, and checkpoint_keep would then delete the damaged files
// (what a repair could start from).
Status OuterState::Resume(std::optional<Restored>* restored) {
  CheckpointDirectory directory(options_.dir, options_.keep, options_.secret);
  std::vector<std::string> skipped;
  StatusOr<Checkpoint> checkpoint = directory.LoadLatest(&skipped);
  for (const std::string& why : skipped) spdlog::error("skipping a damaged checkpoint: {}", why);
  if (!checkpoint.ok()) {
    if (checkpoint.status().code() != absl::StatusCode::kNotFound) return checkpoint.status();
    if (!skipped.empty()) {
      return DataLossError(fmt::format(
          "checkpoint_dir {}: none of its {} checkpoint(s) verifies ({}); they are left as they "
          "are. To start the job fresh, move them away; to resume from another file, set "
          "resume_from = PATH",
          options_.dir, skipped.size(), fmt::join(skipped, "; ")));
    }
  }
  const uint64_t newest = checkpoint.ok() ? checkpoint->meta.round_id : 0;
  MEND_ASSIGN_OR_RETURN(const uint64_t round, policy_.ResumeRound(newest));
  if (round != newest) {
    spdlog::info("group rank 0 resumes from round {} where this rank found {}; so does this one",
                 round, newest);
    if (round == 0) return OkStatus();  // rank 0 found none: a fresh start, as on rank 0
    checkpoint = ReadCheckpoint(directory.PathOf(round), options_.secret);
    if (!checkpoint.ok()) {
      return Annotate(checkpoint.status(),
                      fmt::format("checkpoint_dir {}: group rank 0 resumes from round {}; this "
                                  "rank cannot read it (every rank must see the same directory)",
                                  options_.dir, round));
    }
  }
  if (!checkpoint.ok()) {
    WarnOfOtherFiles();
    return OkStatus();
  }
  MEND_ASSIGN_OR_RETURN(*restored, ResumeWith(*checkpoint, options_.dir));
  return OkStatus();
}

StatusOr<std::optional<Restored>> OuterState::TakeFinal(uint64_t final_step) {
  if (options_.dir.empty()) return std::nullopt;
  CheckpointDirectory directory(options_.dir, options_.keep, options_.secret);
  std::vector<std::string> skipped;
  StatusOr<Checkpoint> checkpoint = directory.LoadLatest(&skipped);
  for (const std::string& why : skipped) spdlog::error("skipping a damaged checkpoint: {}", why);
  if (!checkpoint.ok() || checkpoint->meta.step < final_step) return std::nullopt;
  MEND_ASSIGN_OR_RETURN(Restored restored, ResumeWith(*checkpoint, options_.dir));
  return restored;
}

void OuterState::ParametersToGlobal() {
  for (Fragment& fragment : book_.fragments()) book_.Scatter(fragment.state->global(), fragment);
}

// A checkpoint (from `where`) becomes the state this learner resumes at.
StatusOr<Restored> OuterState::ResumeWith(const Checkpoint& checkpoint, const std::string& where) {
  MEND_ASSIGN_OR_RETURN(Restored restored, Restore(checkpoint, where));
  spdlog::info("resumed from {}: round {} (step {}, written by {})", where,
               checkpoint.meta.round_id, checkpoint.meta.step, checkpoint.meta.written_by);
  return restored;
}

// No checkpoint in checkpoint_dir: a fresh start, said louder when the
// directory holds other files (one saved under a name of the user's?).
void OuterState::WarnOfOtherFiles() const {
  std::vector<std::string> others;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(options_.dir, error)) {
    if (others.size() == 5) break;
    others.push_back(entry.path().filename().string());
  }
  if (others.empty()) {
    spdlog::info("no checkpoint in {}: starting fresh", options_.dir);
    return;
  }
  spdlog::warn(
      "checkpoint_dir {} holds no checkpoint named ckpt-<round, 12 digits>.mend (it has {}{}); "
      "starting fresh. To resume from a file of another name, set resume_from = PATH",
      options_.dir, fmt::join(others, ", "), others.size() == 5 ? ", ..." : "");
}

// `checkpoint` becomes every fragment's global state and momentum, the
// local parameters, the last round and the step. `where` names it in errors.
StatusOr<Restored> OuterState::Restore(const Checkpoint& checkpoint, const std::string& where) {
  MEND_ASSIGN_OR_RETURN(auto states,
                        FragmentStates(checkpoint, parameters_, book_.fragments(), where));
  for (size_t f = 0; f < book_.size(); ++f) {
    Fragment& fragment = book_.at(static_cast<int>(f));
    fragment.state->Assign(states[f].first, states[f].second);
    book_.Scatter(fragment.state->global(), fragment);
  }
  return RestoredAt(checkpoint.meta.round_id, checkpoint.meta.step, checkpoint.meta.step);
}

// INVALID_ARGUMENT (said as `call`'s, with `advice`) unless `meta` holds an
// exporting learner's progress for every fragment of this one's.
Status OuterState::CheckProgress(const CheckpointMeta& meta, std::string_view call,
                                 std::string_view advice) const {
  if (meta.learner_step != 0 && meta.tokens_since_round.size() == book_.size()) return OkStatus();
  return InvalidArgumentError(fmt::format(
      "{}: the state of round {} holds no learner's progress for {} fragment(s) (it has {}: a "
      "checkpoint file, or another fragment count?){}",
      call, meta.round_id, book_.size(), meta.tokens_since_round.size(), advice));
}

// This learner's own step and tokens since each fragment's round, into an
// export's description (what CheckProgress asks of an import).
void OuterState::AddProgress(const Progress& progress, CheckpointMeta* meta) const {
  meta->learner_step = std::max<uint64_t>(progress.step, 1);
  meta->tokens_since_round.clear();
  for (const Fragment& fragment : book_.fragments())
    meta->tokens_since_round.push_back(fragment.tokens_since_round);
}

// An exported state as the exporting learner left it: the global state,
// momentum and error feedback, the round, its step and tokens since each
// fragment's round; the parameters stay the caller's (restored with the
// model's own state).
StatusOr<Restored> OuterState::RestoreOuter(const Checkpoint& checkpoint) {
  const CheckpointMeta& meta = checkpoint.meta;
  MEND_RETURN_IF_ERROR(CheckProgress(meta, "import_state(keep_parameters)",
                                     "; import it with its parameters instead"));
  const std::vector<Fragment>& fragments = book_.fragments();
  MEND_ASSIGN_OR_RETURN(auto states,
                        FragmentStates(checkpoint, parameters_, fragments, "(imported state)"));
  const auto residuals = FragmentResiduals(checkpoint, parameters_, fragments);
  for (size_t f = 0; f < book_.size(); ++f) {
    Fragment& fragment = book_.at(static_cast<int>(f));
    fragment.state->Assign(states[f].first, states[f].second);
    if (!residuals[f].empty()) fragment.state->AssignResidual(residuals[f]);
    fragment.tokens_since_round = meta.tokens_since_round[f];
  }
  return RestoredAt(meta.round_id, meta.learner_step, meta.step);
}

// After a restore: the last round is `round_id`, the learner is at `step`,
// and the global state is of `state_step` (see FragmentBook::StateStep).
Restored OuterState::RestoredAt(uint64_t round_id, uint64_t step, uint64_t state_step) {
  restored_step_ = state_step;
  for (Fragment& fragment : book_.fragments()) fragment.last_round_boundary = 0;
  return {round_id, step};
}

// The whole model's outer state now, for the caller's `call` (of a `what`:
// in a group a collective of its ranks, null on ranks other than 0).
StatusOr<std::shared_ptr<Checkpoint>> OuterState::Whole(const Progress& progress,
                                                        std::string_view call,
                                                        std::string_view what) {
  book_.AwaitPrefault();
  StatusOr<std::shared_ptr<Checkpoint>> whole = Snapshot(progress, 0);
  if (whole.ok()) return whole;
  return Annotate(whole.status(),
                  fmt::format("{}: a multi-rank learner's {} is collective (every rank of the "
                              "group calls it at the same step)",
                              call, what));
}

StatusOr<std::string> OuterState::Export(const Progress& progress) {
  MEND_ASSIGN_OR_RETURN(std::shared_ptr<Checkpoint> whole,
                        Whole(progress, "export_state", "export"));
  if (!whole) return std::string();
  Checkpoint& checkpoint = *whole;
  policy_.AddOwnState(book_, &checkpoint);
  AddProgress(progress, &checkpoint.meta);
  return EncodeCheckpoint(checkpoint, options_.secret);
}

StatusOr<Restored> OuterState::Import(std::string_view bytes, bool keep_parameters) {
  book_.AwaitPrefault();
  MEND_ASSIGN_OR_RETURN(Checkpoint checkpoint,
                        DecodeCheckpoint(bytes, "(imported state)", options_.secret));
  MEND_ASSIGN_OR_RETURN(Restored restored, keep_parameters
                                               ? RestoreOuter(checkpoint)
                                               : Restore(checkpoint, "(imported state)"));
  spdlog::info(
      "imported the outer state of round {} (step {}, written by {}){}", checkpoint.meta.round_id,
      checkpoint.meta.step, checkpoint.meta.written_by,
      keep_parameters ? fmt::format("; going on at its learner's step {}", restored.step) : "");
  MEND_RETURN_IF_ERROR(policy_.AgreeOnRestored(restored.round_id, "imported",
                                               "every rank must import the same state"));
  return restored;
}

StatusOr<std::string> OuterState::ExportOwn(const Progress& progress, std::span<float> global,
                                            std::span<float> momentum) {
  book_.AwaitPrefault();
  std::vector<float> slice_global(book_.values()), slice_momentum(book_.values());
  book_.CopyStateOut(slice_global, slice_momentum);
  MEND_RETURN_IF_ERROR(policy_.OwnValues(slice_global, global));
  MEND_RETURN_IF_ERROR(policy_.OwnValues(slice_momentum, momentum));
  Checkpoint described = Described(progress, 0);
  AddProgress(progress, &described.meta);
  return EncodeCheckpoint(described, options_.secret);
}

StatusOr<Restored> OuterState::ImportOwn(std::string_view described, std::span<const float> global,
                                         std::span<const float> momentum) {
  book_.AwaitPrefault();
  MEND_ASSIGN_OR_RETURN(Checkpoint checkpoint,
                        DecodeCheckpoint(described, "(imported state)", options_.secret));
  const CheckpointMeta& meta = checkpoint.meta;
  MEND_RETURN_IF_ERROR(CheckProgress(meta, "import_own_state", ""));
  std::vector<float> slice_global(book_.values()), slice_momentum(book_.values());
  policy_.SliceValues(global, slice_global);
  policy_.SliceValues(momentum, slice_momentum);
  book_.AssignState(slice_global, slice_momentum);
  for (size_t f = 0; f < book_.size(); ++f)
    book_.at(static_cast<int>(f)).tokens_since_round = meta.tokens_since_round[f];
  spdlog::info("imported this rank's outer state of round {} (written by {}); going on at step {}",
               meta.round_id, meta.written_by, meta.learner_step);
  const Restored restored = RestoredAt(meta.round_id, meta.learner_step, meta.step);
  MEND_RETURN_IF_ERROR(policy_.AgreeOnRestored(restored.round_id, "imported",
                                               "every rank must import the same state"));
  return restored;
}

// A checkpoint's description, without tensors.
Checkpoint OuterState::Described(const Progress& progress, uint32_t members) const {
  Checkpoint checkpoint;
  checkpoint.meta.job_id = options_.job_id;
  checkpoint.meta.round_id = progress.round_id;
  checkpoint.meta.step = book_.StateStep(restored_step_);
  checkpoint.meta.tokens = progress.tokens;
  checkpoint.meta.fragments = static_cast<int64_t>(book_.size());
  checkpoint.meta.learners = members;
  checkpoint.meta.written_by = learner_id_;
  checkpoint.meta.created_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count();
  checkpoint.meta.config_toml = options_.config_toml;
  return checkpoint;
}

// Every fragment's global state and momentum, by parameter name; in a group
// a collective (null on ranks other than 0; its failure breaks the group).
StatusOr<std::shared_ptr<Checkpoint>> OuterState::Snapshot(const Progress& progress,
                                                           uint32_t members) {
  return policy_.Snapshot(book_, Described(progress, members));
}

// In a group a collective: every rank calls it at the same step (between
// the same two step() calls), and rank 0 writes the whole model to its `path`.
Status OuterState::Save(const std::string& path, const Progress& progress) {
  MEND_ASSIGN_OR_RETURN(std::shared_ptr<Checkpoint> whole,
                        Whole(progress, "SaveCheckpoint", "checkpoint"));
  return whole ? WriteCheckpoint(path, *whole, options_.secret) : OkStatus();
}

// Rank 0 of a round whose id is a multiple of checkpoint_every_rounds (or
// `always`: the final merge's last round) writes one, on a background
// thread (one write at a time). In a group every rank of that learner
// gathers the slices and its rank 0 writes the whole model, by parameter
// name: one file, which any group size and fragment count reads.
Status OuterState::MaybeCheckpoint(const Progress& progress, uint32_t rank, uint32_t members,
                                   bool always) {
  if (options_.dir.empty() || options_.every_rounds == 0 || rank != 0 ||
      (!always && progress.round_id % options_.every_rounds != 0)) {
    return OkStatus();
  }
  MEND_ASSIGN_OR_RETURN(std::shared_ptr<Checkpoint> whole, Snapshot(progress, members));
  if (whole) writer_.Write(std::move(whole));
  return OkStatus();
}

}  // namespace mend::reducer
