// LighthouseCore::Snapshot: the status page's and /status.json's view.
#include <algorithm>

#include "coordinator/lighthouse_core.h"

namespace mend::coordinator {
namespace {

double Ms(Micros micros) { return static_cast<double>(micros) / kMicrosPerMilli; }

RoundView ViewOf(const Round& round, Micros now) {
  RoundView view;
  view.id = round.id;
  view.member_count = round.members.size();
  for (size_t m = 0; m < round.members.size() && m < StatusSnapshot::kMaxListedMembers; ++m) {
    view.members.push_back(round.members[m].id);
  }
  view.closed_by = round.closed_by;
  view.waited_ms = Ms(round.waited());
  view.span_ms = Ms(round.closed_at - round.first_join_at);
  view.grace_window_ms = Ms(round.grace_window);
  view.age_ms = Ms(now - round.closed_at);
  view.total_tokens = round.total_tokens;
  for (const auto& [source, healees] : round.heal_to) view.healing += healees.size();
  view.heal_round_id = round.heal_round_id;
  return view;
}

}  // namespace

StatusSnapshot LighthouseCore::Snapshot(size_t max_learners, size_t max_rounds) {
  MutexLock lock(mu_);
  Micros now = clock_->NowMicros();
  StatusSnapshot snap;
  snap.job_id = options_.job_id;
  snap.instance_id = instance_id_;
  snap.uptime_s = static_cast<double>(now - started_at_) / kMicrosPerSecond;
  snap.min_learners = options_.quorum.min_learners;
  snap.grace_window_max_ms = Ms(options_.quorum.grace_window);
  snap.grace_window_ms = Ms(quorum_.grace_window());
  snap.heartbeat_timeout_ms = Ms(options_.heartbeat_timeout);
  snap.failslow_zscore_threshold = options_.failslow.zscore_threshold;
  snap.failslow_window_steps = options_.failslow.window_steps;
  const MembershipCounts& counts = membership_.counts();
  snap.learners_known = membership_.size();
  snap.learners_alive = counts.alive;
  snap.learners_slow = counts.slow;
  snap.learners_waiting = counts.pending;
  snap.latest_round_id = quorum_.latest_round_id();
  if (auto reached = quorum_.quorum_reached_at()) snap.quorum_reached_ms_ago = Ms(now - *reached);
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
                                        Ms(now - v.last_heartbeat), r.slow, v.slow_zscore,
                                        v.median_step_ms, r.last_round_id, r.rounds_joined});
  }
  const auto& history = quorum_.history();
  size_t first = history.size() > max_rounds ? history.size() - max_rounds : 0;
  for (size_t i = first; i < history.size(); ++i) {
    snap.rounds.push_back(ViewOf(*history[i], now));
  }
  for (const Event& event : events_.events()) {
    snap.events.push_back(
        EventView{event.seq, Ms(now - event.at), event.kind, event.learner_id, event.message});
  }
  snap.counters = counters_;
  snap.counters.store_ops = store.ops;
  return snap;
}

}  // namespace mend::coordinator
