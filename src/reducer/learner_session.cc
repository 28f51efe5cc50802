#include "reducer/learner_session.h"

#include <utility>

#include "learner/group_ranks.h"
#include "mend/communicator.h"
#include "mend/group_store.h"

namespace mend::reducer {

LearnerSession::LearnerSession(AgentOptions agent, RoundDriverOptions driver,
                               LearnerSessionOptions options)
    : agent_options_(std::move(agent)),
      driver_options_(std::move(driver)),
      options_(std::move(options)) {}

LearnerSession::~LearnerSession() = default;

StatusOr<std::unique_ptr<LearnerSession>> LearnerSession::Start(AgentOptions agent_options,
                                                                RoundDriverOptions driver,
                                                                LearnerSessionOptions options) {
  if (options.clock == nullptr) return InvalidArgumentError("LearnerSession: no clock");
  std::unique_ptr<LearnerSession> session(
      new LearnerSession(std::move(agent_options), std::move(driver), std::move(options)));
  const LearnerSessionOptions& o = session->options_;
  const AgentOptions& agent = session->agent_options_;
  Status started = [&]() -> Status {
    MEND_RETURN_IF_ERROR(CheckDataPlaneHost(agent.dataplane_host));
    MEND_ASSIGN_OR_RETURN(GroupStoreOpener group_store,
                          GroupStoreOpenerFor(agent, o.token, *o.clock, o.learner_id));
    LearnerIdentity identity{o.learner_id, agent.job_id, agent.rack, ""};
    identity.job_settings = agent.job_settings;
    identity.job_settings.push_back(ParametersSetting(o.parameter_shapes));
    identity.job_settings.insert(identity.job_settings.end(), o.job_settings.begin(),
                                 o.job_settings.end());
    MEND_ASSIGN_OR_RETURN(session->agent_, LearnerAgent::Start(agent, o.token, identity, *o.clock,
                                                               std::move(group_store)));
    return OkStatus();
  }();
  if (!started.ok()) return TellGroupRanks(agent, o.token, o.learner_id, std::move(started));
  return session;
}

StatusOr<std::unique_ptr<RoundDriver>> LearnerSession::CreateDriver(
    std::unique_ptr<FlatParameters> parameters, std::unique_ptr<FlatMoments> moments,
    uint64_t start_step) {
  auto driver = RoundDriver::Create(driver_options_, *agent_, *options_.clock,
                                    std::move(parameters), std::move(moments), start_step);
  if (!driver.ok()) return Fail(driver.status());
  return driver;
}

Status LearnerSession::Fail(Status why) {
  (void)agent_->Leave("the learner could not start: " + why.ToString());
  return TellGroupRanks(agent_options_, options_.token, options_.learner_id, std::move(why));
}

}  // namespace mend::reducer
