#include "learner/control_proto.h"

#include <algorithm>

namespace mend {

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

v1::DatagramDecision DecisionToProto(const StatusOr<QuorumResult>& result) {
  v1::DatagramDecision decision;
  if (!result.ok()) {
    decision.set_code(static_cast<uint32_t>(result.status().code()));
    decision.set_message(std::string(result.status().message()));
    return decision;
  }
  *decision.mutable_round() = *result;
  return decision;
}

StatusOr<QuorumResult> DecisionFromProto(const v1::DatagramDecision& decision,
                                         std::string_view where) {
  if (decision.code() == 0) return decision.round();
  constexpr uint32_t kLastCode = static_cast<uint32_t>(StatusCode::kUnauthenticated);
  StatusCode code = decision.code() <= kLastCode ? static_cast<StatusCode>(decision.code())
                                                 : StatusCode::kUnknown;
  return Status(
      code, where.empty() ? decision.message() : std::string(where) + ": " + decision.message());
}

}  // namespace mend
