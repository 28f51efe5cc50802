// A round's member as the protocol's v1::Member, from the lighthouse's
// MemberInfo (coordinator/round.h); the learner reads the message itself
// (RoundMember, mend/lighthouse_client.h).
//
// Thread-safety: a pure function.
#pragma once

#include "mend/v1/lighthouse.pb.h"

namespace mend {

template <typename Member>
void FillMemberProto(const Member& member, v1::Member* out) {
  out->set_learner_id(member.id);
  out->set_step(member.step);
  out->set_tokens_since_last_round(member.tokens_since_last_round);
  out->set_last_round_id(member.last_round_id);
  out->set_heal_from(member.heal_from);
  out->set_rack(member.rack);
  out->set_address(member.address);
}

}  // namespace mend
