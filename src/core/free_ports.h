// Ports for the processes a launcher starts (a group's store, a test's
// lighthouse).
#pragma once

#include <vector>

#include "mend/status.h"

namespace mend {

// `count` distinct loopback TCP ports nothing listens on now (the kernel's
// picks, all held until the last is picked; someone else may take one
// before it is used, as with torchrun's own pick).
[[nodiscard]] StatusOr<std::vector<int>> FreeLoopbackPorts(int count);

}  // namespace mend
