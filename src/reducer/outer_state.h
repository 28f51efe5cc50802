// The outer state beside the round driver: the fragment book (every
// fragment's global parameters and momentum, which the rounds change), and
// what is done with it outside the rounds: resume at the start, restore,
// export and import, and checkpoints with their background writer. The
// driver keeps the learner's step and last round; a restore tells it where
// the learner is now (Restored), and an export or checkpoint is told where
// it is (Progress).
//
// In a group, resume, import, export and checkpoints are collectives of its
// ranks (through the policy): every rank calls them at the same step.
//
// Thread-safety: the training thread only (the checkpoint writer has a
// thread of its own; the rounds' threads read the book, see fragment_book.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "core/parallel.h"
#include "mend/checkpoint.h"
#include "mend/status.h"
#include "reducer/flat_state.h"
#include "reducer/fragment_book.h"
#include "reducer/fragment_checkpoint.h"
#include "reducer/group_policy.h"
#include "reducer/round_options.h"

namespace mend::reducer {

// Where a restore left the learner: its last round and its step.
struct Restored {
  uint64_t round_id = 0;
  uint64_t step = 0;
};

// The learner's progress, as an export or a checkpoint records it.
struct Progress {
  uint64_t step = 0;      // the learner's step
  uint64_t round_id = 0;  // its last round
  uint64_t tokens = 0;    // its tokens in all
};

class OuterState {
 public:
  // Lays `parameters` (not owned) out in `schedule`'s fragments (see
  // FragmentBook); `policy` (not owned) makes a group's collectives.
  // `learner_id` signs its checkpoints.
  OuterState(CheckpointOptions options, FlatParameters& parameters,
             const FragmentSchedule& schedule, uint64_t* copies, ThreadPool& pool,
             ReplicaState& policy, std::string learner_id);
  // Waits for a checkpoint being written.
  ~OuterState();

  FragmentBook& book() { return book_; }
  const FragmentBook& book() const { return book_; }
  // The step the global state was started at (Start) or last restored at
  // (what FragmentBook::StateStep counts from).
  uint64_t restored_step() const { return restored_step_; }

  // At the start, at step `start_step`: resume_from's file, else (resume)
  // the newest checkpoint in checkpoint_dir that verifies; in a group every
  // rank must have restored the same round. nullopt: a fresh start.
  StatusOr<std::optional<Restored>> Start(uint64_t start_step);
  // The newest checkpoint in checkpoint_dir when it holds the job's state at
  // `final_step` or later (the job's final round wrote it): it becomes the
  // global state and the parameters. nullopt when there is none (no
  // checkpoint_dir, or its newest is of an earlier step). In a group every
  // rank takes its slice of the same file.
  StatusOr<std::optional<Restored>> TakeFinal(uint64_t final_step);
  // Every fragment's global state into the parameters.
  void ParametersToGlobal();
  // The outer state as checkpoint bytes (empty on a group's ranks other than 0).
  StatusOr<std::string> Export(const Progress& progress);
  // Exported bytes (or a checkpoint file's) become the global state; see
  // RoundDriver::ImportState.
  StatusOr<Restored> Import(std::string_view bytes, bool keep_parameters);
  // This rank's own outer state: the global state and momentum of every
  // parameter it holds (OwnCount() values each, in its model's order) into
  // `global` and `momentum`, and the state's description as checkpoint
  // bytes without tensors (the round, steps and tokens, as Export's). In a
  // group a collective, on every rank: a sharded model's ranks each give
  // their own shards. See RoundDriver::ExportOwn.
  StatusOr<std::string> ExportOwn(const Progress& progress, std::span<float> global,
                                  std::span<float> momentum);
  // ExportOwn's three back: the parameters stay the caller's, as Import's
  // keep_parameters.
  StatusOr<Restored> ImportOwn(std::string_view described, std::span<const float> global,
                               std::span<const float> momentum);
  size_t OwnCount() const { return policy_.OwnCount(book_); }
  // The whole model's outer state into `path` (rank 0 of a group writes it).
  Status Save(const std::string& path, const Progress& progress);
  // After round `progress.round_id` (of `members`, this learner's `rank` in
  // it): a checkpoint on the writer's thread when it is due (every
  // checkpoint_every_rounds, or `always`), by the round's rank 0.
  Status MaybeCheckpoint(const Progress& progress, uint32_t rank, uint32_t members, bool always);

  uint64_t written() const { return writer_.written(); }
  uint64_t failed() const { return writer_.failed(); }
  void Join() { writer_.Join(); }

 private:
  Status Resume(std::optional<Restored>* restored);
  StatusOr<Restored> ResumeWith(const Checkpoint& checkpoint, const std::string& where);
  void WarnOfOtherFiles() const;
  StatusOr<Restored> Restore(const Checkpoint& checkpoint, const std::string& where);
  StatusOr<Restored> RestoreOuter(const Checkpoint& checkpoint);
  Restored RestoredAt(uint64_t round_id, uint64_t step, uint64_t state_step);
  Status CheckProgress(const CheckpointMeta& meta, std::string_view call,
                       std::string_view advice) const;
  void AddProgress(const Progress& progress, CheckpointMeta* meta) const;
  Checkpoint Described(const Progress& progress, uint32_t members) const;
  StatusOr<std::shared_ptr<Checkpoint>> Snapshot(const Progress& progress, uint32_t members);
  StatusOr<std::shared_ptr<Checkpoint>> Whole(const Progress& progress, std::string_view call,
                                              std::string_view what);

  const CheckpointOptions options_;
  FlatParameters& parameters_;
  ReplicaState& policy_;
  const std::string learner_id_;
  FragmentBook book_;
  uint64_t restored_step_ = 0;
  CheckpointWriter writer_;
};

}  // namespace mend::reducer
