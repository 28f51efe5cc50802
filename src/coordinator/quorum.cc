#include "coordinator/quorum.h"

#include <algorithm>
#include <climits>
#include <functional>

namespace mend::coordinator {
namespace {

constexpr Micros kGraceSafetyFactor = 2;
constexpr size_t kRecentRounds = 8;
// The deadline heap is swept of finished joins once it holds more than this
// many entries per pending join (plus the slack), which keeps a sweep's cost
// a small constant per join.
constexpr size_t kStaleDeadlineFactor = 4;
constexpr size_t kStaleDeadlineSlack = 1024;

}  // namespace

QuorumMachine::QuorumMachine(QuorumOptions options)
    : options_(std::move(options)), grace_window_(options_.grace_window) {}

void QuorumMachine::AddJoin(Membership& membership, LearnerRecord& record, PendingJoin join) {
  if (late_watch_ && late_watch_->missing.erase(record.id) > 0) {
    Micros lateness = join.joined_at - late_watch_->quorum_reached_at;
    if (lateness <= options_.grace_window) RecordNeed(lateness);
  }
  if (join.after_finished) after_finished_joins_++;
  if (IsFinal(join)) {
    final_joins_++;
    final_close_at_ =
        std::min(final_close_at_, join.joined_at + (join.deadline - join.joined_at) / 2);
  }
  join_deadlines_.push_back({join.deadline, record.session_id, join.waiter_id});
  std::push_heap(join_deadlines_.begin(), join_deadlines_.end(), std::greater<>());
  if (join_deadlines_.size() >
      kStaleDeadlineFactor * (membership.counts().pending + 1) + kStaleDeadlineSlack) {
    DropStaleDeadlines(membership);
  }
  membership.Mutate(record, [&](LearnerRecord& r) {
    r.join = std::move(join);
    r.step = std::max(r.step, r.join->step);
    r.tokens_since_last_round = r.join->tokens_since_last_round;
    r.last_round_id = r.join->last_round_id;
  });
}

std::optional<PendingJoin> QuorumMachine::RemoveJoin(Membership& membership,
                                                     LearnerRecord& record) {
  std::optional<PendingJoin> taken;
  if (!record.join) return taken;
  membership.Mutate(record, [&](LearnerRecord& r) {
    taken = std::move(r.join);
    r.join.reset();
  });
  if (IsFinal(*taken) && final_joins_ > 0 && --final_joins_ == 0) final_close_at_ = INT64_MAX;
  if (taken->after_finished && after_finished_joins_ > 0) after_finished_joins_--;
  return taken;
}

bool QuorumMachine::IsWaiting(Membership& membership, const JoinDeadline& entry) const {
  const LearnerRecord* record = membership.FindSession(entry.session_id);
  return record && record->join && record->join->waiter_id == entry.waiter_id;
}

void QuorumMachine::DropStaleDeadlines(Membership& membership) {
  std::erase_if(join_deadlines_,
                [&](const JoinDeadline& entry) { return !IsWaiting(membership, entry); });
  std::make_heap(join_deadlines_.begin(), join_deadlines_.end(), std::greater<>());
}

std::vector<std::string> QuorumMachine::ExpiredJoins(Membership& membership, Micros now) {
  std::vector<std::string> expired;
  while (!join_deadlines_.empty() && join_deadlines_.front().deadline <= now) {
    std::pop_heap(join_deadlines_.begin(), join_deadlines_.end(), std::greater<>());
    JoinDeadline entry = join_deadlines_.back();
    join_deadlines_.pop_back();
    if (IsWaiting(membership, entry)) {
      expired.push_back(membership.FindSession(entry.session_id)->id);
    }
  }
  return expired;
}

Micros QuorumMachine::NextDeadline() const {
  Micros next = INT64_MAX;
  if (!join_deadlines_.empty()) next = join_deadlines_.front().deadline;
  // (The job's last round closes when every eligible learner joined, or at
  // final_close_at_: not at the grace window's end, which a waiting round
  // would otherwise report as due at every later tick.)
  if (final_joins_ > 0) {
    next = std::min(next, final_close_at_);
  } else if (quorum_reached_at_) {
    next = std::min(next, *quorum_reached_at_ + grace_window_);
  }
  return next;
}

std::optional<QuorumMachine::Closed> QuorumMachine::MaybeClose(Membership& membership, Micros now) {
  const MembershipCounts& counts = membership.counts();
  bool quorum = counts.pending >= options_.min_learners && 2 * counts.pending >= counts.alive;
  if (!quorum) {
    quorum_reached_at_.reset();
    return std::nullopt;
  }
  if (counts.pending == 1 && after_finished_joins_ == 1) {
    // A learner of the finished job, without its final state, alone: no new
    // job of one (its join ends at its deadline, told why: LighthouseCore).
    quorum_reached_at_.reset();
    return std::nullopt;
  }
  if (!quorum_reached_at_) quorum_reached_at_ = now;
  if (!IncludesNewestState(membership)) {
    // Wait for a learner that has it (it joins at its next boundary, or is
    // declared dead after the heartbeat timeout); no grace timer meanwhile.
    quorum_reached_at_.reset();
    return std::nullopt;
  }
  std::string closed_by;
  if (final_joins_ > 0 && counts.eligible_missing + counts.slow_missing > 0) {
    // The job's last round waits for every learner still training (a fast
    // path or a grace window closed it without one a few steps behind, and
    // the two ended with different models), up to half the join's timeout.
    // A slow one too: no later round is stalled by waiting for it, and left
    // out it would end with a model of its own.
    if (now < final_close_at_) return std::nullopt;
    closed_by = "final_wait";
  } else if (counts.previous_joined > 0 && counts.previous_missing == 0) {
    closed_by = "fast_path";
  } else if (counts.eligible_missing == 0) {
    closed_by = "all_joined";
  } else if (grace_window_ == 0) {
    closed_by = "min_quorum";
  } else if (now >= *quorum_reached_at_ + grace_window_) {
    closed_by = "grace";
  } else {
    return std::nullopt;
  }
  Closed closed;
  closed.round = Close(membership, now, std::move(closed_by), &closed.joins);
  return closed;
}

void QuorumMachine::DoubtLatestRound(Membership& membership, LearnerRecord& record) const {
  const uint64_t round_id = record.last_member_round;
  if (round_id == 0 || record.last_round_id != round_id) return;
  auto round = std::find_if(history_.rbegin(), history_.rend(),
                            [round_id](const auto& r) { return r->id == round_id; });
  if (round == history_.rend()) return;
  membership.CountVisits((*round)->members.size());
  for (const MemberInfo& member : (*round)->members) {
    if (member.id != record.id) continue;
    membership.Mutate(record, [&](LearnerRecord& r) { r.last_round_id = member.last_round_id; });
  }
}

bool QuorumMachine::IncludesNewestState(const Membership& membership) const {
  return membership.newest_alive_round() <= membership.newest_pending_round();
}

std::shared_ptr<Round> QuorumMachine::Close(Membership& membership, Micros now,
                                            std::string closed_by,
                                            std::vector<std::pair<PendingJoin, uint32_t>>* joins) {
  auto round = std::make_shared<Round>();
  round->closed_by = std::move(closed_by);
  round->closed_at = now;
  round->quorum_reached_at = *quorum_reached_at_;
  round->first_join_at = now;
  round->grace_window = grace_window_;

  std::optional<LateWatch> late_watch = WatchLateArrivals(membership, *round);
  // The round id must be above every member's last round, so look first.
  const uint64_t newest = membership.newest_pending_round();
  round->heal_round_id = newest;
  round->id = std::max(next_round_id_, newest + 1);
  round->rendezvous_prefix = RoundPrefix(round->id);
  next_round_id_ = round->id + 1;

  auto taken = membership.TakePendingForRound(round->id);  // (every pending join)
  final_joins_ = 0;
  final_close_at_ = INT64_MAX;
  after_finished_joins_ = 0;
  joins->reserve(taken.size());
  round->members.reserve(taken.size());
  for (size_t rank = 0; rank < taken.size(); ++rank) {
    PendingJoin& join = taken[rank].second;
    round->members.push_back(MemberOf(*taken[rank].first, join));
    // Each member's count is bounded by validation, their sum is not: saturate.
    if (__builtin_add_overflow(round->total_tokens, join.tokens_since_last_round,
                               &round->total_tokens)) {
      round->total_tokens = UINT64_MAX;
    }
    round->first_join_at = std::min(round->first_join_at, join.joined_at);
    joins->emplace_back(std::move(join), static_cast<uint32_t>(rank));
  }
  for (const MemberInfo& member : round->members) round->step = std::max(round->step, member.step);
  Micros need = 0;
  for (const auto& [join, rank] : *joins) {
    need = std::max(need, join.joined_at - round->quorum_reached_at);
  }
  AssignHealSources(*round);
  recent_needs_.push_back(0);
  RecordNeed(need);
  late_watch_ = std::move(late_watch);
  quorum_reached_at_.reset();

  Remember(round);
  return round;
}

MemberInfo QuorumMachine::MemberOf(const LearnerRecord& record, const PendingJoin& join) {
  MemberInfo member;
  member.id = record.id;
  member.step = join.step;
  member.tokens_since_last_round = join.tokens_since_last_round;
  member.last_round_id = join.last_round_id;
  member.rack = record.rack;
  // Where its data plane is reached: as registered, else its (group rank
  // 0's) data-plane host, which a member's failed connect names.
  member.address = !record.address.empty() || record.rank_addresses.empty()
                       ? record.address
                       : record.rank_addresses.front();
  return member;
}

void QuorumMachine::Remember(std::shared_ptr<Round> round) {
  history_member_count_ += round->members.size();
  history_.push_back(std::move(round));
  while (history_.size() > 1 && (history_.size() > options_.history_size ||
                                 history_member_count_ > options_.history_members)) {
    history_member_count_ -= history_.front()->members.size();
    history_.pop_front();
  }
}

void QuorumMachine::AssignHealSources(Round& round) const {
  std::vector<const MemberInfo*> sources;
  for (const MemberInfo& member : round.members) {
    if (member.last_round_id == round.heal_round_id) sources.push_back(&member);
  }
  size_t next = 0;
  for (MemberInfo& member : round.members) {
    if (member.last_round_id == round.heal_round_id) continue;
    std::vector<const MemberInfo*> candidates;
    if (options_.rack_aware) {
      for (const MemberInfo* source : sources) {
        if (source->rack == member.rack) candidates.push_back(source);
      }
    }
    if (candidates.empty()) candidates = sources;
    const MemberInfo* source = candidates[next++ % candidates.size()];
    member.heal_from = source->id;
    round.heal_to[source->id].push_back(member.id);
  }
}

void QuorumMachine::RecordNeed(Micros need) {
  if (!options_.adaptive || recent_needs_.empty()) return;
  recent_needs_.back() = std::max(recent_needs_.back(), need);
  while (recent_needs_.size() > kRecentRounds) recent_needs_.pop_front();
  Micros needed = *std::max_element(recent_needs_.begin(), recent_needs_.end());
  Micros floor = std::min(options_.grace_window_min, options_.grace_window);
  grace_window_ = std::clamp(kGraceSafetyFactor * needed, floor, options_.grace_window);
}

std::optional<QuorumMachine::LateWatch> QuorumMachine::WatchLateArrivals(
    const Membership& membership, const Round& round) const {
  if (!options_.adaptive || round.closed_by != "grace" ||
      membership.counts().eligible_missing == 0) {
    return std::nullopt;
  }
  LateWatch watch;
  watch.quorum_reached_at = round.quorum_reached_at;
  for (const auto& [id, record] : membership.records()) {
    if (record->eligible() && !record->join) watch.missing.insert(id);
  }
  return watch;
}

}  // namespace mend::coordinator
