// A closed quorum round as the lighthouse decided it, shared (immutable) by
// the replies to all of its members and by the status history.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "mend/clock.h"
#include "mend/status.h"

namespace mend::coordinator {

struct MemberInfo {
  std::string id;
  uint64_t step = 0;
  uint64_t tokens_since_last_round = 0;
  uint64_t last_round_id = 0;
  std::string heal_from;  // empty unless this member is behind
  std::string rack;
  std::string address;
};

struct Round {
  uint64_t id = 0;
  std::vector<MemberInfo> members;  // sorted by id; rank = index
  // Sum of the members' tokens_since_last_round, saturated at UINT64_MAX.
  uint64_t total_tokens = 0;
  std::string rendezvous_prefix;
  std::string closed_by;  // fast_path | all_joined | grace | min_quorum
  Micros first_join_at = 0;
  Micros quorum_reached_at = 0;
  Micros closed_at = 0;
  Micros grace_window = 0;  // the (possibly adaptive) window in force
  uint64_t heal_round_id = 0;
  uint64_t step = 0;  // the boundary step: the members' largest step
  // Up-to-date member id -> the behind members that heal from it.
  std::unordered_map<std::string, std::vector<std::string>> heal_to;

  Micros waited() const { return closed_at - quorum_reached_at; }
};

// The member with `id`, or nullptr (members are sorted, so O(log n)).
inline const MemberInfo* FindMember(const Round& round, std::string_view id) {
  auto it = std::lower_bound(round.members.begin(), round.members.end(), id,
                             [](const MemberInfo& m, std::string_view key) { return m.id < key; });
  return it != round.members.end() && it->id == id ? &*it : nullptr;
}

// What one member is told.
struct RoundAssignment {
  std::shared_ptr<const Round> round;
  uint32_t rank = 0;
};

// Completes a Quorum call exactly once: with the member's assignment, or with
// DEADLINE_EXCEEDED / ABORTED / CANCELLED. Called without the lighthouse mutex.
using QuorumCallback = std::function<void(StatusOr<RoundAssignment>)>;

// The store prefix under which round `round_id` of `job_id` rendezvouses:
// "<job>/round/<incarnation>/<id>/". The incarnation (the lighthouse's
// instance, in hex) keeps a round of a restarted lighthouse apart from the
// old one's round of the same id: a learner that was still at the old round
// (a group's rank that learned of it late) cannot meet the new one's keys.
// Without one (a QuorumMachine of its own in tests): "<job>/round/<id>/".
inline std::string RendezvousPrefix(const std::string& job_id, const std::string& incarnation,
                                    uint64_t round_id) {
  if (incarnation.empty()) return job_id + "/round/" + std::to_string(round_id) + "/";
  return job_id + "/round/" + incarnation + "/" + std::to_string(round_id) + "/";
}

}  // namespace mend::coordinator
