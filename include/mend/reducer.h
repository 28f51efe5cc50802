// mend::Reducer: what a LibTorch training loop attaches to (docs/
// architecture.md, "Reducer"). It works on named parameter tensors it does not own, written
// in place, and reads the inner optimizer's moments through InnerMoments;
// the torch::nn::Module overload of Create adapts a C++ module and its
// Adam/AdamW. The loop calls step(tokens) after each inner optimizer step;
// every sync_period_steps (per fragment, staggered) the reducer joins a
// quorum round through the learner agent, builds the round's communicator,
// merges the pseudo-gradients (token-weighted, robust, through the codec),
// applies the outer Nesterov step to the global parameters, and puts them in
// the model.
//
// With concurrent_outer_step the round's exchange runs on a background thread
// while training goes on, and its result is applied on top of the local
// progress (outer_apply: exact, or mixed by mixing_alpha) at the first step
// after it has arrived, and at the latest tau steps after the boundary
// (overlap_steps, or tuned from the measured round and step times when it
// is 0), where step() waits for it; otherwise step() waits at once. With desloc the inner Adam
// moments are averaged too. A learner that is behind (it missed a round, or is new) heals the
// global state from the source the lighthouse names before the exchange, and its pseudo-gradient
// stays relative to the base it trained from; a learner with nothing of the
// job's state (new, or restarted without a checkpoint) takes part in its
// first round with weight 0 and drops what it trained. By option
// (heal_inner_optimizer) the source's inner Adam moments come with the heal. On the first round
// every member takes rank 0's global state, so learners that started from different initial
// parameters agree from then on; when they all hold the same state already (same seed or
// checkpoint: their digests, compared through the round's store, agree) nothing is sent. A round
// that fails (no quorum in time, a member died mid-exchange) changes nothing in the global state:
// the learner keeps its local progress and brings it to the next one.
//
// Checkpoints (checkpoint_dir): with resume = true, Create() loads the newest
// checkpoint there that verifies (skipping damaged ones) into the global
// state and the module, and the learner joins its first round as having
// completed the checkpoint's round; a learner without it heals from one
// that has it. The checkpoint names tensors by parameter name, so a job
// resumes with any number of learners and any fragment count.
//
// Thread-safety: step(), SaveCheckpoint() and shutdown() from the training
// thread only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "mend/config.h"
#include "mend/inner_moments.h"
#include "mend/learner_agent.h"
#include "mend/reducer_stats.h"
#include "mend/status.h"

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace mend {

// Parameters by name, in a fixed order (the order every learner of the job
// uses: it decides the fragments and the checkpoint's tensor names).
using NamedParameters = std::vector<std::pair<std::string, at::Tensor>>;

class Reducer {
 public:
  // The parameters' tensors are shared with the caller (the reducer writes
  // them in place at round boundaries and never copies them on other
  // steps); `moments` may be null unless desloc or heal_inner_optimizer is
  // on. `agent` is not owned and must outlive the reducer. The parameters
  // must be dense, contiguous fp32 CPU tensors with distinct names, at
  // least one; INVALID_ARGUMENT names the first that is not, or a bad
  // configuration value. With desloc = true, fragments must be 1 and the
  // moment periods multiples of
  // sync_period_steps (the moments travel with a round: K_u / H and K_v / H
  // rounds apart, decided by the round id so that all members agree).
  //
  // `start_step` is the inner steps already done when this learner (re)joins
  // a job in progress (0: a fresh start); a checkpoint it resumes from sets
  // the step instead. Either way stats().steps starts there, and when a
  // heal finds it behind (its first round, or a fragment period or more
  // behind) it becomes the source's step (plus the steps since the boundary):
  // a training loop follows stats().steps to stay on the job's schedule.
  // (Each Create takes a ValidConfig as it is, and checks a Config first.)
  [[nodiscard]] static StatusOr<std::unique_ptr<Reducer>> Create(
      const ValidConfig& config, NamedParameters parameters, std::unique_ptr<InnerMoments> moments,
      LearnerAgent& agent, uint64_t start_step = 0);
  [[nodiscard]] static StatusOr<std::unique_ptr<Reducer>> Create(
      const Config& config, NamedParameters parameters, std::unique_ptr<InnerMoments> moments,
      LearnerAgent& agent, uint64_t start_step = 0);
  // The adapter for a C++ module: its named_parameters(), and the moments of
  // `optimizer` (the inner one) when it is torch::optim::Adam or AdamW (it
  // must be, for desloc or heal_inner_optimizer). `module` and `optimizer`
  // are not owned and must outlive the reducer.
  [[nodiscard]] static StatusOr<std::unique_ptr<Reducer>> Create(const ValidConfig& config,
                                                                 torch::nn::Module& module,
                                                                 torch::optim::Optimizer& optimizer,
                                                                 LearnerAgent& agent,
                                                                 uint64_t start_step = 0);
  [[nodiscard]] static StatusOr<std::unique_ptr<Reducer>> Create(const Config& config,
                                                                 torch::nn::Module& module,
                                                                 torch::optim::Optimizer& optimizer,
                                                                 LearnerAgent& agent,
                                                                 uint64_t start_step = 0);
  // Call shutdown() first: destroying a reducer without it calls off the
  // round in flight (interrupting `agent`) and drops its result.
  virtual ~Reducer() = default;

  // After each inner optimizer step, with the tokens that step processed.
  // Returns an error only for what the caller must act on (a fatal refusal
  // from the lighthouse); failed rounds are counted, logged and survived.
  [[nodiscard]] virtual Status step(uint64_t tokens) = 0;
  // Whether the next step() may wait for a round (it starts or applies one);
  // when false it returns after bookkeeping, with no network wait. Front ends
  // that must stay interruptible (Python's Ctrl-C) wait differently for those.
  virtual bool NextStepMayWait() const = 0;
  // Whether this learner's newest join in flight has formed a round (its
  // quorum answered) by now; false with none in flight. The training thread
  // acts on it only at a step (tests, diagnostics: a boundary reached before
  // the answer trains on and skips its round).
  virtual bool NewestJoinFormed() const = 0;
  // Leaves the job. Idempotent.
  virtual Status shutdown() = 0;

  // Writes the global state of every fragment (parameters and outer
  // momentum, by parameter name) to `path` now, atomically. On demand; the
  // periodic ones (checkpoint_every_rounds) are written by rank 0 of a round
  // in the background. For a learner of several ranks (group_size > 1) it is
  // collective: every rank calls it at the same step, the ranks gather their
  // slices, and group rank 0 writes the whole model to its `path`.
  [[nodiscard]] virtual Status SaveCheckpoint(const std::string& path) = 0;

  virtual ReducerStats stats() const = 0;
  // The global parameters of fragment `f` as of the last round (tests,
  // diagnostics).
  virtual std::span<const float> global(int fragment) const = 0;
  virtual int fragments() const = 0;
};

}  // namespace mend
