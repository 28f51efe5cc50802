// Renders a StatusSnapshot as /status.json and as Prometheus text.
#include <cmath>

#include "coordinator/status_snapshot.h"
#include "core/status_format.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"

namespace mend::coordinator {
namespace {

double Round1(double value) { return std::round(value * 10) / 10; }

nlohmann::ordered_json LearnerJson(const LearnerView& l) {
  return {{"id", l.id},
          {"state", l.state},
          {"rack", l.rack},
          {"address", l.address},
          {"ranks", l.rank_addresses},
          {"step", l.step},
          {"tokens_total", l.tokens_total},
          {"tokens_per_s", Round1(l.tokens_per_s)},
          {"last_heartbeat_ms_ago", Round1(l.last_heartbeat_ms_ago)},
          {"slow", l.slow},
          {"slow_zscore", std::round(l.slow_zscore * 100) / 100},
          {"median_step_ms", Round1(l.median_step_ms)},
          {"last_round_id", l.last_round_id},
          {"rounds_joined", l.rounds_joined}};
}

nlohmann::ordered_json RoundJson(const RoundView& r) {
  return {{"id", r.id},
          {"members", r.members},
          {"member_count", r.member_count},
          {"closed_by", r.closed_by},
          {"waited_ms", Round1(r.waited_ms)},
          {"span_ms", Round1(r.span_ms)},
          {"grace_window_ms", Round1(r.grace_window_ms)},
          {"age_ms", Round1(r.age_ms)},
          {"total_tokens", r.total_tokens},
          {"healing", r.healing},
          {"heal_round_id", r.heal_round_id}};
}

// Prometheus label values escape backslash, quote and newline.
std::string EscapeLabel(std::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

void Metric(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void HistogramText(std::string& out, std::string_view name, std::string_view help,
                   const Histogram& h) {
  Metric(out, name, "histogram", help);
  for (size_t i = 0; i < Histogram::kBoundsMs.size(); ++i) {
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, Histogram::kBoundsMs[i] / 1000,
                       h.buckets[i]);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, h.count);
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, h.sum_ms / 1000, name, h.count);
}

}  // namespace

void Histogram::Observe(double ms) {
  for (size_t i = 0; i < kBoundsMs.size(); ++i) {
    if (ms <= kBoundsMs[i]) buckets[i]++;
  }
  count++;
  sum_ms += ms;
}

std::string InstanceText(uint64_t instance_id) { return fmt::format("{:016x}", instance_id); }

std::string StatusJson(const StatusSnapshot& s) {
  nlohmann::ordered_json doc;
  doc["job"] = s.job_id;
  doc["lighthouse_instance"] = InstanceText(s.instance_id);
  doc["uptime_s"] = Round1(s.uptime_s);
  doc["settings"] = {{"quorum_min_learners", s.min_learners},
                     {"grace_window_ms", Round1(s.grace_window_max_ms)},
                     {"heartbeat_timeout_ms", Round1(s.heartbeat_timeout_ms)},
                     {"failslow_zscore_threshold", s.failslow_zscore_threshold},
                     {"failslow_window_steps", s.failslow_window_steps}};
  doc["summary"] = {{"learners_known", s.learners_known},
                    {"learners_alive", s.learners_alive},
                    {"learners_slow", s.learners_slow},
                    {"learners_waiting", s.learners_waiting},
                    {"latest_round_id", s.latest_round_id},
                    {"grace_window_ms", Round1(s.grace_window_ms)},
                    {"quorum_reached_ms_ago", Round1(s.quorum_reached_ms_ago)},
                    {"store_keys", s.store_keys},
                    {"store_bytes", s.store_bytes},
                    {"store_waiters", s.store_waiters},
                    {"rounds_by_closed_by", s.counters.rounds_by_closed_by}};
  doc["learners"] = nlohmann::ordered_json::array();
  for (const LearnerView& l : s.learners) doc["learners"].push_back(LearnerJson(l));
  doc["learners_listed"] = s.learners.size();
  doc["rounds"] = nlohmann::ordered_json::array();
  for (const RoundView& r : s.rounds) doc["rounds"].push_back(RoundJson(r));
  doc["events"] = nlohmann::ordered_json::array();
  for (const EventView& e : s.events) {
    doc["events"].push_back({{"seq", e.seq},
                             {"age_ms", Round1(e.age_ms)},
                             {"kind", e.kind},
                             {"learner", e.learner_id},
                             {"message", e.message}});
  }
  return doc.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::string PrometheusText(const StatusSnapshot& s) {
  const Counters& c = s.counters;
  std::string out;
  Metric(out, "mend_learners", "gauge", "Learners known to the lighthouse, by state.");
  out += fmt::format("mend_learners{{state=\"alive\"}} {}\n", s.learners_alive);
  out += fmt::format("mend_learners{{state=\"slow\"}} {}\n", s.learners_slow);
  out += fmt::format("mend_learners{{state=\"waiting\"}} {}\n", s.learners_waiting);
  out += fmt::format("mend_learners{{state=\"known\"}} {}\n", s.learners_known);
  Metric(out, "mend_latest_round_id", "gauge", "Id of the most recent closed round.");
  out += fmt::format("mend_latest_round_id {}\n", s.latest_round_id);
  Metric(out, "mend_grace_window_seconds", "gauge", "Grace window in force (adaptive).");
  out += fmt::format("mend_grace_window_seconds {}\n", s.grace_window_ms / 1000);
  Metric(out, "mend_rounds_total", "counter", "Closed rounds, by the rule that closed them.");
  for (const auto& [closed_by, count] : c.rounds_by_closed_by) {
    out += fmt::format("mend_rounds_total{{closed_by=\"{}\"}} {}\n", EscapeLabel(closed_by), count);
  }
  Metric(out, "mend_registrations_total", "counter", "Register calls accepted.");
  out += fmt::format("mend_registrations_total {}\n", c.registrations);
  Metric(out, "mend_heartbeats_total", "counter", "Heartbeats received.");
  out += fmt::format("mend_heartbeats_total {}\n", c.heartbeats);
  Metric(out, "mend_quorum_joins_total", "counter", "Quorum calls accepted.");
  out += fmt::format("mend_quorum_joins_total {}\n", c.joins);
  Metric(out, "mend_quorum_timeouts_total", "counter", "Quorum calls that timed out.");
  out += fmt::format("mend_quorum_timeouts_total {}\n", c.quorum_timeouts);
  Metric(out, "mend_quorum_aborts_total", "counter",
         "Quorum calls ended without a round (learner left, died, re-registered, cancelled).");
  out += fmt::format("mend_quorum_aborts_total {}\n", c.quorum_aborts);
  Metric(out, "mend_learner_deaths_total", "counter", "Learners declared dead by timeout.");
  out += fmt::format("mend_learner_deaths_total {}\n", c.deaths);
  Metric(out, "mend_lighthouse_stalls_total", "counter",
         "Times the lighthouse itself did not run for half a heartbeat timeout or more (stopped, "
         "paused, swapped out); each gave every learner a fresh heartbeat timeout.");
  out += fmt::format("mend_lighthouse_stalls_total {}\n", c.stalls);
  Metric(out, "mend_unreachable_left_out_total", "counter",
         "Times a learner was left out of rounds because two or more others could not connect "
         "to its data plane.");
  out += fmt::format("mend_unreachable_left_out_total {}\n", c.left_out_unreachable);
  Metric(out, "mend_slow_flags_total", "counter", "Times a learner was flagged fail-slow.");
  out += fmt::format("mend_slow_flags_total {}\n", c.slow_flags);
  Metric(out, "mend_store_ops_total", "counter", "Rendezvous store operations.");
  out += fmt::format("mend_store_ops_total {}\n", c.store_ops);
  Metric(out, "mend_store_keys", "gauge", "Keys in the rendezvous store.");
  out += fmt::format("mend_store_keys {}\n", s.store_keys);
  Metric(out, "mend_rejected_requests_total", "counter", "Refused calls, by status code.");
  for (const auto& [code, count] : c.rejections_by_code) {
    out +=
        fmt::format("mend_rejected_requests_total{{code=\"{}\"}} {}\n", EscapeLabel(code), count);
  }
  HistogramText(out, "mend_round_wait_seconds", "Time from quorum reached to round close.",
                c.round_wait);
  HistogramText(out, "mend_member_wait_seconds", "Time from a learner's join to its round's close.",
                c.member_wait);
  return out;
}

}  // namespace mend::coordinator
