// A copy of what the lighthouse shows (status page, /status.json, /metrics,
// the GetStatus call), taken under the core's mutex and rendered outside it.
// Thread-safety: plain values.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mend::coordinator {

// Cumulative histogram in milliseconds, Prometheus-style.
struct Histogram {
  static constexpr std::array<double, 15> kBoundsMs = {
      1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000};
  std::array<uint64_t, kBoundsMs.size()> buckets{};
  uint64_t count = 0;
  double sum_ms = 0;
  void Observe(double ms);
};

struct Counters {
  uint64_t registrations = 0;
  uint64_t heartbeats = 0;
  uint64_t joins = 0;
  uint64_t quorum_timeouts = 0;
  uint64_t quorum_aborts = 0;
  uint64_t deaths = 0;
  uint64_t stalls = 0;  // the lighthouse's own pauses that gave learners a fresh timeout
  uint64_t slow_flags = 0;
  uint64_t left_out_unreachable = 0;  // learners left out: others could not connect to them
  uint64_t store_ops = 0;
  std::map<std::string, uint64_t> rounds_by_closed_by;
  std::map<std::string, uint64_t> rejections_by_code;
  Histogram round_wait;   // quorum reached -> close
  Histogram member_wait;  // join -> close, per member
};

struct LearnerView {
  std::string id;
  std::string state;
  std::string rack;
  std::string address;
  std::vector<std::string> rank_addresses;  // by group rank, as registered
  uint64_t step = 0;
  uint64_t tokens_total = 0;
  double tokens_per_s = 0;
  double last_heartbeat_ms_ago = 0;
  bool slow = false;
  double slow_zscore = 0;
  double median_step_ms = 0;
  uint64_t last_round_id = 0;
  uint64_t rounds_joined = 0;
};

struct RoundView {
  uint64_t id = 0;
  std::vector<std::string> members;  // at most the first kMaxListedMembers
  size_t member_count = 0;
  std::string closed_by;
  double waited_ms = 0;
  double span_ms = 0;  // first join -> close
  double grace_window_ms = 0;
  double age_ms = 0;
  uint64_t total_tokens = 0;
  size_t healing = 0;
  uint64_t heal_round_id = 0;
};

struct EventView {
  uint64_t seq = 0;
  double age_ms = 0;
  std::string kind;
  std::string learner_id;
  std::string message;
};

struct StatusSnapshot {
  static constexpr size_t kMaxListedMembers = 64;

  std::string job_id;
  uint64_t instance_id = 0;
  double uptime_s = 0;
  // Settings in force.
  size_t min_learners = 0;
  double grace_window_max_ms = 0;
  double grace_window_ms = 0;  // current (adaptive) value
  double heartbeat_timeout_ms = 0;
  double failslow_zscore_threshold = 0;
  size_t failslow_window_steps = 0;
  // Counts.
  size_t learners_known = 0;
  size_t learners_alive = 0;
  size_t learners_slow = 0;
  size_t learners_waiting = 0;
  uint64_t latest_round_id = 0;
  double quorum_reached_ms_ago = -1;  // -1: quorum not reached
  size_t store_keys = 0;
  size_t store_bytes = 0;
  size_t store_waiters = 0;
  uint64_t events_total = 0;

  std::vector<LearnerView> learners;  // slow first, then by id; at most max_learners
  std::vector<RoundView> rounds;      // oldest first, the most recent max_rounds
  std::vector<EventView> events;      // oldest first
  Counters counters;
};

// The /status.json document.
std::string StatusJson(const StatusSnapshot& snapshot);

// The lighthouse's instance as the status shows it (`lighthouse_instance`)
// and the rounds' rendezvous prefixes carry it: 16 hex digits.
std::string InstanceText(uint64_t instance_id);
// The Prometheus text exposition (version 0.0.4) of /metrics.
std::string PrometheusText(const StatusSnapshot& snapshot);

}  // namespace mend::coordinator
