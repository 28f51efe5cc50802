// mend::AgentOptions: what a learner's side of the control plane reads of
// the configuration: its agent (mend/learner_agent.h), the ranks of its group
// (their rendezvous before they have connections of their own) and its
// group's store (mend/group_store.h). A front end makes it from a checked
// configuration with AgentOptionsOf (mend/config.h); the parts take it and
// not the Config, whose keys mean the same here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mend/config_enums.h"

namespace mend {

struct AgentOptions {
  // The lighthouse, and how the learner reaches it.
  std::string lighthouse;
  ControlPlane control_plane = ControlPlane::kGrpc;
  std::string tls_ca_file;
  int64_t rpc_timeout_ms = 0;
  int64_t heartbeat_ms = 0;
  int64_t heartbeat_timeout_ms = 0;
  int64_t lighthouse_wait_ms = 0;
  // How long a group's rank waits for the others (and a round for a quorum).
  int64_t quorum_timeout_ms = 0;

  // The learner, as it registers.
  std::string job_id;
  std::string rack;
  std::string dataplane_host;
  // "key=value" of what every learner of the job must agree on (SharedSettings).
  std::vector<std::string> job_settings;
  bool concurrent_outer_step = false;
  // Whether the job token keys the data plane and the checkpoints.
  bool dataplane_encrypt = true;
  bool checkpoint_authenticate = true;

  // Its group of ranks.
  int64_t group_size = 1;
  int64_t group_rank = 0;
  int64_t group_generation = 0;
  std::string group_store;  // HOST:PORT; empty: the lighthouse's store
};

}  // namespace mend
