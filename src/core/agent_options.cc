// AgentOptionsOf: the learner agent's keys of a checked configuration.
#include "mend/agent_options.h"

#include "mend/config.h"

namespace mend {

AgentOptions AgentOptionsOf(const ValidConfig& valid) {
  const Config& config = valid;
  AgentOptions o;
  o.lighthouse = config.lighthouse;
  o.control_plane = config.control_plane;
  o.tls_ca_file = config.tls_ca_file;
  o.rpc_timeout_ms = config.rpc_timeout_ms;
  o.heartbeat_ms = config.heartbeat_ms;
  o.heartbeat_timeout_ms = config.heartbeat_timeout_ms;
  o.lighthouse_wait_ms = config.lighthouse_wait_ms;
  o.quorum_timeout_ms = config.quorum_timeout_ms;
  o.job_id = config.job_id;
  o.rack = config.rack;
  o.dataplane_host = config.dataplane_host;
  o.job_settings = SharedSettings(config);
  o.concurrent_outer_step = config.concurrent_outer_step;
  o.dataplane_encrypt = config.dataplane_encrypt;
  o.checkpoint_authenticate = config.checkpoint_authenticate;
  o.group_size = config.group_size;
  o.group_rank = config.group_rank;
  o.group_generation = config.group_generation;
  o.group_store = config.group_store;
  return o;
}

}  // namespace mend
