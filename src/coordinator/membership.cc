#include "coordinator/membership.h"

#include <algorithm>

#include "core/status_format.h"
#include "fmt/format.h"

namespace mend::coordinator {
namespace {

// Tokens/s is an exponential moving average over samples at least this far apart.
constexpr Micros kRateSampleInterval = 500 * kMicrosPerMilli;
constexpr double kRateSmoothing = 0.3;

}  // namespace

std::string_view LearnerRecord::state() const {
  if (left) return "left";
  if (!alive) return "dead";
  if (unreachable) return "unreachable";
  if (join) return "waiting";
  return "training";
}

LearnerRecord& Membership::Register(const std::string& id, uint64_t session_id, std::string rack,
                                    std::string address, uint64_t step, uint64_t last_round_id,
                                    Micros now, std::optional<PendingJoin>* replaced_join) {
  auto it = records_.find(id);
  uint64_t last_member_round = 0;
  LearnerRecord::MemberRounds earlier_member_rounds{};
  if (it != records_.end()) {
    LearnerRecord& old = *it->second;
    last_member_round = old.last_member_round;
    earlier_member_rounds = old.earlier_member_rounds;
    Mutate(old, [&](LearnerRecord& r) {
      if (r.join) *replaced_join = std::move(r.join);
      r.join.reset();
      r.alive = false;
      r.slow = false;
      r.last_member_round = 0;
      r.earlier_member_rounds = {};
    });
    superseded_.insert(old.session_id);
    superseded_order_.push_back(old.session_id);
    if (superseded_order_.size() > kMaxSupersededKept) {
      superseded_.erase(superseded_order_.front());
      superseded_order_.pop_front();
    }
    // The record is replaced below; its contribution to the counts is now zero.
    Erase(old);
  }
  auto record = std::make_unique<LearnerRecord>();
  record->id = id;
  record->session_id = session_id;
  record->rack = std::move(rack);
  record->address = std::move(address);
  record->registered_at = now;
  record->step = step;
  record->last_round_id = last_round_id;
  record->window = StepTimeWindow(failslow_.window_steps);
  record->rate_sample_at = now;
  record->last_member_round = last_member_round;
  record->earlier_member_rounds = earlier_member_rounds;
  LearnerRecord& ref = *record;
  ref.vitals_index = vitals_.size();
  vitals_.push_back({&ref, now});
  by_session_[session_id] = &ref;
  records_.emplace(id, std::move(record));
  Count(ref);
  return ref;
}

StatusOr<LearnerRecord*> Membership::Find(const std::string& id, uint64_t session_id) {
  // The common case, a current session, costs one integer lookup; the
  // learner-id lookup below only tells the errors apart.
  if (LearnerRecord* current = FindSession(session_id); current && current->id == id) {
    if (!current->left) return current;
  }
  auto it = records_.find(id);
  if (it == records_.end()) {
    return NotFoundError(fmt::format(
        "learner '{}' is not registered here (the lighthouse may have restarted); register again",
        id));
  }
  LearnerRecord* record = it->second.get();
  if (record->session_id != session_id) {
    return AlreadyExistsError(fmt::format(
        "another process registered as learner '{}'{} and replaced session {:016x}: two learners "
        "were given one id, or this one was restarted elsewhere",
        id, record->address.empty() ? "" : fmt::format(" (data plane host {})", record->address),
        session_id));
  }
  if (record->left) {
    return FailedPreconditionError(fmt::format("learner '{}' has left the job", id));
  }
  return record;
}

size_t Membership::TouchAlive(Micros now) {
  records_visited_ += vitals_.size();
  size_t touched = 0;
  for (LearnerVitals& vitals : vitals_) {
    if (!vitals.alive) continue;
    vitals.last_heartbeat = std::max(vitals.last_heartbeat, now);
    ++touched;
  }
  return touched;
}

LearnerRecord* Membership::FindSession(uint64_t session_id) {
  auto it = by_session_.find(session_id);
  return it == by_session_.end() ? nullptr : it->second;
}

LearnerRecord* Membership::FindAny(const std::string& id) {
  auto it = records_.find(id);
  return it == records_.end() ? nullptr : it->second.get();
}

void Membership::RecordHeartbeat(LearnerRecord& record, Micros now, uint64_t step,
                                 uint64_t tokens_total, uint64_t tokens_since_last_round,
                                 const std::vector<double>& step_ms) {
  if (!record.alive) {
    Mutate(record, [&](LearnerRecord& r) {
      r.alive = true;
      r.gone_since = 0;
    });
  }
  LearnerVitals& vitals = vitals_[record.vitals_index];
  vitals.last_heartbeat = now;
  record.step = std::max(record.step, step);
  record.tokens_since_last_round = tokens_since_last_round;
  if (tokens_total < record.tokens_total) {
    // The learner restarted its counter; restart the rate too.
    record.rate_sample_tokens = tokens_total;
    record.rate_sample_at = now;
  }
  record.tokens_total = tokens_total;
  Micros since = now - record.rate_sample_at;
  if (since >= kRateSampleInterval) {
    double rate = static_cast<double>(tokens_total - record.rate_sample_tokens) * kMicrosPerSecond /
                  static_cast<double>(since);
    record.tokens_per_s = record.tokens_per_s == 0
                              ? rate
                              : kRateSmoothing * rate + (1 - kRateSmoothing) * record.tokens_per_s;
    record.rate_sample_at = now;
    record.rate_sample_tokens = tokens_total;
  }
  if (step_ms.empty()) return;
  for (double ms : step_ms) record.window.Add(ms);
  vitals.median_step_ms = record.window.Median();
  vitals.samples = record.window.size();
}

std::vector<LearnerRecord*> Membership::FindSilent(Micros now, Micros timeout) {
  CountVisits(vitals_.size());
  std::vector<LearnerRecord*> silent;
  for (const LearnerVitals& vitals : vitals_) {
    if (vitals.alive && now - vitals.last_heartbeat > timeout) silent.push_back(vitals.record);
  }
  std::sort(silent.begin(), silent.end(),
            [](const LearnerRecord* a, const LearnerRecord* b) { return a->id < b->id; });
  return silent;
}

void Membership::MarkGone(LearnerRecord& record, Micros now, bool left) {
  Mutate(record, [&](LearnerRecord& r) {
    r.alive = false;
    r.left = r.left || left;
    r.slow = false;
    r.gone_since = now;
  });
  vitals_[record.vitals_index].slow_zscore = 0;
}

std::vector<SlowFlagChange> Membership::EvaluateFailSlow() {
  CountVisits(vitals_.size());
  std::vector<size_t> judged;
  std::vector<double> medians;
  for (size_t i = 0; i < vitals_.size(); ++i) {
    const LearnerVitals& vitals = vitals_[i];
    if (vitals.alive && vitals.samples >= failslow_.min_samples) {
      judged.push_back(i);
      medians.push_back(vitals.median_step_ms);
    }
  }
  std::vector<SlowFlagChange> changes;
  bool enough = judged.size() >= failslow_.min_learners;
  std::vector<double> scores =
      enough ? RobustZScores(medians, failslow_.mad_floor_fraction) : std::vector<double>();
  double all_median = 0;
  if (enough) {
    std::vector<double> copy = medians;
    std::nth_element(copy.begin(), copy.begin() + static_cast<long>(copy.size() / 2), copy.end());
    all_median = copy[copy.size() / 2];
  }
  for (size_t i = 0; i < judged.size(); ++i) {
    LearnerVitals& vitals = vitals_[judged[i]];
    double z = enough ? scores[i] : 0.0;
    vitals.slow_zscore = z;
    bool slow = NextSlowFlag(vitals.slow, z, failslow_);
    if (slow != vitals.slow) {
      LearnerRecord& record = *vitals.record;
      Mutate(record, [&](LearnerRecord& r) { r.slow = slow; });
      changes.push_back({record.id, slow, z, vitals.median_step_ms, all_median});
    }
  }
  std::sort(changes.begin(), changes.end(),
            [](const auto& a, const auto& b) { return a.learner_id < b.learner_id; });
  return changes;
}

size_t Membership::ForgetGone(Micros now, Micros retention) {
  CountVisits(vitals_.size());
  size_t forgotten = 0;
  // Backwards, so that the entry Erase moves into slot i was already seen.
  for (size_t i = vitals_.size(); i-- > 0;) {
    if (vitals_[i].alive) continue;
    LearnerRecord& record = *vitals_[i].record;
    if (!record.join && now - record.gone_since > retention) {
      Uncount(record);
      Erase(record);
      ++forgotten;
    }
  }
  return forgotten;
}

void Membership::Erase(LearnerRecord& record) {
  size_t index = record.vitals_index;
  vitals_[index] = vitals_.back();
  vitals_[index].record->vitals_index = index;
  vitals_.pop_back();
  by_session_.erase(record.session_id);
  std::string id = record.id;
  records_.erase(id);  // destroys `record`
}

std::vector<std::pair<LearnerRecord*, PendingJoin>> Membership::TakePendingForRound(
    uint64_t round_id) {
  std::vector<std::pair<LearnerRecord*, PendingJoin>> taken;
  CountVisits(pending_.size());
  taken.reserve(pending_.size());
  // Every pending join is taken, and no alive or slow flag changes: the
  // counts change in bulk, without a Tally per record (at 10,000 members
  // that took most of a round's close).
  size_t alive_taken = 0;
  for (LearnerRecord* record : pending_) {
    if (record->eligible()) counts_.eligible_missing++;
    if (record->slow_but_reachable()) counts_.slow_missing++;
    if (record->alive && !record->unreachable) {
      Histogram(alive_by_round_, record->last_round_id, -1);
      alive_taken++;
    }
    // Until it reports otherwise (its next join), a member is taken to hold
    // this round's state: learners that are all behind it cannot form a
    // round of their own (the newest-state rule).
    record->last_round_id = round_id;
    std::copy_backward(record->earlier_member_rounds.begin(),
                       record->earlier_member_rounds.end() - 1,
                       record->earlier_member_rounds.end());
    record->earlier_member_rounds[0] = record->last_member_round;
    record->last_member_round = round_id;
    record->rounds_joined++;
    taken.emplace_back(record, std::move(*record->join));
    record->join.reset();
  }
  if (alive_taken > 0) alive_by_round_[round_id] += alive_taken;
  pending_.clear();
  pending_by_round_.clear();
  counts_.pending = 0;
  // Round ids only grow, so no other learner's last_member_round equals
  // round_id: the taken learners are the only previous members now, and
  // none of them has joined again yet.
  previous_round_id_ = round_id;
  counts_.previous_joined = 0;
  counts_.previous_missing = taken.size();
  return taken;
}

void Membership::Tally(LearnerRecord& r, int sign, bool update_pending) {
  auto add = [sign](size_t& counter, bool condition) {
    if (condition) counter = static_cast<size_t>(static_cast<long>(counter) + sign);
  };
  add(counts_.alive, r.alive);
  add(counts_.eligible, r.eligible());
  add(counts_.slow, r.alive && r.slow);
  add(counts_.pending, r.join.has_value());
  add(counts_.eligible_missing, r.eligible() && !r.join);
  add(counts_.slow_missing, r.slow_but_reachable() && !r.join);
  bool previous = InPreviousRound(r);
  add(counts_.previous_joined, previous && r.join.has_value());
  add(counts_.previous_missing, previous && !r.join);
  if (r.alive && !r.unreachable) Histogram(alive_by_round_, r.last_round_id, sign);
  if (r.alive && r.host != 0) {
    HostCount(alive_by_host_[r.host], sign);
    if (!r.loopback_host.empty()) HostCount(loopback_by_host_[r.host], sign);
  }
  if (r.join) Histogram(pending_by_round_, r.join->last_round_id, sign);
  if (sign > 0) {
    LearnerVitals& vitals = vitals_[r.vitals_index];
    vitals.alive = r.alive;
    vitals.slow = r.slow;
  }
  if (!update_pending) return;
  if (sign > 0 && r.join) pending_.insert(&r);
  if (sign < 0 && r.join) pending_.erase(&r);
}

uint32_t Membership::HostIndex(const std::string& host) {
  if (host.empty()) return 0;
  auto [it, added] = host_index_.try_emplace(host, static_cast<uint32_t>(hosts_.size()));
  if (added) {
    hosts_.push_back(host);
    alive_by_host_.push_back(0);
    loopback_by_host_.push_back(0);
  }
  return it->second;
}

bool Membership::AliveOnAnotherHost(const std::string& host, const std::string& except,
                                    bool loopback_only) const {
  const auto mine = host_index_.find(host);
  const uint32_t own = mine == host_index_.end() ? 0 : mine->second;
  const LearnerRecord* excepted = nullptr;
  if (auto it = records_.find(except); it != records_.end()) excepted = it->second.get();
  const std::vector<size_t>& counts = loopback_only ? loopback_by_host_ : alive_by_host_;
  for (uint32_t other = 1; other < counts.size(); ++other) {  // (hosts: a few)
    if (other == own) continue;
    const bool counts_excepted = excepted != nullptr && excepted->alive &&
                                 excepted->host == other &&
                                 (!loopback_only || !excepted->loopback_host.empty());
    if (counts[other] > (counts_excepted ? 1u : 0u)) return true;
  }
  return false;
}

void Membership::Histogram(RoundHistogram& histogram, uint64_t round_id, int sign) {
  if (sign > 0) {
    histogram[round_id]++;
    return;
  }
  auto it = histogram.find(round_id);
  if (--it->second == 0) histogram.erase(it);
}

}  // namespace mend::coordinator
