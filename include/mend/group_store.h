// A learner group's own store (the group_store key, HOST:PORT): where the
// ranks of a group meet and where group rank 0 publishes each round's
// decision, so that only rank 0 talks to the lighthouse about rounds (the
// lighthouse's store is still where the slices of different learners meet).
//
// Group rank 0 serves it: a store-only server (src/store/store_server.h:
// the store's calls of the lighthouse's gRPC service, the same code as the
// lighthouse's store, and nothing of the lighthouse else), bound to the
// group's address, with the job token, in plaintext (it is reached inside
// the rack); every rank connects with a lighthouse client. Under torchrun
// the Python package serves it on rank 0 at mend_init and passes its
// address to the other ranks through torch's public API; `mend train`
// groups are given a free port by their launcher.
//
// Thread-safety: GroupStoreServer and the openers may be used from any
// thread; each opened store is used by one thread at a time.
#pragma once

#include <memory>
#include <string>

#include "mend/agent_options.h"
#include "mend/clock.h"
#include "mend/learner_agent.h"
#include "mend/status.h"

namespace mend {

class GroupStoreServer {
 public:
  // Serves the store at `address` (HOST:PORT; port 0 picks a free one), on
  // `clock` (not owned; it must outlive the server).
  // UNAVAILABLE when the address cannot be bound (in use, not local).
  // While the server lives, GroupStoreOpenerFor on this process's group
  // rank 0 uses it instead of serving the address again.
  [[nodiscard]] static StatusOr<std::shared_ptr<GroupStoreServer>> Serve(const std::string& token,
                                                                         const std::string& address,
                                                                         const Clock& clock);
  virtual ~GroupStoreServer() = default;
  // HOST:PORT with the port actually bound.
  virtual const std::string& address() const = 0;
};

// What LearnerAgent::Start takes for options.group_store: null when it is
// empty (the group's keys then live in the lighthouse's store). Group rank 0
// serves options.group_store unless a GroupStoreServer of this process
// already does; the server lives as long as the opener. Each connection
// waits up to quorum_timeout_ms for the store to come up; an error names the
// address. Those waits, and the server's, are on `clock` (the learner
// agent's), which is not owned and must outlive the opener. With
// `learner_id`, a rank's wait for rank 0's store also ends when rank 0 told
// the lighthouse it could not start (TellGroupRanks), with its error.
[[nodiscard]] StatusOr<GroupStoreOpener> GroupStoreOpenerFor(const AgentOptions& options,
                                                             const std::string& token,
                                                             const Clock& clock,
                                                             const std::string& learner_id = "");

}  // namespace mend
