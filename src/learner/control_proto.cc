#include "learner/control_proto.h"

#include <algorithm>

#include "wire/member_proto.h"

namespace mend {
namespace {

RoundMember MemberFromProto(const v1::Member& member) {
  return RoundMember{member.learner_id(),    member.step(),      member.tokens_since_last_round(),
                     member.last_round_id(), member.heal_from(), member.rack(),
                     member.address()};
}

}  // namespace

void FillHeartbeatRequest(const LearnerRef& learner, const HeartbeatUpdate& update,
                          v1::HeartbeatRequest* request) {
  request->Clear();
  FillLearnerRef(learner, request);
  request->set_step(update.step);
  request->set_tokens_total(update.tokens_total);
  request->set_tokens_since_last_round(update.tokens_since_last_round);
  for (uint32_t us : update.step_time_us) request->add_step_time_us(us);
}

v1::QuorumRequest QuorumRequestProto(const QuorumRequestArgs& args) {
  v1::QuorumRequest request;
  FillLearnerRef(args.learner, &request);
  request.set_last_round_id(args.last_round_id);
  request.set_step(args.step);
  request.set_tokens_since_last_round(args.tokens_since_last_round);
  request.set_include_members(args.include_members);
  request.set_give_up_short_of_quorum(args.give_up_short_of_quorum);
  request.set_timeout_ms(static_cast<uint32_t>(
      std::clamp<Micros>(args.timeout, kMicrosPerMilli, kMaxJoinTimeout) / kMicrosPerMilli));
  return request;
}

QuorumResult QuorumResultFromProto(const v1::QuorumResponse& response) {
  QuorumResult result;
  result.round_id = response.round_id();
  result.rank = response.rank();
  result.world_size = response.world_size();
  result.total_tokens = response.total_tokens();
  result.rendezvous_prefix = response.rendezvous_prefix();
  result.closed_by = response.closed_by();
  result.waited_ms = response.waited_ms();
  result.heal_round_id = response.heal_round_id();
  result.step = response.step();
  result.grace_window_ms = response.grace_window_ms();
  if (response.has_heal_from()) result.heal_from = MemberFromProto(response.heal_from());
  result.heal_to.assign(response.heal_to().begin(), response.heal_to().end());
  for (const auto& member : response.members()) result.members.push_back(MemberFromProto(member));
  return result;
}

v1::QuorumResponse QuorumResultToProto(const QuorumResult& result) {
  v1::QuorumResponse response;
  response.set_round_id(result.round_id);
  response.set_rank(result.rank);
  response.set_world_size(result.world_size);
  response.set_total_tokens(result.total_tokens);
  response.set_rendezvous_prefix(result.rendezvous_prefix);
  response.set_closed_by(result.closed_by);
  response.set_waited_ms(result.waited_ms);
  response.set_heal_round_id(result.heal_round_id);
  response.set_step(result.step);
  response.set_grace_window_ms(result.grace_window_ms);
  if (result.heal_from) FillMemberProto(*result.heal_from, response.mutable_heal_from());
  for (const std::string& id : result.heal_to) response.add_heal_to(id);
  for (const RoundMember& member : result.members) FillMemberProto(member, response.add_members());
  return response;
}

v1::DatagramDecision DecisionToProto(const StatusOr<QuorumResult>& result) {
  v1::DatagramDecision decision;
  if (!result.ok()) {
    decision.set_code(static_cast<uint32_t>(result.status().code()));
    decision.set_message(std::string(result.status().message()));
    return decision;
  }
  *decision.mutable_round() = QuorumResultToProto(*result);
  return decision;
}

StatusOr<QuorumResult> DecisionFromProto(const v1::DatagramDecision& decision,
                                         std::string_view where) {
  if (decision.code() == 0) return QuorumResultFromProto(decision.round());
  constexpr uint32_t kLastCode = static_cast<uint32_t>(StatusCode::kUnauthenticated);
  StatusCode code = decision.code() <= kLastCode ? static_cast<StatusCode>(decision.code())
                                                 : StatusCode::kUnknown;
  return Status(
      code, where.empty() ? decision.message() : std::string(where) + ": " + decision.message());
}

HeartbeatAck HeartbeatAckFromProto(const v1::HeartbeatResponse& response) {
  HeartbeatAck ack;
  ack.slow = response.slow();
  ack.slow_zscore = response.slow_zscore();
  ack.latest_round_id = response.latest_round_id();
  ack.lighthouse_instance = response.lighthouse_instance();
  ack.latest_round_step = response.latest_round_step();
  ack.short_of_quorum = response.short_of_quorum();
  return ack;
}

}  // namespace mend
