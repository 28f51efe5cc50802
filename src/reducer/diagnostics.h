// Per-step and per-round diagnostics of one learner, as JSON lines in
// diagnostics_dir (one object a line, appended):
//   <learner>.steps.jsonl   {"t_ms", "step", "tokens", "step_ms"}
//   <learner>.rounds.jsonl  {"t_ms", "fragment", "round_id", "ok", "error",
//                            "rank", "members", "bytes_sent", "dropped",
//                            "merged_norm", "healed", "boundary_step",
//                            "applied_step", "seconds"}
// t_ms is milliseconds since the Unix epoch. With an empty directory nothing
// is written. Write errors are logged once and then ignored: diagnostics
// never stop training.
//
// Thread-safety: the training thread only.
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include "mend/clock.h"
#include "nlohmann/json.hpp"
#include "reducer/round_flight.h"

namespace mend::reducer {

// One JSON-lines file of diagnostics_dir, appended a record at a time (each
// given "t_ms" and flushed). Closed when the directory is empty or the file
// cannot be opened (said once, naming it); a failed write is said once.
class JsonLines {
 public:
  // Opens <dir>/<name> for appending (creating the directory) unless `dir`
  // is empty.
  JsonLines(const std::string& dir, const std::string& name);

  bool open() const { return file_ != nullptr; }
  void Write(nlohmann::json record);

 private:
  struct Closer {
    void operator()(std::FILE* file) const { std::fclose(file); }
  };
  std::unique_ptr<std::FILE, Closer> file_;
  bool warned_ = false;
};

class Diagnostics {
 public:
  // Opens (creating the directory) when `dir` is not empty.
  Diagnostics(const std::string& dir, const std::string& learner);

  bool enabled() const { return steps_.open(); }
  void Step(nlohmann::json record);
  void Round(nlohmann::json record);

 private:
  JsonLines steps_;
  JsonLines rounds_;
};

// A round's record (its rounds.jsonl line, without t_ms): the round as
// launched and taken up at the learner's `applied_step`, at `now`, and what
// came of it.
nlohmann::json RoundRecord(const InFlight& flight, uint64_t applied_step, Micros now);

}  // namespace mend::reducer
