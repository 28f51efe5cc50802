// The client side of the lighthouse benchmark: one process that simulates
// many learners, heartbeating every 100 ms and joining rounds, over gRPC or
// over the datagram channel.
#pragma once

#include <cstdint>
#include <string>

#include "mend/clock.h"

namespace mend::bench {

inline constexpr char kToken[] = "bench-token-0123456789abcdef";

struct SwarmOptions {
  std::string address;    // lighthouse gRPC HOST:PORT
  std::string transport;  // "grpc" or "udp"
  int first = 0;          // learner ids learner-<first> ...
  int count = 0;
  Micros round_interval = 0;  // pause between a reply and the next join
  int rounds = 0;             // rounds every learner joins after the driver's go
  std::string out_path;       // samples as JSON
  uint64_t seed = 1;
};

// Registers the learners, prints "ready", heartbeats until SIGUSR1, joins
// `rounds` rounds (every learner the same number, so no round is left
// waiting for learners that stopped), writes the samples, prints "done".
// Returns the exit code.
int RunSwarm(const SwarmOptions& options);

}  // namespace mend::bench
