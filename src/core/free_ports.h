// Ports for the processes a launcher starts (a group's store, a test's
// lighthouse).
#pragma once

#include <vector>

#include "mend/status.h"

namespace mend {

// `count` distinct loopback TCP ports nothing listens on now, all held
// until the last is picked. They are taken below the kernel's ephemeral
// range (net.ipv4.ip_local_port_range), which it hands out on its own to
// every outgoing connection: a process restarted on the same port (a
// group's store, a relaunched learner) would otherwise find it taken by
// someone's connection. Someone may still bind one on purpose before it is
// used, as with torchrun's own pick. Where that range leaves no room below
// it, the kernel's own picks.
[[nodiscard]] StatusOr<std::vector<int>> FreeLoopbackPorts(int count);

}  // namespace mend
