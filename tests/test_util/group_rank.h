// A learner's agent for one rank of a group in an in-process test job.
#pragma once

#include <memory>
#include <utility>

#include "fmt/format.h"
#include "mend/config.h"
#include "mend/learner_agent.h"
#include "test_util/job_config.h"

namespace mend::testing_util {

// The agent of learner "learner-<learner>" as group rank `rank` of
// `config`'s group, on the real clock (config.group_rank becomes `rank`).
inline StatusOr<std::unique_ptr<LearnerAgent>> StartGroupRank(
    Config config, const char* token, int learner, int rank,
    GroupStoreOpener group_store = nullptr) {
  config.group_rank = rank;
  return LearnerAgent::Start(mend::testing_util::AgentOptionsFor(config), token,
                             {fmt::format("learner-{}", learner), "", "", ""}, *RealClock(),
                             std::move(group_store));
}

}  // namespace mend::testing_util
