// Fuzz target: the datagram control channel on the lighthouse's side, its
// envelope and its bodies. The first byte picks what the rest is:
//  - even: a whole datagram. ParseHeader, Verify and every body decoder;
//    nothing may crash, a datagram that was not sealed with the key never
//    verifies, and a body that decodes encodes and decodes back the same.
//  - odd: the body of a heartbeat or a join, sealed with the job's key (what
//    a holder of the token could send). It is decoded and handed, as the
//    datagram server hands it, to the ControlHandler over a LighthouseCore on
//    a fake clock with one registered learner: nothing may crash, a refusal
//    is INVALID_ARGUMENT naming a field or one of the core's own answers, and
//    an accepted join gets exactly one decision once the clock passes its
//    timeout; that decision fits one datagram.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "coordinator/control_handler.h"
#include "coordinator/lighthouse_core.h"
#include "fuzz_check.h"
#include "mend/clock.h"
#include "mend/config.h"
#include "mend/lighthouse_client.h"
#include "mend/v1/lighthouse.pb.h"
#include "spdlog/spdlog.h"
#include "wire/datagram.h"
#include "wire/protocol_rules.h"

namespace mend::coordinator {
namespace {

using datagram::Kind;

datagram::Signer& TheSigner() {
  static datagram::Signer* signer =
      new datagram::Signer(datagram::DeriveKey("fuzz-job-token-0123"));
  return *signer;
}

template <typename Message>
void RoundTrips(const datagram::Header& header, std::string_view bytes) {
  auto body = datagram::DecodeMessage<Message>(bytes);
  if (!body.ok()) return;
  std::string again_bytes = datagram::EncodeMessage(header, *body, TheSigner());
  auto again = datagram::DecodeMessage<Message>(again_bytes);
  MEND_FUZZ_CHECK(again.ok());
  MEND_FUZZ_CHECK(again->SerializeAsString() == body->SerializeAsString());
}

void Envelope(std::string_view bytes) {
  auto header = datagram::ParseHeader(bytes);
  if (TheSigner().Verify(bytes)) {
    // Only a datagram sealed with the key verifies; the fuzzer cannot forge
    // one except by copying a MAC it computed itself, which it does not have.
    std::string resealed(bytes.substr(0, bytes.size() - datagram::kMacBytes));
    TheSigner().Seal(resealed);
    MEND_FUZZ_CHECK(resealed == bytes);
  }
  if (!header.ok()) return;
  RoundTrips<v1::HeartbeatRequest>(*header, bytes);
  RoundTrips<v1::DatagramJoin>(*header, bytes);
  RoundTrips<v1::HeartbeatResponse>(*header, bytes);
  RoundTrips<v1::DatagramDecision>(*header, bytes);
}

bool RefusalIsClear(const Status& status) {
  if (status.code() == StatusCode::kInvalidArgument) {
    return StatusMessage(status).find(':') != std::string_view::npos;  // "field: why"
  }
  return wire::NeedsRegistration(status.code());
}

void Body(bool join, std::string_view body) {
  static FakeClock* clock = new FakeClock(1'000'000);
  Config config;
  config.quorum_min_learners = 2;  // a lone learner's join waits until its timeout
  LighthouseCore core(LighthouseOptionsFromConfig(config), clock, 7);
  RegisterArgs who;
  who.learner_id = "fuzzed";
  auto registered = core.Register(who);
  MEND_FUZZ_CHECK(registered.ok());
  ControlHandler handler(&core);
  std::string bytes = datagram::Encode(
      {join ? Kind::kJoin : Kind::kHeartbeat, registered->session_id, 1}, body, TheSigner());
  MEND_FUZZ_CHECK(datagram::ParseHeader(bytes).ok() && TheSigner().Verify(bytes));
  if (!join) {
    auto request = datagram::DecodeMessage<v1::HeartbeatRequest>(bytes);
    if (!request.ok()) return;
    request->mutable_learner()->set_learner_id("fuzzed");
    request->mutable_learner()->set_session_id(registered->session_id);
    auto result = handler.Heartbeat(*request);
    if (!result.ok()) {
      MEND_FUZZ_CHECK(RefusalIsClear(result.status()));
      return;
    }
    ControlHandler::AckState state;
    MEND_FUZZ_CHECK(handler.AckDue(state, *result).has_value());  // the first is always due
    return;
  }
  auto message = datagram::DecodeMessage<v1::DatagramJoin>(bytes);
  if (!message.ok()) return;
  v1::QuorumRequest& request = *message->mutable_request();
  request.mutable_learner()->set_learner_id("fuzzed");
  request.mutable_learner()->set_session_id(registered->session_id);
  int decisions = 0;
  size_t decision_bytes = 0;
  auto waiting = handler.Quorum(request, [&](StatusOr<RoundAssignment> result) {
    ++decisions;
    decision_bytes =
        MakeDatagramDecision(message->join_id(), result, datagram::kMaxBodyBytes).ByteSizeLong();
  });
  if (!waiting.ok()) {
    MEND_FUZZ_CHECK(RefusalIsClear(waiting.status()) && decisions == 0);
    return;
  }
  clock->Advance(Micros{request.timeout_ms()} * kMicrosPerMilli + kMicrosPerSecond);
  core.Tick();
  MEND_FUZZ_CHECK(decisions == 1);
  MEND_FUZZ_CHECK(decision_bytes <= datagram::kMaxBodyBytes);
}

}  // namespace
}  // namespace mend::coordinator

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = [] {
    spdlog::set_level(spdlog::level::off);
    return true;
  }();
  (void)quiet;
  if (size == 0) return 0;
  std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    mend::coordinator::Envelope(rest);
  } else {
    mend::coordinator::Body(data[0] % 4 == 3,
                            rest.substr(0, mend::coordinator::datagram::kMaxBodyBytes));
  }
  return 0;
}
