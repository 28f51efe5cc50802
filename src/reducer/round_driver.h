// The round driver: everything a reducer does with a model's parameters,
// on flat fp32 values and without LibTorch (the LibTorch adapter,
// reducer.cc, validates the tensors and forwards to it). It holds the
// fragment layout and each fragment's global state, runs the round state
// machine (a round per fragment boundary, in the background in concurrent
// mode, applied on arrival and waited for at boundary + tau), heals from the
// source the lighthouse names, averages DES-LOC moments, resumes from and
// writes checkpoints, and writes diagnostics; see mend/reducer.h for the
// semantics. Time comes from an injected Clock (step and round times, and
// tau, which is derived from them).
//
// Thread-safety: step(), SaveCheckpoint() and shutdown() from the training
// thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mend/clock.h"
#include "mend/learner_agent.h"
#include "mend/reducer_stats.h"
#include "mend/status.h"
#include "reducer/flat_state.h"
#include "reducer/round_options.h"
#include "reducer/round_services.h"

namespace mend::reducer {

// The "parameters=..." entry of a learner's shared settings
// (LearnerIdentity::job_settings): how many tensors and values it exchanges,
// and a digest of their shapes in order (a merge pairs them by position).
// The lighthouse refuses a learner of another model at registration, naming
// both, instead of every round failing or healing from garbage.
std::string ParametersSetting(const std::vector<std::vector<int64_t>>& shapes);

// What the next step() does, as PlanStep() finds it.
struct StepPlan {
  bool may_wait = false;            // it starts or applies a round (and may wait for one)
  bool touches_parameters = false;  // it may read or write the parameters and moments
  // It may write them (else it only reads them: a concurrent round's
  // launch with nothing in flight and no provisional step, whose snapshot a
  // front end that stages may take up to the next optimizer step).
  bool may_write = false;
  // It launches a concurrent round that is due at the step after it (tau
  // <= 1): made at the next optimizer step, that round would overlap no
  // step, so a front end makes it now.
  bool launch_due_next = false;
  // By fragment: 1 where the step may read or write that fragment's
  // parameters (all 0 unless touches_parameters).
  std::vector<uint8_t> fragments;
};

class RoundDriver {
 public:
  // `moments` may be null unless desloc or heal_inner_optimizer is on.
  // `agent` and `clock` are not owned and must outlive the driver. The rounds
  // go through `services` (tests: fakes), or, when null, through the
  // lighthouse's (LighthouseRoundServices over `agent` and `clock`); in a
  // group, through its ranks' shared decisions over them. The checkpoints
  // are authenticated with the agent's checkpoint_secret().
  // INVALID_ARGUMENT for a codec that cannot be made, no parameters, or a
  // checkpoint that does not fit the model.
  [[nodiscard]] static StatusOr<std::unique_ptr<RoundDriver>> Create(
      RoundDriverOptions options, LearnerAgent& agent, const Clock& clock,
      std::unique_ptr<FlatParameters> parameters, std::unique_ptr<FlatMoments> moments,
      uint64_t start_step, std::unique_ptr<RoundServices> services = nullptr);
  // Without shutdown(): a round in flight is called off and dropped.
  virtual ~RoundDriver() = default;

  [[nodiscard]] virtual Status step(uint64_t tokens) = 0;
  [[nodiscard]] virtual Status shutdown() = 0;
  virtual bool NextStepMayWait() const = 0;
  // Whether the newest join in flight has formed a round (see Reducer).
  virtual bool NewestJoinFormed() const = 0;
  // The plan of the next step(), fixed by this call: a round that arrives
  // after it is taken up at a later step, so a front end that stages the
  // parameters (host_staging) copies them in only for steps that touch them.
  virtual StepPlan PlanStep() = 0;
  virtual ReducerStats stats() const = 0;
  virtual std::span<const float> global(int fragment) const = 0;
  virtual int fragments() const = 0;
  [[nodiscard]] virtual Status SaveCheckpoint(const std::string& path) = 0;
  // sync_buffers: the model's buffers (BatchNorm's running statistics),
  // averaged over a round's members with its weights, or (integer buffers
  // carried as floats: `from_first_member`) taken from its first member, at
  // every round, so every member ends it with the same values. Before the
  // first step; FAILED_PRECONDITION after.
  [[nodiscard]] virtual Status SetBuffers(bool from_first_member,
                                          std::unique_ptr<FlatParameters> buffers) = 0;
  // The outer state (every fragment's global parameters and momentum, the
  // round and step) as checkpoint bytes; in a group collective, with the
  // whole model on rank 0 and empty bytes elsewhere.
  [[nodiscard]] virtual StatusOr<std::string> ExportState() = 0;
  // Makes exported bytes (or a checkpoint file's) the global state, between
  // rounds; in a group every rank imports the same bytes at the same step.
  // Without `keep_parameters` they become the local parameters too and the
  // step is the state's; with it the parameters stay as they are (restored
  // by the caller) and the exporting learner's step, tokens since its
  // rounds and error feedback come back: the job goes on exactly.
  [[nodiscard]] virtual Status ImportState(std::string_view bytes, bool keep_parameters) = 0;
  // This rank's own outer state, for a sharded model's checkpoint (each
  // rank saves its own shards, as torch.distributed.checkpoint does): the
  // global state and momentum of every parameter this rank holds
  // (OwnValues() of each, in its parameters' order) into `global` and
  // `momentum`; returns the state's description (round, steps, tokens) as
  // checkpoint bytes without tensors. In a group a collective on every
  // rank (the values of parameters ranks share are gathered among them).
  virtual size_t OwnValues() const = 0;
  [[nodiscard]] virtual StatusOr<std::string> ExportOwn(std::span<float> global,
                                                        std::span<float> momentum) = 0;
  // ExportOwn's three back, between rounds, at the same step on every rank
  // of a group; the parameters stay the caller's, and the exporting
  // learner's step and tokens since its rounds come back (as ImportState
  // with keep_parameters). The values may come from a checkpoint of
  // another rank count, resharded: each rank's own are what it holds now.
  [[nodiscard]] virtual Status ImportOwn(std::string_view described, std::span<const float> global,
                                         std::span<const float> momentum) = 0;
};

}  // namespace mend::reducer
