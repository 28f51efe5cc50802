// The configuration of an in-process job on loopback for tests: an embedded
// lighthouse on port 0 without HTTP, fast heartbeats, bounded waits.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "mend/config.h"

namespace mend::testing_util {

// How long a silent learner (or a group's rank without a pulse) lives: 2 s,
// and 10 s under ThreadSanitizer, which runs the ranks' threads many times
// slower (on 2 cores, a rank of a group test was starved past 2 s there and
// its learner declared dead). No test's result depends on it but the ones
// that kill a learner, whose waits it bounds.
#if defined(__SANITIZE_THREAD__)
inline constexpr int64_t kLoopbackHeartbeatTimeoutMs = 10000;
#else
inline constexpr int64_t kLoopbackHeartbeatTimeoutMs = 2000;
#endif

inline Config LoopbackJobConfig(int min_learners) {
  Config config;
  config.job_id = "job";
  config.bind = "127.0.0.1:0";
  config.http = "";
  config.heartbeat_ms = 50;
  config.heartbeat_timeout_ms = kLoopbackHeartbeatTimeoutMs;
  config.quorum_min_learners = min_learners;
  config.grace_window_ms = 1000;
  config.quorum_timeout_ms = 20000;
  config.collective_timeout_ms = 10000;
  config.log_level = LogLevel::kWarn;
  return config;
}

// LoopbackJobConfig with synchronous rounds every `period` steps and a fixed
// grace window (the reducer tests' base). The first round is an outer
// warm-up round (averaging), the later ones take the outer Nesterov step, so
// every job of this base runs both.
inline Config SynchronousJobConfig(int min_learners, int period) {
  Config config = LoopbackJobConfig(min_learners);
  config.grace_window_adaptive = false;
  config.sync_period_steps = period;
  config.outer_warmup_steps = period;
  config.concurrent_outer_step = false;
  return config;
}

// SynchronousJobConfig with concurrent rounds, each applied `overlap_steps`
// after its boundary (0: tuned).
inline Config ConcurrentJobConfig(int min_learners, int period, int overlap_steps) {
  Config config = SynchronousJobConfig(min_learners, period);
  config.concurrent_outer_step = true;
  config.overlap_steps = overlap_steps;
  return config;
}

// `config`, which the test made valid, checked: a configuration the check
// refuses is the test's mistake, and aborts naming it.
inline ValidConfig CheckedForTest(const Config& config) {
  StatusOr<ValidConfig> valid = ValidConfig::Check(config);
  if (!valid.ok()) {
    std::fprintf(stderr, "a test's configuration is not valid: %s\n",
                 valid.status().ToString().c_str());
    std::abort();
  }
  return *std::move(valid);
}

// What LearnerAgent::Start takes for `config` (CheckedForTest).
inline AgentOptions AgentOptionsFor(const Config& config) {
  return AgentOptionsOf(CheckedForTest(config));
}

}  // namespace mend::testing_util
