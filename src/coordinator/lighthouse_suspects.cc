// LighthouseCore's suspects: members that others report they could not
// reach in a round. The one named by the most distinct others is left out
// of rounds for a while (1, 2, 4, ... rounds), then let back in.
#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_split.h"
#include "coordinator/lighthouse_core.h"
#include "core/round_keys.h"
#include "core/status_format.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "spdlog/spdlog.h"

namespace mend::coordinator {
namespace {

// Reports that a member could not connect to another count for this many
// rounds; a learner left out for it stays out for 1, 2, 4, ... rounds.
constexpr uint64_t kSuspectRounds = 16;
constexpr uint32_t kMaxLeftOutRounds = 64;

}  // namespace

void LighthouseCore::NoteUnreachableLocked(const LearnerRecord& record, Micros now,
                                           Completions* completions) {
  // Its reports of each recent round it was a member of, not only the last:
  // a member whose round was called off by another's report writes its own
  // when its connect, which runs on, fails, and that may be after its next
  // join.
  bool reported = false;
  for (const uint64_t round_id : MemberRoundsLocked(record)) {
    const std::string key = quorum_.RoundPrefix(round_id) + kRoundUnreachablePrefix + record.id;
    std::optional<std::string> report = store_.Get(key);
    if (!report) continue;
    store_.Delete(key, /*prefix=*/false);  // read once
    if (record.unreachable) continue;      // (it was the one out of reach)
    reported = true;
    for (absl::string_view line : absl::StrSplit(*report, '\n', absl::SkipEmpty())) {
      const absl::string_view peer = line.substr(0, line.find('\t'));
      if (peer == record.id || membership_.FindAny(std::string(peer)) == nullptr) continue;
      Suspect& suspect = suspects_[std::string(peer)];
      // (Not a round it was already left out for, nor one of an earlier process.)
      if (round_id <= suspect.ignore_through_round) continue;
      suspect.reports.push_back(
          {round_id, record.id, line.substr(peer.size()) == kRoundUnauthenticatedTag});
    }
  }
  if (!reported) return;
  const uint64_t latest = quorum_.latest_round_id();
  // Who is named by the most distinct others, in the recent rounds.
  std::string worst;
  std::vector<std::string> worst_reporters;
  bool tie = false;
  for (auto it = suspects_.begin(); it != suspects_.end();) {
    Suspect& suspect = it->second;
    std::erase_if(suspect.reports,
                  [&](const SuspectReport& r) { return r.round_id + kSuspectRounds <= latest; });
    if (suspect.reports.empty() && suspect.until_round == 0 && suspect.times_left_out == 0) {
      it = suspects_.erase(it);
      continue;
    }
    if (suspect.until_round != 0) {  // left out already
      ++it;
      continue;
    }
    std::set<std::string> reporters;
    for (const SuspectReport& report : suspect.reports) reporters.insert(report.reporter);
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
  // A piece that failed authentication says more than a connect that timed
  // out (which a round called off for it may also cause): told if any did.
  const bool unauthenticated =
      std::any_of(suspect.reports.begin(), suspect.reports.end(),
                  [](const SuspectReport& report) { return report.unauthenticated; });
  suspect.reports.clear();
  // What it said of others is discounted: it was the one out of reach.
  for (auto& [id, other] : suspects_) {
    std::erase_if(other.reports, [&](const SuspectReport& r) { return r.reporter == record.id; });
  }
  const std::string what =
      unauthenticated
          ? std::string(
                "could not authenticate the data-plane pieces it sent (sealed under another key: "
                "does it hold the job's token? Or are its pieces altered on the way?)")
          : fmt::format(
                "could not connect to its data plane (dataplane_host {}). Is a firewall in the "
                "way, or is dataplane_host an address the others cannot reach?",
                !record.rank_addresses.empty()
                    ? fmt::format("{}", fmt::join(record.rank_addresses, ", "))
                : !record.address.empty() ? record.address
                                          : std::string("not known"));
  suspect.why = fmt::format(
      "learner '{}' is left out of the next {} round(s) (until round {} closes): learners {} {} "
      "It trains on alone meanwhile, and is tried again after that",
      record.id, rounds, suspect.until_round, fmt::join(reporters, ", "), what);
  spdlog::warn("{}", suspect.why);
  events_.Add(now, "unreachable", record.id,
              fmt::format("{} could not {} it; left out of {} round(s)", fmt::join(reporters, ", "),
                          unauthenticated ? "authenticate the pieces of" : "connect to", rounds));
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

}  // namespace mend::coordinator
