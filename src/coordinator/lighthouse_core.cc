#include "coordinator/lighthouse_core.h"

#include <openssl/rand.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <map>
#include <optional>
#include <set>
#include <string_view>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_split.h"
#include "core/round_keys.h"
#include "core/status_format.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "spdlog/spdlog.h"

namespace mend::coordinator {
namespace {

// The fail-slow detector looks at the step-time windows this often at most.
constexpr Micros kFailSlowScanInterval = 200 * kMicrosPerMilli;
// Reports that a member could not connect to another count for this many
// rounds; a learner left out for it stays out for 1, 2, 4, ... rounds.
constexpr uint64_t kSuspectRounds = 16;
constexpr uint32_t kMaxLeftOutRounds = 64;

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

}  // namespace

LighthouseOptions LighthouseOptionsFromConfig(const Config& config) {
  LighthouseOptions options;
  options.job_id = config.job_id;
  options.quorum.job_id = config.job_id;
  options.quorum.min_learners = static_cast<size_t>(config.quorum_min_learners);
  options.quorum.grace_window = config.grace_window_ms * kMicrosPerMilli;
  options.quorum.grace_window_min = config.grace_window_min_ms * kMicrosPerMilli;
  options.quorum.adaptive = config.grace_window_adaptive;
  options.quorum.rack_aware = config.rack_aware;
  options.failslow.zscore_threshold = config.failslow_zscore_threshold;
  options.failslow.window_steps = static_cast<size_t>(config.failslow_window_steps);
  options.failslow.min_samples =
      std::max<size_t>(2, static_cast<size_t>(config.failslow_window_steps) / 2);
  options.heartbeat_interval = config.heartbeat_ms * kMicrosPerMilli;
  options.heartbeat_timeout = config.heartbeat_timeout_ms * kMicrosPerMilli;
  options.ack_interval =
      std::max<Micros>(options.heartbeat_interval, options.heartbeat_timeout / 4);
  return options;
}

namespace {

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

// The rounds' prefixes carry the lighthouse's instance (RendezvousPrefix).
LighthouseOptions WithIncarnation(LighthouseOptions options, uint64_t instance_id) {
  options.quorum.incarnation = InstanceText(instance_id);
  return options;
}

}  // namespace

LighthouseCore::LighthouseCore(LighthouseOptions options, const Clock* clock, uint64_t instance_id)
    : options_(WithIncarnation(std::move(options), instance_id)),
      clock_(clock),
      instance_id_(instance_id),
      started_at_(clock->NowMicros()),
      store_(options_.store, clock),
      membership_(options_.failslow),
      quorum_(options_.quorum),
      events_(options_.event_capacity) {}

void LighthouseCore::Finish(Completions& completions) {
  for (auto& completion : completions) completion();
  completions.clear();
}

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
    if (auto it = suspects_.find(args.learner_id); it != suspects_.end()) {
      it->second.reports.clear();
      it->second.until_round = 0;
      it->second.ignore_through_round = quorum_.latest_round_id();
    }
    const uint32_t host = membership_.HostIndex(args.peer_host);
    membership_.Mutate(record, [&](LearnerRecord& r) {
      r.peer_host = args.peer_host;
      r.host = host;
      r.loopback_host = args.loopback_host;
    });
    // Learners on other hosts that gave a loopback data-plane host could
    // connect in no round with this one: they are refused now (their join
    // ends with the reason, or their next call finds them gone and their
    // registration again is refused), not left to fail every round.
    while (const LearnerRecord* stranded =
               AliveOnAnotherHostLocked(args.peer_host, args.learner_id, /*loopback_only=*/true)) {
      LearnerRecord& other = *membership_.FindAny(stranded->id);
      const std::string why =
          LoopbackRefusal(other.id, other.peer_host, other.loopback_host, record);
      AbortJoinLocked(other, InvalidArgumentError(why), &completions);
      for (uint64_t round_id : MemberRoundsLocked(other)) {
        AbortRoundLocked(round_id, why, &completions);
      }
      membership_.MarkGone(other, now, /*left=*/true);
      events_.Add(now, "refused", other.id, why);
    }
    if (replaced) {
      completions.push_back([done = std::move(replaced->done), id = args.learner_id]() {
        done(AbortedError(fmt::format(
            "learner '{}' registered again; this Quorum call belongs to the old session", id)));
      });
    }
    for (uint64_t old_round : old_rounds) {
      AbortRoundLocked(old_round,
                       fmt::format("learner '{}' restarted (registered again)", args.learner_id),
                       &completions);
    }
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

StatusOr<HeartbeatResult> LighthouseCore::Heartbeat(const HeartbeatArgs& args) {
  Completions completions;
  HeartbeatResult result;
  bool wake = false;
  {
    MutexLock lock(mu_);
    MEND_ASSIGN_OR_RETURN(LearnerRecord * record,
                          FindCurrentLocked(args.learner_id, args.session_id));
    Micros before = NextDeadlineLocked();
    Micros now = clock_->NowMicros();
    bool was_dead = !record->alive;
    membership_.RecordHeartbeat(*record, now, args.step, args.tokens_total,
                                args.tokens_since_last_round, args.step_ms);
    counters_.heartbeats++;
    if (was_dead) {
      events_.Add(now, "revived", record->id, "heartbeats again after being declared dead");
      MaybeCloseLocked(now, &completions);
      wake = NextDeadlineLocked() < before;
    }
    result.slow = record->slow;
    result.slow_zscore = membership_.vitals(*record).slow_zscore;
    result.latest_round_id = quorum_.latest_round_id();
    result.waiting = record->join.has_value();
    // Only a learner whose join is still pending can have been passed over.
    // A member of that round, whose answer may not have reached it yet, must
    // not read the round's step as news that the round left it out.
    result.latest_round_step = result.waiting && quorum_.latest_round_id() > news_after_round_
                                   ? quorum_.latest_round_step()
                                   : 0;
    result.short_of_quorum = result.waiting && now - started_at_ >= options_.heartbeat_timeout &&
                             membership_.counts().alive < options_.quorum.min_learners;
  }
  Finish(completions);
  if (wake && wakeup_) wakeup_();
  return result;
}

Status LighthouseCore::Leave(const std::string& learner_id, uint64_t session_id,
                             const std::string& reason) {
  Completions completions;
  bool wake = false;
  {
    MutexLock lock(mu_);
    MEND_ASSIGN_OR_RETURN(LearnerRecord * record, membership_.Find(learner_id, session_id));
    Micros before = NextDeadlineLocked();
    Micros now = clock_->NowMicros();
    AbortJoinLocked(*record, AbortedError(fmt::format("learner '{}' left the job", learner_id)),
                    &completions);
    membership_.MarkGone(*record, now, /*left=*/true);
    events_.Add(now, "left", learner_id, reason.empty() ? "left the job" : reason);
    MaybeCloseLocked(now, &completions);
    // One learner fewer may complete a quorum and start its grace window.
    wake = NextDeadlineLocked() < before;
  }
  Finish(completions);
  if (wake && wakeup_) wakeup_();
  return OkStatus();
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

StatusOr<std::string> LighthouseCore::SessionLearner(uint64_t session_id) {
  MutexLock lock(mu_);
  LearnerRecord* record = membership_.FindSession(session_id);
  if (record != nullptr && !record->left) return record->id;
  if (membership_.WasSuperseded(session_id)) {
    return AlreadyExistsError(
        fmt::format("session {:016x}: another process registered with its learner id", session_id));
  }
  return NotFoundError(fmt::format("session {:016x} is not known here", session_id));
}

void LighthouseCore::KeepEndedSessions(std::vector<uint64_t>& sessions) {
  MutexLock lock(mu_);
  std::erase_if(sessions, [this](uint64_t session_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    LearnerRecord* record = membership_.FindSession(session_id);
    return record != nullptr && !record->left;
  });
}

StatusOr<LearnerRecord*> LighthouseCore::FindCurrentLocked(const std::string& learner_id,
                                                           uint64_t session_id) {
  MEND_ASSIGN_OR_RETURN(LearnerRecord * record, membership_.Find(learner_id, session_id));
  if (record->job_epoch != job_epoch_) {
    return NotFoundError(fmt::format(
        "learner '{}': the job was started anew by '{}' while it was gone (group size {}); "
        "register again",
        learner_id, job_settings_set_by_, group_size_));
  }
  return record;
}

uint64_t LighthouseCore::Quorum(const QuorumArgs& args, QuorumCallback done) {
  Completions completions;
  uint64_t waiter_id = 0;
  bool wake = false;
  {
    MutexLock lock(mu_);
    Micros before = NextDeadlineLocked();
    auto found = FindCurrentLocked(args.learner_id, args.session_id);
    if (!found.ok()) {
      completions.push_back([done = std::move(done), s = found.status()]() { done(s); });
    } else {
      LearnerRecord& record = **found;
      Micros now = clock_->NowMicros();
      AbortJoinLocked(record,
                      AbortedError(fmt::format("learner '{}': replaced by a newer Quorum call",
                                               args.learner_id)),
                      &completions);
      NoteUnreachableLocked(record, now, &completions);
      if (!record.alive) {
        membership_.RecordHeartbeat(record, now, args.step, record.tokens_total,
                                    args.tokens_since_last_round, {});
        events_.Add(now, "revived", record.id, "joined a round after being declared dead");
      }
      membership_.Touch(record, now);
      if (record.unreachable) ReinstateIfNeededLocked(record, now);
      if (record.unreachable) {
        // It trains on alone: its join ends at once, as one that no round
        // took in time.
        membership_.Mutate(record, [&](LearnerRecord& r) {
          r.step = std::max(r.step, args.step);
          r.last_round_id = args.last_round_id;
        });
        completions.push_back([done = std::move(done), why = suspects_[record.id].why]() {
          done(DeadlineExceededError(why));
        });
      } else if (finished_ && finished_->learners.contains(record.id) &&
                 args.last_round_id < finished_->round_id && args.step >= finished_->step &&
                 membership_.counts().alive <= 1) {
        // It reached the job's end after the final round closed and the
        // others left: no round will ever come (LighthouseCore::FinishedJob).
        completions.push_back(
            [done = std::move(done), s = JobFinishedLocked(record.id)]() { done(s); });
      } else {
        waiter_id = next_waiter_id_++;
        PendingJoin join;
        if (finished_ && !finished_->learners.contains(record.id)) {
          finished_.reset();  // a learner the finished job did not have: a new job
        }
        join.after_finished = finished_ && args.last_round_id < finished_->round_id;
        join.waiter_id = waiter_id;
        join.last_round_id = args.last_round_id;
        join.step = args.step;
        join.tokens_since_last_round = args.tokens_since_last_round;
        join.joined_at = now;
        join.deadline = now + args.timeout;
        join.give_up_short_of_quorum = args.give_up_short_of_quorum;
        join.done = std::move(done);
        quorum_.AddJoin(membership_, record, std::move(join));
        counters_.joins++;
      }
      MaybeCloseLocked(now, &completions);
    }
    wake = NextDeadlineLocked() < before;
  }
  Finish(completions);
  if (wake && wakeup_) wakeup_();
  return waiter_id;
}

void LighthouseCore::CancelQuorum(const std::string& learner_id, uint64_t waiter_id) {
  Completions completions;
  bool wake = false;
  {
    MutexLock lock(mu_);
    Micros before = NextDeadlineLocked();
    LearnerRecord* record = membership_.FindAny(learner_id);
    if (record && record->join && record->join->waiter_id == waiter_id) {
      AbortJoinLocked(*record, absl::CancelledError("Quorum call cancelled by the learner"),
                      &completions);
      MaybeCloseLocked(clock_->NowMicros(), &completions);
    }
    wake = NextDeadlineLocked() < before;
  }
  Finish(completions);
  if (wake && wakeup_) wakeup_();
}

void LighthouseCore::Tick() {
  Completions completions;
  {
    MutexLock lock(mu_);
    Micros now = clock_->NowMicros();
    NoticeStallLocked(now);
    for (const std::string& id : quorum_.ExpiredJoins(membership_, now)) {
      LearnerRecord& record = *membership_.FindAny(id);
      Micros waited = now - record.join->joined_at;
      counters_.quorum_timeouts++;
      AbortJoinLocked(record,
                      record.join->after_finished && finished_
                          ? JobFinishedLocked(id)
                          : DeadlineExceededError(
                                fmt::format("learner '{}': no round closed within {} ms; {}", id,
                                            waited / kMicrosPerMilli, QuorumShortfallLocked())),
                      &completions);
    }
    if (now >= next_liveness_scan_) ScanLivenessLocked(now, &completions);
    if (now >= next_failslow_scan_) ScanFailSlowLocked(now);
    MaybeCloseLocked(now, &completions);
  }
  Finish(completions);
  store_.Tick();
}

Micros LighthouseCore::NextDeadline() {
  MutexLock lock(mu_);
  return NextDeadlineLocked();
}

Micros LighthouseCore::NextDeadlineLocked() const {
  return std::min(
      {quorum_.NextDeadline(), store_.NextDeadline(), next_liveness_scan_, next_failslow_scan_});
}

void LighthouseCore::RecordRejection(std::string_view code, std::string_view peer,
                                     std::string_view why) {
  MutexLock lock(mu_);
  counters_.rejections_by_code[std::string(code)]++;
  // At most one event a second, so a misbehaving client cannot flood the log.
  Micros now = clock_->NowMicros();
  if (last_rejection_event_ != 0 && now - last_rejection_event_ < kMicrosPerSecond) {
    suppressed_rejections_++;
    return;
  }
  std::string suppressed =
      suppressed_rejections_ ? fmt::format(" (and {} more refusals)", suppressed_rejections_) : "";
  events_.Add(now, "rejected", std::string(peer), fmt::format("{}: {}{}", code, why, suppressed));
  last_rejection_event_ = now;
  suppressed_rejections_ = 0;
}

// Ticks come at least every liveness-scan interval (NextDeadline). A gap
// of half a heartbeat timeout or more between two means the lighthouse
// itself did not run (SIGSTOP, a paused VM, swapping): the learners' silence
// over it is the lighthouse's, and their heartbeats may still sit unread in
// its sockets. Each alive learner gets a fresh heartbeat timeout from now,
// instead of all of them being declared dead on waking; one that really died
// meanwhile is declared dead a timeout later.
void LighthouseCore::NoticeStallLocked(Micros now) {
  const Micros gap = last_tick_ == 0 ? 0 : now - last_tick_;
  last_tick_ = now;
  if (gap < options_.heartbeat_timeout / 2) return;
  const size_t refreshed = membership_.TouchAlive(now);
  counters_.stalls++;
  events_.Add(
      now, "stalled", "",
      fmt::format("the lighthouse did not run for {} ms (heartbeat timeout {} ms): {} "
                  "learner(s) get a fresh heartbeat timeout",
                  gap / kMicrosPerMilli, options_.heartbeat_timeout / kMicrosPerMilli, refreshed));
}

void LighthouseCore::ScanLivenessLocked(Micros now, Completions* completions) {
  // Deaths are noticed within 5% of the timeout; scanning 10,000 learners
  // more often than that only takes the mutex from the calls.
  next_liveness_scan_ = now + std::clamp<Micros>(options_.heartbeat_timeout / 20, kMicrosPerMilli,
                                                 500 * kMicrosPerMilli);
  for (LearnerRecord* record : membership_.FindSilent(now, options_.heartbeat_timeout)) {
    Micros silent = now - membership_.vitals(*record).last_heartbeat;
    AbortJoinLocked(*record,
                    AbortedError(fmt::format("learner '{}' declared dead: no heartbeat for {} ms",
                                             record->id, silent / kMicrosPerMilli)),
                    completions);
    for (uint64_t round_id : MemberRoundsLocked(*record)) {
      AbortRoundLocked(round_id,
                       fmt::format("learner '{}' declared dead: no heartbeat for {} ms", record->id,
                                   silent / kMicrosPerMilli),
                       completions);
    }
    quorum_.DoubtLatestRound(membership_, *record);
    membership_.MarkGone(*record, now, /*left=*/false);
    counters_.deaths++;
    events_.Add(now, "dead", record->id,
                fmt::format("no heartbeat for {} ms (timeout {} ms)", silent / kMicrosPerMilli,
                            options_.heartbeat_timeout / kMicrosPerMilli));
  }
  membership_.ForgetGone(now, options_.gone_retention);
  GiveUpShortJoinsLocked(now, completions);
}

// (A job's start, when some learners have not registered yet, is not short
// of a quorum here: none is gone and no round formed yet, and the joins wait
// for the others.)
void LighthouseCore::GiveUpShortJoinsLocked(Micros now, Completions* completions) {
  const MembershipCounts& counts = membership_.counts();
  const bool had_learners = membership_.size() > counts.alive || quorum_.latest_round_id() > 0;
  if (counts.alive >= options_.quorum.min_learners || !had_learners || counts.pending == 0) return;
  std::vector<LearnerRecord*> given_up;
  for (LearnerRecord* record : membership_.pending()) {
    if (record->join->give_up_short_of_quorum &&
        now - record->join->joined_at >= options_.heartbeat_timeout) {
      given_up.push_back(record);
    }
  }
  for (LearnerRecord* record : given_up) {
    counters_.quorum_timeouts++;
    if (record->join->after_finished && finished_) {
      AbortJoinLocked(*record, JobFinishedLocked(record->id), completions);
      continue;
    }
    AbortJoinLocked(
        *record,
        DeadlineExceededError(fmt::format(
            "learner '{}': no round can form: {} of the job's learners are alive, the quorum's "
            "minimum is {} (the others left or died); it trains on and joins again at its next "
            "boundary",
            record->id, counts.alive, options_.quorum.min_learners)),
        completions);
  }
}

void LighthouseCore::ScanFailSlowLocked(Micros now) {
  next_failslow_scan_ = now + std::max(options_.heartbeat_interval, kFailSlowScanInterval);
  for (const SlowFlagChange& change : membership_.EvaluateFailSlow()) {
    if (change.slow) counters_.slow_flags++;
    events_.Add(now, change.slow ? "slow" : "recovered", change.learner_id,
                fmt::format("median step {:.1f} ms vs {:.1f} ms across learners, z = {:.1f}",
                            change.median_step_ms, change.all_median_step_ms, change.zscore));
  }
}

void LighthouseCore::MaybeCloseLocked(Micros now, Completions* completions) {
  while (auto closed = quorum_.MaybeClose(membership_, now)) {
    const Round& round = *closed->round;
    counters_.rounds_by_closed_by[round.closed_by]++;
    counters_.round_wait.Observe(static_cast<double>(round.waited()) / kMicrosPerMilli);
    for (auto& [join, rank] : closed->joins) {
      counters_.member_wait.Observe(static_cast<double>(now - join.joined_at) / kMicrosPerMilli);
    }
    // One completion for the whole round: 10,000 members cost one allocation.
    completions->push_back([joins = std::move(closed->joins), round = closed->round]() mutable {
      for (auto& [join, rank] : joins) join.done(RoundAssignment{round, rank});
    });
    LogRoundLocked(round);
    NoteFinishedLocked(round);
    if (round.id > options_.keep_round_prefixes) {
      store_.Delete(quorum_.RoundPrefix(round.id - options_.keep_round_prefixes), /*prefix=*/true);
    }
  }
  LetBackInLocked(now);
}

void LighthouseCore::NoteFinishedLocked(const Round& round) {
  const uint64_t final_step = quorum_.final_step();
  if (final_step == 0 || round.step < final_step) {
    finished_.reset();  // (the job runs again: this round is not of its end)
    return;
  }
  FinishedJob finished;
  finished.round_id = round.id;
  finished.step = round.step;
  finished.member_count = round.members.size();
  for (const MemberInfo& member : round.members) {
    if (finished.members.size() < 8) finished.members.push_back(member.id);
    finished.learners.insert(member.id);
  }
  for (const auto& [id, record] : membership_.records()) {
    if (record->job_epoch == job_epoch_) finished.learners.insert(id);
  }
  if (finished_) finished.learners.merge(finished_->learners);  // (a fragment's final round before)
  finished_ = std::move(finished);
}

Status LighthouseCore::JobFinishedLocked(const std::string& id) const {
  const FinishedJob& job = *finished_;
  return OutOfRangeError(fmt::format(
      "learner '{}': the job finished at step {}: its final round {} closed with {}{}, none of "
      "whom is left to train or heal with, and this learner holds none of that round's state",
      id, job.step, job.round_id, fmt::join(job.members, ", "),
      job.member_count > job.members.size()
          ? fmt::format(" and {} more", job.member_count - job.members.size())
          : ""));
}

// One line a round, at info: what an operator asks after the fact (who
// was left out and why, how long it waited). Naming those left out scans
// the records, only when some alive learner is not a member.
void LighthouseCore::LogRoundLocked(const Round& round) {
  const size_t alive = membership_.counts().alive;
  std::string left_out;
  if (alive > round.members.size() && spdlog::should_log(spdlog::level::info)) {
    absl::flat_hash_set<std::string_view> members;
    for (const MemberInfo& member : round.members) members.insert(member.id);
    constexpr size_t kNamed = 8;
    size_t named = 0;
    size_t others = 0;
    for (const auto& [id, record] : membership_.records()) {
      if (!record->alive || members.contains(id)) continue;
      if (named == kNamed) {
        others++;
        continue;
      }
      const char* why = record->unreachable ? "unreachable" : record->slow ? "slow" : "not joined";
      left_out += fmt::format("{}{} ({})", named++ == 0 ? "; left out: " : ", ", id, why);
    }
    if (others > 0) left_out += fmt::format(" and {} more", others);
  }
  spdlog::info("round {} (step {}) closed by {} after {} ms: {} member(s) of {} alive learner(s){}",
               round.id, round.step, round.closed_by, round.waited() / kMicrosPerMilli,
               round.members.size(), alive, left_out);
}

void LighthouseCore::NoteUnreachableLocked(const LearnerRecord& record, Micros now,
                                           Completions* completions) {
  if (record.last_member_round == 0) return;
  const std::string key =
      quorum_.RoundPrefix(record.last_member_round) + kRoundUnreachablePrefix + record.id;
  std::optional<std::string> report = store_.Get(key);
  if (!report) return;
  store_.Delete(key, /*prefix=*/false);  // read once
  if (record.unreachable) return;        // (it was the one out of reach)
  const uint64_t latest = quorum_.latest_round_id();
  const uint64_t round_id = record.last_member_round;
  for (absl::string_view peer : absl::StrSplit(*report, '\n', absl::SkipEmpty())) {
    if (peer == record.id || membership_.FindAny(std::string(peer)) == nullptr) continue;
    Suspect& suspect = suspects_[std::string(peer)];
    // (Not a round it was already left out for, nor one of an earlier process.)
    if (round_id > suspect.ignore_through_round) suspect.reports.emplace_back(round_id, record.id);
  }
  // Who is named by the most distinct others, in the recent rounds.
  std::string worst;
  std::vector<std::string> worst_reporters;
  bool tie = false;
  for (auto it = suspects_.begin(); it != suspects_.end();) {
    Suspect& suspect = it->second;
    std::erase_if(suspect.reports,
                  [&](const auto& r) { return r.first + kSuspectRounds <= latest; });
    if (suspect.reports.empty() && suspect.until_round == 0 && suspect.times_left_out == 0) {
      it = suspects_.erase(it);
      continue;
    }
    if (suspect.until_round != 0) {  // left out already
      ++it;
      continue;
    }
    std::set<std::string> reporters;
    for (const auto& [round, reporter] : suspect.reports) reporters.insert(reporter);
    if (reporters.size() > worst_reporters.size()) {
      worst = it->first;
      worst_reporters.assign(reporters.begin(), reporters.end());
      tie = false;
    } else if (!reporters.empty() && reporters.size() == worst_reporters.size()) {
      tie = true;
    }
    ++it;
  }
  if (worst_reporters.size() < 2 || tie) return;
  LearnerRecord* culprit = membership_.FindAny(worst);
  if (culprit == nullptr || !culprit->alive || culprit->unreachable) return;
  LeaveOutLocked(*culprit, worst_reporters, now, completions);
}

void LighthouseCore::LeaveOutLocked(LearnerRecord& record,
                                    const std::vector<std::string>& reporters, Micros now,
                                    Completions* completions) {
  Suspect& suspect = suspects_[record.id];
  const uint64_t rounds =
      std::min<uint64_t>(kMaxLeftOutRounds, uint64_t{1} << std::min(suspect.times_left_out, 6u));
  suspect.times_left_out++;
  suspect.until_round = quorum_.latest_round_id() + rounds;
  suspect.ignore_through_round = quorum_.latest_round_id();
  suspect.reports.clear();
  // What it said of others is discounted: it was the one out of reach.
  for (auto& [id, other] : suspects_) {
    std::erase_if(other.reports, [&](const auto& r) { return r.second == record.id; });
  }
  suspect.why = fmt::format(
      "learner '{}' is left out of the next {} round(s) (until round {} closes): learners {} could "
      "not connect to its data plane (dataplane_host {}). Is a firewall in the way, or is "
      "dataplane_host an address the others cannot reach? It trains on alone meanwhile, and is "
      "tried again after that",
      record.id, rounds, suspect.until_round, fmt::join(reporters, ", "),
      !record.rank_addresses.empty() ? fmt::format("{}", fmt::join(record.rank_addresses, ", "))
      : !record.address.empty()      ? record.address
                                     : std::string("not known"));
  spdlog::warn("{}", suspect.why);
  events_.Add(now, "unreachable", record.id,
              fmt::format("{} could not connect to it; left out of {} round(s)",
                          fmt::join(reporters, ", "), rounds));
  counters_.left_out_unreachable++;
  AbortJoinLocked(record, DeadlineExceededError(suspect.why), completions);
  membership_.Mutate(record, [](LearnerRecord& r) { r.unreachable = true; });
}

void LighthouseCore::LetBackInLocked(Micros now) {
  const uint64_t latest = quorum_.latest_round_id();
  for (auto& [id, suspect] : suspects_) {
    if (suspect.until_round == 0 || latest < suspect.until_round) continue;
    if (LearnerRecord* record = membership_.FindAny(id)) {
      ReinstateLocked(*record, now, "its rounds left out have closed");
    } else {
      suspect.until_round = 0;
    }
  }
}

void LighthouseCore::ReinstateLocked(LearnerRecord& record, Micros now, std::string_view why) {
  suspects_[record.id].until_round = 0;
  if (!record.unreachable) return;
  membership_.Mutate(record, [](LearnerRecord& r) { r.unreachable = false; });
  events_.Add(now, "reinstated", record.id,
              fmt::format("in the rounds again after it was left out as unreachable: {}", why));
}

void LighthouseCore::ReinstateIfNeededLocked(LearnerRecord& record, Micros now) {
  if (!record.unreachable) return;
  // The learners that may join rounds without it (alive, not left out), as
  // the quorum counts them: the minimum, and half of the alive ones.
  size_t left_out = 0;
  for (const auto& [id, suspect] : suspects_) {
    const LearnerRecord* other = suspect.until_round != 0 ? membership_.FindAny(id) : nullptr;
    if (other != nullptr && other->alive && other->unreachable) ++left_out;
  }
  const MembershipCounts& counts = membership_.counts();
  const size_t others = counts.alive - std::min(counts.alive, left_out);
  // (With it they may: alone, or short even with it, it is left out still
  // and trains on at once rather than wait for a round that cannot form.)
  const bool too_few = others < options_.quorum.min_learners || 2 * others < counts.alive;
  if (too_few && others + 1 >= options_.quorum.min_learners) {
    ReinstateLocked(record, now, "the others are too few for a round without it");
  }
}

// The rounds `record` was a member of that may still be running: its newest
// and, of the earlier ones, those whose keys the store still holds.
std::vector<uint64_t> LighthouseCore::MemberRoundsLocked(const LearnerRecord& record) const {
  std::vector<uint64_t> rounds;
  if (record.last_member_round != 0) rounds.push_back(record.last_member_round);
  const uint64_t latest = quorum_.latest_round_id();
  for (uint64_t round_id : record.earlier_member_rounds) {
    if (round_id != 0 && round_id + options_.keep_round_prefixes > latest)
      rounds.push_back(round_id);
  }
  return rounds;
}

void LighthouseCore::AbortRoundLocked(uint64_t round_id, const std::string& why,
                                      Completions* completions) {
  if (round_id == 0) return;
  (void)store_.Set(quorum_.RoundPrefix(round_id) + kRoundAbortKey, std::string(why), completions);
}

bool LighthouseCore::AbortJoinLocked(LearnerRecord& record, Status status,
                                     Completions* completions) {
  std::optional<PendingJoin> join = quorum_.RemoveJoin(membership_, record);
  if (!join) return false;
  if (status.code() != StatusCode::kDeadlineExceeded) counters_.quorum_aborts++;
  completions->push_back([done = std::move(join->done), s = std::move(status)]() { done(s); });
  return true;
}

std::string LighthouseCore::QuorumShortfallLocked() const {
  const MembershipCounts& counts = membership_.counts();
  return fmt::format("{} joined, quorum needs {} and at least half of the {} alive learners",
                     counts.pending, options_.quorum.min_learners, counts.alive);
}

uint64_t LighthouseCore::RecordsVisited() {
  MutexLock lock(mu_);
  return membership_.records_visited();
}

StatusSnapshot LighthouseCore::Snapshot(size_t max_learners, size_t max_rounds) {
  MutexLock lock(mu_);
  Micros now = clock_->NowMicros();
  auto ms = [](Micros micros) { return static_cast<double>(micros) / kMicrosPerMilli; };
  StatusSnapshot snap;
  snap.job_id = options_.job_id;
  snap.instance_id = instance_id_;
  snap.uptime_s = static_cast<double>(now - started_at_) / kMicrosPerSecond;
  snap.min_learners = options_.quorum.min_learners;
  snap.grace_window_max_ms = ms(options_.quorum.grace_window);
  snap.grace_window_ms = ms(quorum_.grace_window());
  snap.heartbeat_timeout_ms = ms(options_.heartbeat_timeout);
  snap.failslow_zscore_threshold = options_.failslow.zscore_threshold;
  snap.failslow_window_steps = options_.failslow.window_steps;
  const MembershipCounts& counts = membership_.counts();
  snap.learners_known = membership_.size();
  snap.learners_alive = counts.alive;
  snap.learners_slow = counts.slow;
  snap.learners_waiting = counts.pending;
  snap.latest_round_id = quorum_.latest_round_id();
  if (auto reached = quorum_.quorum_reached_at()) snap.quorum_reached_ms_ago = ms(now - *reached);
  const store::StoreStats store = store_.Stats();
  snap.store_keys = store.keys;
  snap.store_bytes = store.bytes;
  snap.store_waiters = store.waiters;
  snap.events_total = events_.total();

  std::vector<const LearnerRecord*> records;
  records.reserve(membership_.size());
  for (const auto& [id, record] : membership_.records()) records.push_back(record.get());
  auto order = [](const LearnerRecord* a, const LearnerRecord* b) {
    auto rank = [](const LearnerRecord* r) { return r->slow ? 0 : r->alive ? 1 : 2; };
    return std::make_pair(rank(a), std::string_view(a->id)) <
           std::make_pair(rank(b), std::string_view(b->id));
  };
  size_t shown = std::min(max_learners, records.size());
  std::partial_sort(records.begin(), records.begin() + static_cast<long>(shown), records.end(),
                    order);
  for (size_t i = 0; i < shown; ++i) {
    const LearnerRecord& r = *records[i];
    const LearnerVitals& v = membership_.vitals(r);
    snap.learners.push_back(LearnerView{r.id, std::string(r.state()), r.rack, r.address,
                                        r.rank_addresses, r.step, r.tokens_total, r.tokens_per_s,
                                        ms(now - v.last_heartbeat), r.slow, v.slow_zscore,
                                        v.median_step_ms, r.last_round_id, r.rounds_joined});
  }
  const auto& history = quorum_.history();
  size_t first = history.size() > max_rounds ? history.size() - max_rounds : 0;
  for (size_t i = first; i < history.size(); ++i) {
    const Round& round = *history[i];
    RoundView view;
    view.id = round.id;
    view.member_count = round.members.size();
    for (size_t m = 0; m < round.members.size() && m < StatusSnapshot::kMaxListedMembers; ++m) {
      view.members.push_back(round.members[m].id);
    }
    view.closed_by = round.closed_by;
    view.waited_ms = ms(round.waited());
    view.span_ms = ms(round.closed_at - round.first_join_at);
    view.grace_window_ms = ms(round.grace_window);
    view.age_ms = ms(now - round.closed_at);
    view.total_tokens = round.total_tokens;
    for (const auto& [source, healees] : round.heal_to) view.healing += healees.size();
    view.heal_round_id = round.heal_round_id;
    snap.rounds.push_back(std::move(view));
  }
  for (const Event& event : events_.events()) {
    snap.events.push_back(
        EventView{event.seq, ms(now - event.at), event.kind, event.learner_id, event.message});
  }
  snap.counters = counters_;
  snap.counters.store_ops = store.ops;
  return snap;
}

}  // namespace mend::coordinator
