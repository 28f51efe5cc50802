// LighthouseCore's registration: who may join the job (its group size and
// shared settings, set by the first learner of a job), a new session, and
// what a learner registering again ends of its old one.
#include <openssl/rand.h>

#include <algorithm>
#include <charconv>
#include <map>
#include <set>
#include <string_view>

#include "absl/strings/str_split.h"
#include "coordinator/lighthouse_core.h"
#include "core/status_format.h"
#include "fmt/format.h"
#include "fmt/ranges.h"

namespace mend::coordinator {
namespace {

// "key=value" entries by key.
std::map<std::string_view, std::string_view> ByKey(const std::vector<std::string>& settings) {
  std::map<std::string_view, std::string_view> by_key;
  for (const std::string& setting : settings) {
    const size_t equals = setting.find('=');
    by_key.emplace(std::string_view(setting).substr(0, equals),
                   std::string_view(setting).substr(equals + 1));
  }
  return by_key;
}

// Where two values of the form "<summary>: <item> <item> ..." (a model's
// shapes, its frozen parameters' digests) first differ: " (first
// difference: item 3, <mine> against <job's>)", or "" for other values.
std::string FirstDifference(std::string_view mine, std::string_view job) {
  const size_t mine_list = mine.find(": ");
  const size_t job_list = job.find(": ");
  if (mine_list == std::string_view::npos || job_list == std::string_view::npos) return "";
  auto items = [](std::string_view list) -> std::vector<absl::string_view> {
    return absl::StrSplit(absl::string_view(list.data(), list.size()), ' ', absl::SkipEmpty());
  };
  const std::vector<absl::string_view> mine_items = items(mine.substr(mine_list + 2));
  const std::vector<absl::string_view> job_items = items(job.substr(job_list + 2));
  const size_t listed = std::min(mine_items.size(), job_items.size());
  for (size_t i = 0; i < listed; ++i) {
    if (mine_items[i] == "..." || job_items[i] == "...") {
      return fmt::format(" (the first {} items agree: they differ past the listed ones)", i);
    }
    if (mine_items[i] != job_items[i]) {
      return fmt::format(" (first difference: item {}, {} against {})", i + 1, mine_items[i],
                         job_items[i]);
    }
  }
  return "";
}

// Why a learner's shared settings cannot join the job's: each key whose
// value differs, with the job's.
std::string SettingsDiffer(const std::vector<std::string>& mine,
                           const std::vector<std::string>& job, const std::string& set_by) {
  const auto my_values = ByKey(mine);
  const auto job_values = ByKey(job);
  std::vector<std::string> differences;
  auto value = [](const auto& values, std::string_view key) -> std::string {
    auto it = values.find(key);
    return it == values.end() ? std::string("(not sent)") : std::string(it->second);
  };
  std::set<std::string_view> keys;
  for (const auto& [key, _] : my_values) keys.insert(key);
  for (const auto& [key, _] : job_values) keys.insert(key);
  for (std::string_view key : keys) {
    const std::string mine_value = value(my_values, key);
    const std::string job_value = value(job_values, key);
    if (mine_value != job_value) {
      differences.push_back(fmt::format("{} = {} (this job's learners have {}){}", key, mine_value,
                                        job_value, FirstDifference(mine_value, job_value)));
    }
  }
  return fmt::format(
      "{}: every learner of a job must agree on it (the rounds' schedule, merge and outer step); "
      "the job's alive learners have the settings of '{}', the first of them to register",
      fmt::join(differences, "; "), set_by);
}

// The job's last step when its learners end with a final merge, from their
// shared settings (SharedSettings: "total_steps=N", "final_merge=true"); 0
// when it has none, or the settings do not say (an older learner's).
uint64_t FinalStep(const std::vector<std::string>& settings) {
  uint64_t total = 0;
  bool final_merge = false;
  for (const std::string& setting : settings) {
    std::string_view text = setting;
    if (text.starts_with("total_steps=")) {
      text.remove_prefix(std::string_view("total_steps=").size());
      uint64_t value = 0;
      auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (error == std::errc() && end == text.data() + text.size()) total = value;
    } else if (text == "final_merge=true") {
      final_merge = true;
    }
  }
  return final_merge ? total : 0;
}

}  // namespace

StatusOr<RegisterResult> LighthouseCore::Register(const RegisterArgs& args) {
  if (!args.job_id.empty() && args.job_id != options_.job_id) {
    return InvalidArgumentError(fmt::format("job_id = \"{}\": this lighthouse serves job \"{}\"",
                                            args.job_id, options_.job_id));
  }
  Completions completions;
  RegisterResult result;
  bool wake = false;
  {
    MutexLock lock(mu_);
    const LearnerRecord* previous = membership_.FindAny(args.learner_id);
    MEND_RETURN_IF_ERROR(AdmitLocked(args, previous));
    Micros before = NextDeadlineLocked();
    Micros now = clock_->NowMicros();
    std::optional<PendingJoin> replaced;
    bool known = previous != nullptr;
    // A known learner registering again is a new process: the round its old
    // session was a member of will not see it.
    std::vector<uint64_t> old_rounds;
    if (previous) old_rounds = MemberRoundsLocked(*previous);
    do {
      RAND_bytes(reinterpret_cast<unsigned char*>(&result.session_id), sizeof result.session_id);
    } while (result.session_id == 0);
    LearnerRecord& record =
        membership_.Register(args.learner_id, result.session_id, args.rack, args.address, args.step,
                             args.last_round_id, now, &replaced);
    record.rank_addresses = args.rank_addresses;
    record.job_epoch = job_epoch_;
    // A new process: what others could not reach before is not held
    // against it (a learner that restarted looked unreachable meanwhile).
    ForgiveLocked(args.learner_id);
    const uint32_t host = membership_.HostIndex(args.peer_host);
    membership_.Mutate(record, [&](LearnerRecord& r) {
      r.peer_host = args.peer_host;
      r.host = host;
      r.loopback_host = args.loopback_host;
    });
    RefuseStrandedLocked(record, now, &completions);
    EndOldSessionLocked(args.learner_id, std::move(replaced), old_rounds, &completions);
    counters_.registrations++;
    events_.Add(now, known ? "re-registered" : "registered", args.learner_id,
                fmt::format("step {}, last round {}{}", args.step, args.last_round_id,
                            args.rack.empty() ? "" : ", rack " + args.rack));
    MaybeCloseLocked(now, &completions);
    wake = NextDeadlineLocked() < before;
  }
  Finish(completions);
  result.lighthouse_instance = instance_id_;
  result.heartbeat_interval = options_.heartbeat_interval;
  result.heartbeat_timeout = options_.heartbeat_timeout;
  result.ack_interval = options_.ack_interval;
  if (wake && wakeup_) wakeup_();
  return result;
}

void LighthouseCore::EndOldSessionLocked(const std::string& learner_id,
                                         std::optional<PendingJoin> replaced,
                                         const std::vector<uint64_t>& old_rounds,
                                         Completions* completions) {
  if (replaced) {
    completions->push_back([done = std::move(replaced->done), id = learner_id]() {
      done(AbortedError(fmt::format(
          "learner '{}' registered again; this Quorum call belongs to the old session", id)));
    });
  }
  for (uint64_t old_round : old_rounds) {
    AbortRoundLocked(old_round,
                     fmt::format("learner '{}' restarted (registered again)", learner_id),
                     completions);
  }
}

Status LighthouseCore::AdmitLocked(const RegisterArgs& args, const LearnerRecord* previous) {
  // The job's group size and shared settings are the alive learners'; the
  // first to register when no other is alive (a new job, or a job's
  // learners all restarted with another configuration) sets them. A
  // learner of another group size could not take part in the rounds (slice
  // r goes to rank r), nor one with another round schedule or merge.
  const size_t others_alive =
      membership_.counts().alive - (previous != nullptr && previous->alive ? 1 : 0);
  // (An older learner sends no settings: it is not checked; starting a job
  // anew, it clears the old job's.)
  if (others_alive == 0) {
    if (args.group_size != group_size_ || ByKey(args.job_settings) != ByKey(job_settings_)) {
      ++job_epoch_;       // the learners that were dead register again to come back
      finished_.reset();  // (another job)
    }
    // The rounds so far closed while no learner registering from now on
    // was alive: none of them is news that a round left it out (a second
    // job on a standing lighthouse, or a job restarted whole, would
    // otherwise take the old job's last round for one that closed without
    // it at every boundary, and never merge).
    news_after_round_ = quorum_.latest_round_id();
    group_size_ = args.group_size;
    group_size_set_by_ = args.learner_id;
    job_settings_ = args.job_settings;
    job_settings_set_by_ = args.learner_id;
    quorum_.set_final_step(FinalStep(job_settings_));
  } else if (args.group_size != group_size_) {
    return InvalidArgumentError(
        fmt::format("group_size = {}: this job's learners are groups of {} rank(s) (set by '{}')",
                    args.group_size, group_size_, group_size_set_by_));
  } else if (job_settings_.empty()) {
    job_settings_ = args.job_settings;
    job_settings_set_by_ = args.learner_id;
    quorum_.set_final_step(FinalStep(job_settings_));
  } else if (!args.job_settings.empty() && ByKey(args.job_settings) != ByKey(job_settings_)) {
    return InvalidArgumentError(
        SettingsDiffer(args.job_settings, job_settings_, job_settings_set_by_));
  }
  // A loopback data-plane host works only while every learner runs on
  // one host: a learner on another host could connect in no round.
  if (!args.loopback_host.empty()) {
    if (const LearnerRecord* other =
            AliveOnAnotherHostLocked(args.peer_host, args.learner_id, /*loopback_only=*/false)) {
      return InvalidArgumentError(
          LoopbackRefusal(args.learner_id, args.peer_host, args.loopback_host, *other));
    }
  }
  return OkStatus();
}

void LighthouseCore::RefuseStrandedLocked(const LearnerRecord& record, Micros now,
                                          Completions* completions) {
  // Learners on other hosts that gave a loopback data-plane host could
  // connect in no round with this one: they are refused now (their join
  // ends with the reason, or their next call finds them gone and their
  // registration again is refused), not left to fail every round.
  while (const LearnerRecord* stranded =
             AliveOnAnotherHostLocked(record.peer_host, record.id, /*loopback_only=*/true)) {
    LearnerRecord& other = *membership_.FindAny(stranded->id);
    const std::string why = LoopbackRefusal(other.id, other.peer_host, other.loopback_host, record);
    AbortJoinLocked(other, InvalidArgumentError(why), completions);
    for (uint64_t round_id : MemberRoundsLocked(other)) {
      AbortRoundLocked(round_id, why, completions);
    }
    membership_.MarkGone(other, now, /*left=*/true);
    events_.Add(now, "refused", other.id, why);
  }
}

void LighthouseCore::ForgiveLocked(const std::string& learner_id) {
  if (auto it = suspects_.find(learner_id); it != suspects_.end()) {
    it->second.reports.clear();
    it->second.until_round = 0;
    it->second.ignore_through_round = quorum_.latest_round_id();
  }
}

const LearnerRecord* LighthouseCore::AliveOnAnotherHostLocked(const std::string& host,
                                                              const std::string& except,
                                                              bool loopback_only) const {
  if (host.empty() || !membership_.AliveOnAnotherHost(host, except, loopback_only)) return nullptr;
  for (const auto& [id, record] : membership_.records()) {  // (rare: a refusal follows)
    if (id != except && record->alive && !record->peer_host.empty() && record->peer_host != host &&
        (!loopback_only || !record->loopback_host.empty())) {
      return record.get();
    }
  }
  return nullptr;
}

std::string LighthouseCore::LoopbackRefusal(const std::string& learner_id,
                                            const std::string& peer_host,
                                            const std::string& loopback_host,
                                            const LearnerRecord& other) {
  return fmt::format(
      "dataplane_host = \"{}\": learner '{}' (on {}) gave a loopback data-plane host, but "
      "learner '{}' runs on another host ({}) and could not reach it; set dataplane_host to an "
      "address of each learner's host that the others reach",
      loopback_host, learner_id, peer_host == "local" ? "the lighthouse's host" : peer_host,
      other.id, other.peer_host == "local" ? "the lighthouse's" : other.peer_host);
}

}  // namespace mend::coordinator
