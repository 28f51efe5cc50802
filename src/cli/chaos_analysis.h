// The checks of a finished chaos run (chaos.h), from what its processes left
// behind: their diagnostics (rounds, steps and training records) and their
// results. The harness runs the job and injects the faults; what the run
// shows is decided here.
//
// Thread-safety: plain functions over their arguments.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/chaos.h"
#include "cli/training_job.h"
#include "mend/status.h"

namespace mend::cli {

// What the harness knows of the run it hands over.
struct ChaosRun {
  const ChaosOptions& options;
  const TrainingJobSpec& spec;  // the job as run: its learners, ranks and settings
  std::string diagnostics_dir;  // the processes' diagnostics
  // By process (learner x ranks + rank): its result file, and whether its
  // output showed a non-finite loss.
  std::vector<std::string> result_files;
  std::vector<bool> nonfinite;
  std::vector<int64_t> over_ms;  // by recorded fault (report.faults): when it had recovered
};

// Ranks per learner: the group's, or 1 for learners of one process.
int ChaosRanks(const TrainingJobSpec& spec);
// The diagnostics' name of a learner's rank: "learner-2", or "learner-2.rank1"
// for rank 1 of a group.
std::string ChaosDiagnosticsName(const TrainingJobSpec& spec, int learner, int rank);

// Every round from the diagnostics: the members' global states agree (in a
// group, rank by rank: each rank holds its slice's), and a group's ranks
// hold the same whole replica after each round; at equal job steps the
// learners' learning rates and (where theirs is the job's) optimizer step
// counts agree; the healthy learners' step waits during faults; each heal's
// time; the results and losses. Fills `report` (its faults are the run's).
[[nodiscard]] Status AnalyzeChaosRun(const ChaosRun& run, ChaosReport* report);

// After AnalyzeChaosRun (and the reference run, when there is one): the
// violations, whether the run passed, and the report's JSON.
void SummarizeChaosRun(const ChaosRun& run, ChaosReport* report);

}  // namespace mend::cli
