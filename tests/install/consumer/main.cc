// Uses the installed API: configuration with its checks, an embedded
// lighthouse, and a reducer over a tensor it does not own.
#include <cstdio>

#include "ATen/ATen.h"
#include "mend/config.h"
#include "mend/learner_agent.h"
#include "mend/lighthouse.h"
#include "mend/reducer.h"

int main() {
  mend::ConfigSources sources;
  sources.overrides = {{"quorum_min_learners", "1", "consumer"},
                       {"bind", "127.0.0.1:0", "consumer"},
                       {"http", "", "consumer"},
                       {"sync_period_steps", "2", "consumer"},
                       {"log_level", "warn", "consumer"}};
  auto config = mend::LoadConfig(sources);
  if (!config.ok()) return std::printf("config: %s\n", config.status().ToString().c_str()), 1;
  auto bad = mend::LoadConfig({"", nullptr, {{"grace_window_ms", "-1", "consumer"}}});
  if (bad.ok()) return std::printf("a bad value was accepted\n"), 1;
  const std::string token = "consumer-token-0123456789";
  auto server = mend::LighthouseServer::Start(*config, token, *mend::RealClock());
  if (!server.ok()) return std::printf("lighthouse: %s\n", server.status().ToString().c_str()), 1;
  // The learner's configuration: the loaded one, at the lighthouse's address, checked again.
  mend::Config learner = *config;
  learner.lighthouse = (*server)->grpc_address();
  auto checked = mend::ValidConfig::Check(learner);
  if (!checked.ok()) return std::printf("config: %s\n", checked.status().ToString().c_str()), 1;
  auto agent = mend::LearnerAgent::Start(mend::AgentOptionsOf(*checked), token,
                                         {"consumer", learner.job_id, "", ""}, *mend::RealClock());
  if (!agent.ok()) return std::printf("agent: %s\n", agent.status().ToString().c_str()), 1;
  at::Tensor weight = at::ones({4});
  auto reducer = mend::Reducer::Create(*checked, {{"weight", weight}}, nullptr, **agent);
  if (!reducer.ok()) return std::printf("reducer: %s\n", reducer.status().ToString().c_str()), 1;
  for (int step = 0; step < 4; ++step) {
    weight.sub_(0.5);
    if (auto s = (*reducer)->step(1); !s.ok())
      return std::printf("step: %s\n", s.ToString().c_str()), 1;
  }
  (void)(*reducer)->shutdown();
  std::printf("consumer: %llu rounds, weight[0] = %g\n",
              static_cast<unsigned long long>((*reducer)->stats().rounds), weight[0].item<float>());
  return (*reducer)->stats().rounds == 2 ? 0 : 1;
}
