// Fuzz target: the datagram channel's wire format (wire/datagram.h).
// Arbitrary bytes go through ParseHeader, Verify and every Decode*; nothing
// may crash, a datagram that was not sealed with the key must never verify,
// and whatever decodes must encode and decode back to the same fields.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "wire/datagram.h"

namespace mend::coordinator::datagram {
namespace {

Signer& TheSigner() {
  static Signer* signer = new Signer(DeriveKey("fuzz-job-token-0123"));
  return *signer;
}

void RoundTripHeartbeat(const Header& header, const Heartbeat& body) {
  auto again = DecodeHeartbeat(Encode(header, body, TheSigner()));
  MEND_FUZZ_CHECK(again.ok());
  MEND_FUZZ_CHECK(again->step == body.step && again->tokens_total == body.tokens_total &&
                  again->tokens_since_last_round == body.tokens_since_last_round &&
                  again->step_time_us == body.step_time_us);
}

void RoundTripDecision(const Header& header, const Decision& body) {
  auto again = DecodeDecision(Encode(header, body, TheSigner()));
  MEND_FUZZ_CHECK(again.ok());
  MEND_FUZZ_CHECK(again->join_id == body.join_id && again->code == body.code &&
                  again->message == body.message && again->round_id == body.round_id &&
                  again->rank == body.rank && again->world_size == body.world_size &&
                  again->closed_by == body.closed_by &&
                  again->rendezvous_prefix == body.rendezvous_prefix &&
                  again->heal_from_id == body.heal_from_id && again->heal_to == body.heal_to);
}

}  // namespace
}  // namespace mend::coordinator::datagram

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mend::coordinator::datagram;
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto header = ParseHeader(bytes);
  bool verified = TheSigner().Verify(bytes);
  if (verified) {
    // Only a datagram sealed with the key verifies; the fuzzer cannot forge one
    // except by copying a MAC it computed itself, which it does not have.
    std::string resealed(bytes.substr(0, bytes.size() - kMacBytes));
    TheSigner().Seal(resealed);
    MEND_FUZZ_CHECK(resealed == bytes);
  }
  if (!header.ok()) return 0;
  if (auto body = DecodeHeartbeat(bytes); body.ok()) RoundTripHeartbeat(*header, *body);
  if (auto body = DecodeDecision(bytes); body.ok()) RoundTripDecision(*header, *body);
  if (auto body = DecodeJoin(bytes); body.ok()) {
    auto again = DecodeJoin(Encode(*header, *body, TheSigner()));
    MEND_FUZZ_CHECK(again.ok() && again->join_id == body->join_id &&
                    again->timeout_ms == body->timeout_ms);
  }
  if (auto body = DecodeAck(bytes); body.ok()) {
    auto again = DecodeAck(Encode(*header, *body, TheSigner()));
    MEND_FUZZ_CHECK(again.ok() && again->slow == body->slow &&
                    again->latest_round_id == body->latest_round_id);
  }
  return 0;
}
