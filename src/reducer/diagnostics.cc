#include "reducer/diagnostics.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "core/status_format.h"
#include "spdlog/spdlog.h"

namespace mend::reducer {

JsonLines::JsonLines(const std::string& dir, const std::string& name) {
  if (dir.empty()) return;
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  const std::string path = (std::filesystem::path(dir) / name).string();
  file_.reset(std::fopen(path.c_str(), "a"));
  if (!file_) {
    spdlog::warn("diagnostics_dir = \"{}\": cannot write {} there ({}); no such diagnostics", dir,
                 name, error ? error.message() : "fopen failed");
  }
}

void JsonLines::Write(nlohmann::json record) {
  if (!file_) return;
  record["t_ms"] = std::chrono::duration_cast<std::chrono::milliseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  const std::string line = record.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_.get()) != line.size() && !warned_) {
    spdlog::warn("diagnostics: a write failed; later records may be missing");
    warned_ = true;
  }
  std::fflush(file_.get());
}

Diagnostics::Diagnostics(const std::string& dir, const std::string& learner)
    : steps_(dir, learner + ".steps.jsonl"), rounds_(dir, learner + ".rounds.jsonl") {}

void Diagnostics::Step(nlohmann::json record) { steps_.Write(std::move(record)); }

void Diagnostics::Round(nlohmann::json record) {
  if (steps_.open()) rounds_.Write(std::move(record));
}

nlohmann::json RoundRecord(const InFlight& flight, uint64_t applied_step, Micros now) {
  const auto seconds = [](Micros from, Micros to) {
    return static_cast<double>(std::max<Micros>(0, to - from)) / kMicrosPerSecond;
  };
  nlohmann::json record = {
      {"fragment", flight.fragment},
      {"boundary_step", flight.boundary_step},
      {"applied_step", applied_step},
      {"tau", flight.apply_at_step - flight.boundary_step},
      {"tokens", flight.tokens},
      {"seconds", static_cast<double>(now - flight.launched) / kMicrosPerSecond},
      {"round_seconds", seconds(flight.launched, flight.finished)},
      {"in_flight", flight.in_flight},
      {"waited", flight.waited},
      {"ok", flight.outcome.ok()},
      {"passed_over", flight.passed_over}};
  if (!flight.outcome.ok()) {
    record["error"] = flight.outcome.status().ToString();
    return record;
  }
  const Outcome& outcome = *flight.outcome;
  record["round_id"] = outcome.round_id;
  record["rank"] = outcome.rank;
  record["members"] = outcome.members;
  record["bytes_sent"] = outcome.result.bytes_sent;
  record["cross_rack_bytes"] = outcome.cross_rack_bytes;
  record["dropped"] = outcome.result.dropped;
  record["merged_norm"] = outcome.result.merged_norm;
  record["outer_step"] = outcome.outer_warmup || outcome.final_merge ? "average" : "nesterov";
  record["final_merge"] = outcome.final_merge;
  record["healed"] = outcome.healed;
  if (outcome.healed) {
    record["heal_step"] = outcome.heal_step;
    record["fresh_join"] = outcome.fresh_join;
    record["heal_seconds"] = outcome.heal_seconds;
    record["heal_bytes"] = outcome.heal_bytes;
    record["heal_source"] = outcome.heal_source;
  }
  return record;
}

}  // namespace mend::reducer
