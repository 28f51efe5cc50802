// A learner session: what every front end (mend train, the C ABI, the group
// benchmark) does to start one learner, of one rank or one rank of a group:
// check the data-plane host, open the group's own store, register with the
// lighthouse under the job's settings and the model's layout (LearnerAgent),
// and build the round driver over the caller's parameters. A rank that
// cannot start tells the group's other ranks why (TellGroupRanks), which
// would otherwise wait for it until quorum_timeout_ms.
//
// Thread-safety: Start() returns a session owned by the training thread;
// agent() is the LearnerAgent, with that class's rules.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mend/agent_options.h"
#include "mend/clock.h"
#include "mend/learner_agent.h"
#include "mend/status.h"
#include "reducer/flat_state.h"
#include "reducer/round_driver.h"
#include "reducer/round_options.h"

namespace mend::reducer {

struct LearnerSessionOptions {
  std::string learner_id;
  std::string token;
  // Every wait of the agent, the group's store and the driver is on it. Not
  // owned; it must outlive the session.
  const Clock* clock = nullptr;
  // The model's parameter shapes in order (ParametersSetting): a learner of
  // another model is refused at registration, naming both.
  std::vector<std::vector<int64_t>> parameter_shapes;
  // More "key=value" settings every learner of the job must share.
  std::vector<std::string> job_settings;
};

class LearnerSession {
 public:
  // Registers learner `options.learner_id` (its agent, of `agent`, starts;
  // an unreachable lighthouse is retried in the background, a fatal refusal
  // returned); `driver` is what CreateDriver makes its rounds of. A front end
  // makes both of a checked configuration (AgentOptionsOf,
  // RoundDriverOptionsOf). INVALID_ARGUMENT for a data-plane host that is not
  // an address; the group's store's and the agent's errors as they are.
  // Whatever the error, a rank of a group first tells the others.
  [[nodiscard]] static StatusOr<std::unique_ptr<LearnerSession>> Start(
      AgentOptions agent, RoundDriverOptions driver, LearnerSessionOptions options);
  ~LearnerSession();
  LearnerSession(const LearnerSession&) = delete;
  LearnerSession& operator=(const LearnerSession&) = delete;

  LearnerAgent& agent() { return *agent_; }

  // The round driver over `parameters` (RoundDriver::Create, on the
  // session's driver options and clock); it must not outlive the session. On error,
  // Fail().
  [[nodiscard]] StatusOr<std::unique_ptr<RoundDriver>> CreateDriver(
      std::unique_ptr<FlatParameters> parameters, std::unique_ptr<FlatMoments> moments,
      uint64_t start_step);

  // For what a front end builds on the agent itself (a LibTorch reducer, a
  // group's gradient average) and fails: the agent leaves the lighthouse,
  // saying so, and a rank of a group tells the others. Returns `why`.
  [[nodiscard]] Status Fail(Status why);

 private:
  LearnerSession(AgentOptions agent, RoundDriverOptions driver, LearnerSessionOptions options);

  const AgentOptions agent_options_;
  const RoundDriverOptions driver_options_;
  const LearnerSessionOptions options_;
  std::unique_ptr<LearnerAgent> agent_;
};

}  // namespace mend::reducer
