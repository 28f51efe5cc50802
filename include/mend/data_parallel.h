// mend::DataParallel: the DDP baseline, through the same data plane as the
// reducer, for comparisons: the gradients are averaged across learners after
// every backward pass (token-weighted like the reducer's merge, or uniform),
// so every learner takes the same optimizer step on the same parameters.
//
// It forms one round with quorum_min_learners learners at the start, keeps
// that round's communicator for the whole run and starts everyone from rank
// 0's parameters. Like DDP it cannot lose a member: an error on any step
// (a peer died, a collective timed out) is returned and the run is over.
//
// Thread-safety: from the training thread only.
#pragma once

#include <cstdint>
#include <memory>

#include "mend/config.h"
#include "mend/learner_agent.h"
#include "mend/status.h"
#include "torch/nn/module.h"

namespace mend {

struct DataParallelStats {
  uint64_t steps = 0;
  uint64_t bytes_sent = 0;
  uint32_t rank = 0;
  uint32_t world_size = 0;
};

class DataParallel {
 public:
  // Joins the first round (waiting up to quorum_timeout_ms), connects and
  // broadcasts rank 0's parameters. `module` and `agent` are not owned and
  // must outlive it; parameters must be dense fp32 CPU tensors.
  [[nodiscard]] static StatusOr<std::unique_ptr<DataParallel>> Create(const Config& config,
                                                                      torch::nn::Module& module,
                                                                      LearnerAgent& agent);
  // The same inside a multi-rank learner (config.group_size > 1): the ranks
  // of `agent`'s learner, rank config.group_rank, on a communicator of
  // their own (rendezvous in the lighthouse's store; no round, no emulated
  // link), starting from group rank 0's parameters. What mend train runs
  // inside a group in place of the user's DDP; shutdown() does not leave.
  [[nodiscard]] static StatusOr<std::unique_ptr<DataParallel>> CreateInGroup(
      const Config& config, torch::nn::Module& module, LearnerAgent& agent);
  virtual ~DataParallel() = default;

  // Between backward() and the optimizer step: every parameter's gradient
  // becomes the members' weighted average (a missing gradient counts as 0).
  [[nodiscard]] virtual Status AverageGradients(uint64_t tokens) = 0;
  virtual Status shutdown() = 0;
  virtual DataParallelStats stats() const = 0;
  // In a group: asks every rank to stop after the next AverageGradients(),
  // whose StopAgreed() then is true on all of them (the ranks of a group
  // must stop at the same step, or one waits on the others' collective).
  virtual void RequestStop() = 0;
  virtual bool StopAgreed() const = 0;
  // In a group: asks every rank to write a checkpoint (collective:
  // Reducer::SaveCheckpoint) after the next AverageGradients(), whose
  // CheckpointAgreed() then is true on all of them, for that step only.
  virtual void RequestCheckpoint() = 0;
  virtual bool CheckpointAgreed() const = 0;
};

}  // namespace mend
