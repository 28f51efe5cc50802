#include "cli/chaos_analysis.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "cli/json_fields.h"
#include "core/status_format.h"
#include "fmt/format.h"

namespace mend::cli {
namespace {

using json = nlohmann::json;
using ByRank = std::pair<int, int>;  // (learner, rank)
// (learner, rank) -> its heals: job step -> source (the newest to it)
using HealSources = std::map<ByRank, std::map<int64_t, std::string>>;

// What the processes' round records say.
struct RoundRecords {
  // round -> rank -> learner -> digest of the global state (slice)
  std::map<uint64_t, std::map<int, std::map<int, std::string>>> digests;
  // round -> what each member's record said (kept to tell a mismatch apart)
  std::map<uint64_t, json> members_of;
  // (round, learner) -> rank -> digest of the whole replica (groups)
  std::map<std::pair<uint64_t, int>, std::set<std::string>> replicas;
  std::map<int, std::vector<json>> rounds_of;  // learner -> its rank 0's rounds
  HealSources sources;
};

double SettingValue(const std::vector<std::string>& settings, const std::string& key,
                    double fallback) {
  for (const std::string& setting : settings) {
    if (setting.rfind(key + "=", 0) == 0) return std::atof(setting.c_str() + key.size() + 1);
  }
  return fallback;
}

std::vector<json> ReadDiagnostics(const ChaosRun& run, int learner, int rank,
                                  std::string_view kind) {
  return ReadJsonLines(fmt::format("{}/{}.{}.jsonl", run.diagnostics_dir,
                                   ChaosDiagnosticsName(run.spec, learner, rank), kind));
}

void AddRound(const json& round, int l, int rank, RoundRecords* records) {
  if (Field(round, "healed", false)) {
    records->sources[{l, rank}][Field(round, "heal_step", int64_t{-1})] =
        Field(round, "heal_source", std::string());
  }
  if (!Field(round, "ok", false) || !round.contains("global_sha256")) return;
  const uint64_t id = Field(round, "round_id", uint64_t{0});
  records->digests[id][rank][l] = Field(round, "global_sha256", std::string());
  records->members_of[id].push_back(
      {{"learner", l + 1},
       {"rank", rank},
       {"digest", Field(round, "global_sha256", std::string()).substr(0, 16)},
       {"boundary_step", Field(round, "boundary_step", uint64_t{0})},
       {"healed", Field(round, "healed", false)},
       {"heal_source", Field(round, "heal_source", std::string())},
       {"members", Field(round, "members", uint64_t{0})}});
  if (round.contains("parameters_sha256"))
    records->replicas[{id, l}].insert(Field(round, "parameters_sha256", std::string()));
}

RoundRecords ReadRounds(const ChaosRun& run) {
  RoundRecords records;
  for (int l = 0; l < run.spec.learners; ++l) {
    for (int rank = 0; rank < ChaosRanks(run.spec); ++rank) {
      std::vector<json> rounds = ReadDiagnostics(run, l, rank, "rounds");
      for (const json& round : rounds) AddRound(round, l, rank, &records);
      if (rank == 0) records.rounds_of[l] = std::move(rounds);
    }
  }
  return records;
}

// Every round with two members or more: their digests agree, rank by rank;
// and in groups, a learner's ranks hold the same replica after each round.
void CheckDigests(const ChaosRun& run, RoundRecords& records, ChaosReport* report) {
  json mismatches = json::array();
  json mismatch_members = json::array();  // each mismatched round's members, as they said
  for (const auto& [round_id, by_rank] : records.digests) {
    report->rounds++;
    bool checked = false, differ = false;
    for (const auto& [rank, by_learner] : by_rank) {
      if (by_learner.size() < 2) continue;
      checked = true;
      std::set<std::string> distinct;
      for (const auto& [learner, sha] : by_learner) distinct.insert(sha);
      differ |= distinct.size() > 1;
    }
    report->rounds_checked += checked ? 1 : 0;
    if (differ) {
      report->digest_mismatches++;
      mismatches.push_back(round_id);
      mismatch_members.push_back(
          {{"round_id", round_id}, {"members", records.members_of[round_id]}});
    }
  }
  json rank_mismatches = json::array();
  if (GroupedJob(run.spec)) {
    for (const auto& [key, distinct] : records.replicas) {
      report->rank_rounds_checked++;
      if (distinct.size() > 1) {
        report->rank_digest_mismatches++;
        rank_mismatches.push_back({{"round_id", key.first}, {"learner", key.second + 1}});
      }
    }
  }
  report->json["digest_mismatch_rounds"] = mismatches;
  report->json["digest_mismatch_members"] = mismatch_members;
  report->json["rank_digest_mismatches_at"] = rank_mismatches;
}

// Where learner l's rank `rank` took its optimizer's step count when a heal
// put it on job step `heal_step` ("heal" records): "job" if its source's
// count was the job's at that step, else "own". A source that had itself
// healed is followed back (at most `depth` heals).
std::string HealedCountFrom(const std::map<ByRank, std::vector<json>>& train,
                            const HealSources& sources, int l, int rank, int64_t heal_step,
                            int depth) {
  if (depth == 0) return "own";
  std::string source;
  if (auto heals = sources.find({l, rank}); heals != sources.end()) {
    if (auto it = heals->second.find(heal_step); it != heals->second.end()) source = it->second;
  }
  int from = -1;  // "learner-3" -> 2
  if (source.rfind("learner-", 0) == 0) from = std::atoi(source.c_str() + 8) - 1;
  const auto records = train.find({from, rank});
  if (records == train.end()) return "own";
  const json* at = nullptr;  // the source's newest record of that step
  for (const json& record : records->second) {
    if (Field(record, "step", int64_t{0}) == heal_step) at = &record;
  }
  if (at == nullptr) return "own";
  const std::string inner = Field(*at, "inner", std::string());
  if (inner != "heal") return inner;
  return HealedCountFrom(train, sources, from, rank, Field(*at, "heal_step", int64_t{0}),
                         depth - 1);
}

// What the training records say at each job step, gathered.
struct StepRecords {
  std::map<int64_t, std::set<double>> rates;     // job step -> learning rates
  std::map<int64_t, std::set<uint64_t>> counts;  // job step -> "job" step counts
  std::map<int64_t, std::set<std::string>> who;  // job step -> "learner/rank"
  std::map<int64_t, std::vector<json>> said;     // job step -> the records
};

StepRecords ReadTrainingRecords(const ChaosRun& run, const HealSources& sources) {
  std::map<ByRank, std::vector<json>> train;  // (learner, rank) -> records
  for (int l = 0; l < run.spec.learners; ++l) {
    for (int rank = 0; rank < ChaosRanks(run.spec); ++rank)
      train[{l, rank}] = ReadDiagnostics(run, l, rank, "train");
  }
  StepRecords steps;
  std::map<std::tuple<int, int, int64_t>, std::string> healed;  // resolved "heal" records
  for (const auto& [by_rank, records] : train) {
    const auto [l, rank] = by_rank;
    for (const json& record : records) {
      const int64_t step = Field(record, "step", int64_t{0});
      steps.rates[step].insert(Field(record, "lr", std::nan("")));
      std::string inner = Field(record, "inner", std::string());
      if (inner == "heal") {
        const int64_t heal_step = Field(record, "heal_step", int64_t{0});
        auto [it, fresh] = healed.try_emplace({l, rank, heal_step});
        if (fresh)
          it->second = HealedCountFrom(train, sources, l, rank, heal_step, run.spec.learners * 8);
        inner = it->second;
      }
      if (inner == "job") steps.counts[step].insert(Field(record, "optimizer_step", uint64_t{0}));
      steps.who[step].insert(fmt::format("{}/{}", l, rank));
      json shown = record;
      shown["learner"] = l + 1;
      if (GroupedJob(run.spec)) shown["rank"] = rank;
      steps.said[step].push_back(std::move(shown));
    }
  }
  return steps;
}

// At equal job steps, every record of every learner (and rank, and every
// run of a restarted one) says the same learning rate, and those whose
// optimizer's step count is the job's the same count: a heal or a resume
// that left a learner on another schedule than the job's is caught here.
// A count a heal brought is the job's where the source's was.
void CheckTrainingState(const ChaosRun& run, const HealSources& sources, ChaosReport* report) {
  StepRecords steps = ReadTrainingRecords(run, sources);
  json differ = json::array();
  for (const auto& [step, learners] : steps.who) {
    if (learners.size() < 2) continue;
    report->training_steps_checked++;
    const bool lr_differs = steps.rates[step].size() > 1;
    const bool count_differs = steps.counts[step].size() > 1;
    report->lr_mismatch_steps += lr_differs ? 1 : 0;
    report->optimizer_step_mismatch_steps += count_differs ? 1 : 0;
    if ((lr_differs || count_differs) && differ.size() < 8)
      differ.push_back({{"step", step}, {"records", steps.said[step]}});
  }
  report->json["training_state_mismatches_at"] = differ;
}

// Heals of restarted learners: restart -> its first round completed.
void TimeHeals(const std::map<int, std::vector<json>>& rounds_of, ChaosReport* report) {
  for (FaultRecord& f : report->faults) {
    if (f.kind != "kill") continue;
    const auto rounds = rounds_of.find(f.learner);
    if (rounds == rounds_of.end()) continue;
    for (const json& round : rounds->second) {
      if (Field(round, "t_ms", int64_t{0}) < f.end_ms || !Field(round, "ok", false)) continue;
      f.restart_to_healed_s =
          static_cast<double>(Field(round, "t_ms", int64_t{0}) - f.end_ms) / 1000;
      if (Field(round, "healed", false)) {
        f.heal_transfer_s = Field(round, "heal_seconds", 0.0);
        f.heal_bytes = Field(round, "heal_bytes", uint64_t{0});
      }
      break;
    }
  }
}

// One step of learner l's rank: its wait counted against the fault active
// then (none: the fault-free bound). A fault against one rank of a group is
// its whole group's, and a learner's own faults do not count.
void CountWait(const ChaosRun& run, int l, int rank, const json& step, ChaosReport* report,
               std::map<std::string, double>* max_wait_by_kind, json* waits) {
  const double wait_s = Field(step, "step_ms", 0.0) / 1000;
  const int64_t end = Field(step, "t_ms", int64_t{0});
  const int64_t begin = end - static_cast<int64_t>(1000 * wait_s);
  const FaultRecord* during = nullptr;
  bool own = false;
  for (size_t k = 0; k < report->faults.size(); ++k) {
    const FaultRecord& f = report->faults[k];
    if (begin > run.over_ms[k] || end < f.start_ms) continue;
    if (f.learner == l) own = true;
    during = &f;
  }
  if (during == nullptr) {
    report->max_wait_no_fault_s = std::max(report->max_wait_no_fault_s, wait_s);
    return;
  }
  if (own) return;
  double& by_kind = (*max_wait_by_kind)[during->kind];
  by_kind = std::max(by_kind, wait_s);
  if (during->kind == "lighthouse") {
    report->max_wait_lighthouse_s = std::max(report->max_wait_lighthouse_s, wait_s);
    return;
  }
  report->max_wait_learner_fault_s = std::max(report->max_wait_learner_fault_s, wait_s);
  if (wait_s > report->stall_bound_s) {
    report->stalls++;
    json wait = {{"learner", l + 1},
                 {"step", Field(step, "step", 0)},
                 {"wait_s", wait_s},
                 {"fault", during->kind}};
    if (GroupedJob(run.spec)) wait["rank"] = rank;
    waits->push_back(std::move(wait));
  }
}

// Step waits of healthy learners (every rank), by the fault active at the time.
void CheckWaits(const ChaosRun& run, ChaosReport* report) {
  json waits = json::array();
  std::map<std::string, double> max_wait_by_kind;  // healthy learners' longest step per kind
  for (int l = 0; l < run.spec.learners; ++l) {
    for (int rank = 0; rank < ChaosRanks(run.spec); ++rank) {
      for (const json& step : ReadDiagnostics(run, l, rank, "steps"))
        CountWait(run, l, rank, step, report, &max_wait_by_kind, &waits);
    }
  }
  report->json["stalls"] = waits;
  report->json["max_wait_by_kind_s"] = max_wait_by_kind;
}

// Results and losses (every process: a group's ranks evaluate alike).
Status ReadResults(const ChaosRun& run, ChaosReport* report) {
  double eval_sum = 0;
  for (size_t i = 0; i < run.result_files.size(); ++i) {
    std::ifstream in(run.result_files[i]);
    json result = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!result.is_object())
      return InternalError(fmt::format("chaos: no result in {}", run.result_files[i]));
    const double eval = Field(result, "eval_loss", std::nan(""));
    if (!std::isfinite(eval) || run.nonfinite[i]) report->losses_finite = false;
    eval_sum += eval;
    // A join is its learner's (rank 0 makes it for the group).
    if (static_cast<int>(i) % ChaosRanks(run.spec) == 0)
      report->passed_over += Field(result, "passed_over", uint64_t{0});
    report->json["results"].push_back(result);
  }
  report->eval_loss = eval_sum / static_cast<double>(run.result_files.size());
  return OkStatus();
}

// What the report's numbers break of the harness's invariants.
std::vector<std::string> Violations(const ChaosRun& run, const ChaosReport& r) {
  std::vector<std::string> v;
  if (r.digest_mismatches > 0) {
    v.push_back(
        fmt::format("{} round(s) whose members' global state digests differ", r.digest_mismatches));
  }
  if (r.rank_digest_mismatches > 0) {
    v.push_back(
        fmt::format("{} round(s) after which the ranks of a learner hold different parameters",
                    r.rank_digest_mismatches));
  }
  if (r.stalls > 0) {
    v.push_back(fmt::format(
        "{} step(s) of healthy learners waited longer than {:.1f} s during a learner fault",
        r.stalls, r.stall_bound_s));
  }
  if (!r.losses_finite) v.push_back("a loss was not finite");
  if (r.rounds_checked == 0) v.push_back("no round had two members to compare");
  if (r.lr_mismatch_steps > 0) {
    v.push_back(
        fmt::format("{} job step(s) at which learners' optimizers used different learning rates",
                    r.lr_mismatch_steps));
  }
  if (r.optimizer_step_mismatch_steps > 0) {
    v.push_back(
        fmt::format("{} job step(s) at which learners' optimizer step counts (the job's) differ",
                    r.optimizer_step_mismatch_steps));
  }
  if (r.training_steps_checked == 0)
    v.push_back("no job step was taken by two learners to compare");
  if (GroupedJob(run.spec) && r.rank_rounds_checked == 0)
    v.push_back("no round had a group's ranks to compare");
  if (run.options.reference && !std::isfinite(r.reference_eval_loss))
    v.push_back("the fault-free run's final eval loss was not finite");
  if (r.reference_eval_loss > 0 &&
      r.eval_loss > (1 + run.options.loss_tolerance) * r.reference_eval_loss) {
    v.push_back(
        fmt::format("final eval loss {:.4f} is more than {:.0f}% above the fault-free run's {:.4f}",
                    r.eval_loss, 100 * run.options.loss_tolerance, r.reference_eval_loss));
  }
  return v;
}

// Issue 5's healing target, where the link rate is known: a heal under
// 1.5 x (bytes / link) + 2 s; checked for the transfer and, stricter, for
// restart -> first round (process start and the wait for the next boundary
// included).
json HealTarget(const ChaosRun& run, const ChaosReport& r) {
  const double rate_mbit = SettingValue(run.spec.settings, "link_rate_mbit", 0);
  int transfer_met = 0, restart_met = 0, heals = 0;
  for (const FaultRecord& f : r.faults) {
    if (f.kind != "kill" || f.heal_bytes == 0 || rate_mbit <= 0) continue;
    const double target = 1.5 * static_cast<double>(f.heal_bytes) * 8 / (rate_mbit * 1e6) + 2;
    heals++;
    transfer_met += f.heal_transfer_s < target ? 1 : 0;
    restart_met += f.restart_to_healed_s >= 0 && f.restart_to_healed_s < target ? 1 : 0;
  }
  return {{"heals", heals}, {"transfer_met", transfer_met}, {"restart_to_round_met", restart_met}};
}

json FaultsJson(const std::vector<FaultRecord>& records) {
  json faults = json::array();
  for (const FaultRecord& f : records) {
    faults.push_back({{"kind", f.kind},
                      {"learner", f.learner >= 0 ? json(fmt::format("learner-{}", f.learner + 1))
                                                 : json(nullptr)},
                      {"rank", f.rank >= 0 ? json(f.rank) : json(nullptr)},
                      {"start_ms", f.start_ms},
                      {"end_ms", f.end_ms},
                      {"step", f.step},
                      {"restart_to_healed_s", f.restart_to_healed_s},
                      {"heal_transfer_s", f.heal_transfer_s},
                      {"heal_bytes", f.heal_bytes}});
  }
  return faults;
}

}  // namespace

int ChaosRanks(const TrainingJobSpec& spec) {
  return GroupedJob(spec) ? spec.ranks_per_learner : 1;
}

std::string ChaosDiagnosticsName(const TrainingJobSpec& spec, int learner, int rank) {
  return GroupedJob(spec) ? fmt::format("learner-{}.rank{}", learner + 1, rank)
                          : fmt::format("learner-{}", learner + 1);
}

Status AnalyzeChaosRun(const ChaosRun& run, ChaosReport* report) {
  RoundRecords records = ReadRounds(run);
  CheckDigests(run, records, report);
  CheckTrainingState(run, records.sources, report);
  TimeHeals(records.rounds_of, report);
  CheckWaits(run, report);
  return ReadResults(run, report);
}

void SummarizeChaosRun(const ChaosRun& run, ChaosReport* report) {
  ChaosReport& r = *report;
  r.violations = Violations(run, r);
  r.passed = r.violations.empty();
  r.json["heal_target"] = HealTarget(run, r);
  r.json["faults"] = FaultsJson(r.faults);
  r.json["seed"] = run.options.seed;
  r.json["learners"] = run.spec.learners;
  r.json["ranks_per_learner"] = ChaosRanks(run.spec);
  r.json["steps"] = run.options.steps;
  r.json["rounds"] = r.rounds;
  r.json["rounds_checked"] = r.rounds_checked;
  r.json["digest_mismatches"] = r.digest_mismatches;
  r.json["rank_rounds_checked"] = r.rank_rounds_checked;
  r.json["rank_digest_mismatches"] = r.rank_digest_mismatches;
  r.json["training_steps_checked"] = r.training_steps_checked;
  r.json["lr_mismatch_steps"] = r.lr_mismatch_steps;
  r.json["optimizer_step_mismatch_steps"] = r.optimizer_step_mismatch_steps;
  r.json["stall_bound_s"] = r.stall_bound_s;
  r.json["stall_count"] = r.stalls;
  r.json["max_wait_learner_fault_s"] = r.max_wait_learner_fault_s;
  r.json["max_wait_lighthouse_s"] = r.max_wait_lighthouse_s;
  r.json["max_wait_no_fault_s"] = r.max_wait_no_fault_s;
  r.json["passed_over"] = r.passed_over;
  r.json["losses_finite"] = r.losses_finite;
  r.json["eval_loss"] = r.eval_loss;
  r.json["reference_eval_loss"] = r.reference_eval_loss;
  r.json["loss_tolerance"] = run.options.loss_tolerance;
  r.json["wall_s"] = r.wall_s;
  r.json["reference_wall_s"] = r.reference_wall_s;
  r.json["link_rate_mbit"] = SettingValue(run.spec.settings, "link_rate_mbit", 0);
  r.json["passed"] = r.passed;
  r.json["violations"] = r.violations;
}

}  // namespace mend::cli
