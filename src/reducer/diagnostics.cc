#include "reducer/diagnostics.h"

#include <chrono>
#include <filesystem>

#include "core/status_format.h"
#include "spdlog/spdlog.h"

namespace mend::reducer {

Diagnostics::Diagnostics(const std::string& dir, const std::string& learner) {
  if (dir.empty()) return;
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  std::string base = (std::filesystem::path(dir) / learner).string();
  steps_.reset(std::fopen((base + ".steps.jsonl").c_str(), "a"));
  rounds_.reset(std::fopen((base + ".rounds.jsonl").c_str(), "a"));
  if (!steps_ || !rounds_) {
    spdlog::warn("diagnostics_dir = \"{}\": cannot write there ({}); no diagnostics", dir,
                 error ? error.message() : "fopen failed");
    steps_.reset();
    rounds_.reset();
  }
}

void Diagnostics::Step(nlohmann::json record) {
  if (steps_) Write(steps_.get(), record);
}

void Diagnostics::Round(nlohmann::json record) {
  if (rounds_) Write(rounds_.get(), record);
}

void Diagnostics::Write(std::FILE* file, nlohmann::json& record) {
  record["t_ms"] = std::chrono::duration_cast<std::chrono::milliseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  std::string line = record.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file) != line.size() && !warned_) {
    spdlog::warn("diagnostics: write failed; later records may be missing");
    warned_ = true;
  }
  std::fflush(file);
}

}  // namespace mend::reducer
