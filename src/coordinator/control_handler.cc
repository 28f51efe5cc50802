#include "coordinator/control_handler.h"

#include "coordinator/validation.h"
#include "core/status_format.h"
#include "wire/member_proto.h"

namespace mend::coordinator {

StatusOr<HeartbeatResult> ControlHandler::Heartbeat(const v1::HeartbeatRequest& request) {
  MEND_ASSIGN_OR_RETURN(HeartbeatArgs args, ParseHeartbeat(request));
  return core_->Heartbeat(args);
}

StatusOr<HeartbeatResult> ControlHandler::HeartbeatOf(std::string learner_id, uint64_t session_id,
                                                      const v1::HeartbeatRequest& request) {
  MEND_ASSIGN_OR_RETURN(HeartbeatArgs args,
                        ParseHeartbeatOf(std::move(learner_id), session_id, request));
  return core_->Heartbeat(args);
}

std::optional<v1::HeartbeatResponse> ControlHandler::AckDue(AckState& state,
                                                            const HeartbeatResult& result) const {
  const Micros now = core_->clock()->NowMicros();
  const v1::HeartbeatResponse& last = state.last;
  bool changed = !state.sent || result.slow != last.slow() ||
                 (result.waiting && result.latest_round_id != last.latest_round_id()) ||
                 result.short_of_quorum != last.short_of_quorum();
  if (!changed && now - state.sent_at < core_->options().ack_interval) return std::nullopt;
  state.sent = true;
  state.sent_at = now;
  state.last.set_slow(result.slow);
  state.last.set_slow_zscore(result.slow_zscore);
  state.last.set_latest_round_id(result.latest_round_id);
  state.last.set_latest_round_step(result.latest_round_step);
  state.last.set_short_of_quorum(result.short_of_quorum);
  state.last.set_lighthouse_instance(core_->instance_id());
  return state.last;
}

StatusOr<uint64_t> ControlHandler::Quorum(const v1::QuorumRequest& request, QuorumCallback done) {
  MEND_ASSIGN_OR_RETURN(QuorumArgs args, ParseQuorum(request));
  return core_->Quorum(args, std::move(done));
}

void FillQuorumResponse(const RoundAssignment& assignment, bool include_members,
                        v1::QuorumResponse* response) {
  const Round& round = *assignment.round;
  const MemberInfo& me = round.members[assignment.rank];
  response->set_round_id(round.id);
  response->set_rank(assignment.rank);
  response->set_world_size(static_cast<uint32_t>(round.members.size()));
  response->set_total_tokens(round.total_tokens);
  response->set_rendezvous_prefix(round.rendezvous_prefix);
  response->set_closed_by(round.closed_by);
  response->set_waited_ms(static_cast<uint32_t>(round.waited() / kMicrosPerMilli));
  response->set_heal_round_id(round.heal_round_id);
  response->set_step(round.step);
  response->set_grace_window_ms(static_cast<uint32_t>(round.grace_window / kMicrosPerMilli));
  if (const MemberInfo* source = FindMember(round, me.heal_from)) {
    FillMemberProto(*source, response->mutable_heal_from());
  }
  if (auto it = round.heal_to.find(me.id); it != round.heal_to.end()) {
    for (const std::string& id : it->second) response->add_heal_to(id);
  }
  if (include_members && round.members.size() <= kMaxMembersInReply) {
    for (const MemberInfo& member : round.members) FillMemberProto(member, response->add_members());
  }
}

void FillDatagramDecision(uint64_t join_id, const StatusOr<RoundAssignment>& result,
                          size_t max_bytes, v1::DatagramDecision* decision) {
  decision->Clear();
  decision->set_join_id(join_id);
  if (!result.ok()) {
    decision->set_code(static_cast<uint32_t>(result.status().code()));
    decision->set_message(std::string(StatusMessage(result.status())).substr(0, max_bytes / 2));
    return;
  }
  FillQuorumResponse(*result, /*include_members=*/false, decision->mutable_round());
  auto* heal_to = decision->mutable_round()->mutable_heal_to();
  if (heal_to->empty()) return;  // (nothing to cut: most decisions)
  // The behind members this one serves are a hint (they fetch from it
  // anyway): cut from the end until the decision fits.
  size_t bytes = decision->ByteSizeLong();
  while (bytes > max_bytes && !heal_to->empty()) {
    // At least its bytes, a tag and a length: the estimate stays above the size.
    bytes -= std::min(bytes, heal_to->at(heal_to->size() - 1).size() + 2);
    heal_to->RemoveLast();
  }
}

}  // namespace mend::coordinator
