#include "coordinator/lighthouse_core.h"

#include <algorithm>
#include <climits>
#include <optional>
#include <string_view>

#include "absl/container/flat_hash_set.h"
#include "core/round_keys.h"
#include "core/status_format.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "spdlog/spdlog.h"

namespace mend::coordinator {
namespace {

// The fail-slow detector looks at the step-time windows this often at most.
constexpr Micros kFailSlowScanInterval = 200 * kMicrosPerMilli;

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
        waiter_id = AddJoinLocked(record, args, now, std::move(done));
      }
      MaybeCloseLocked(now, &completions);
    }
    wake = NextDeadlineLocked() < before;
  }
  Finish(completions);
  if (wake && wakeup_) wakeup_();
  return waiter_id;
}

uint64_t LighthouseCore::AddJoinLocked(LearnerRecord& record, const QuorumArgs& args, Micros now,
                                       QuorumCallback done) {
  PendingJoin join;
  if (finished_ && !finished_->learners.contains(record.id)) {
    finished_.reset();  // a learner the finished job did not have: a new job
  }
  join.after_finished = finished_ && args.last_round_id < finished_->round_id;
  join.waiter_id = next_waiter_id_++;
  join.last_round_id = args.last_round_id;
  join.step = args.step;
  join.tokens_since_last_round = args.tokens_since_last_round;
  join.joined_at = now;
  join.deadline = now + args.timeout;
  join.give_up_short_of_quorum = args.give_up_short_of_quorum;
  join.done = std::move(done);
  const uint64_t waiter_id = join.waiter_id;
  quorum_.AddJoin(membership_, record, std::move(join));
  counters_.joins++;
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

}  // namespace mend::coordinator
