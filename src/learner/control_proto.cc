#include "learner/control_proto.h"

namespace mend {

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
