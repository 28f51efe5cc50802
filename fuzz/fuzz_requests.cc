// Fuzz target: request validation. The first input byte picks a request type;
// the rest is parsed as that message's wire bytes (what gRPC hands the
// service) and, when it parses, run through its Parse*/Check* function.
// Beyond "no crash, no sanitizer report", it checks that an accepted request
// is within the bounds validation.h promises, and that the verdict does not
// change when the message goes through the wire format again.
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>

#include "coordinator/validation.h"
#include "core/text.h"
#include "fuzz_check.h"
#include "google/protobuf/stubs/logging.h"
#include "mend/v1/lighthouse.pb.h"

namespace mend::coordinator {
namespace {

constexpr size_t kFuzzMaxValueBytes = 4096;

// Parses `bytes` as a `Message`; false when gRPC would refuse them too.
template <typename Message>
bool ParseWire(const uint8_t* bytes, size_t size, Message* message) {
  return message->ParseFromArray(bytes, static_cast<int>(size));
}

// Serializes and parses `message` again: the verdict must not change.
template <typename Message, typename Check>
void CheckStableVerdict(const Message& message, bool accepted, const Check& check) {
  Message again;
  MEND_FUZZ_CHECK(again.ParseFromString(message.SerializeAsString()));
  MEND_FUZZ_CHECK(check(again) == accepted);
}

// Independent restatements of the rules in validation.h, as oracles.
bool IsIdentifier(const std::string& value, bool allow_empty) {
  if (value.empty()) return allow_empty;
  if (value.size() > kMaxIdLength) return false;
  for (char c : value) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              std::string_view("._:@+-").find(c) != std::string_view::npos;
    if (!ok) return false;
  }
  return true;
}

bool IsStoreKey(const std::string& key) {
  if (key.empty() || key.size() > 512) return false;
  for (char c : key) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

void FuzzRegister(const uint8_t* data, size_t size) {
  v1::RegisterRequest request;
  if (!ParseWire(data, size, &request)) return;
  auto check = [](const v1::RegisterRequest& r) { return ParseRegister(r).ok(); };
  auto args = ParseRegister(request);
  CheckStableVerdict(request, args.ok(), check);
  if (!args.ok()) return;
  MEND_FUZZ_CHECK(IsIdentifier(args->learner_id, false));
  MEND_FUZZ_CHECK(IsIdentifier(args->job_id, true));
  MEND_FUZZ_CHECK(IsIdentifier(args->rack, true));
  MEND_FUZZ_CHECK(args->address.size() <= kMaxAddressLength);
  if (!args->address.empty()) {
    // What a peer does with an accepted address.
    auto [host, port] = SplitHostPort(args->address);
    MEND_FUZZ_CHECK(port >= 0 && port <= 65535);
  }
  MEND_FUZZ_CHECK(args->step <= kMaxCounter && args->last_round_id <= kMaxCounter);
}

void FuzzHeartbeat(const uint8_t* data, size_t size) {
  v1::HeartbeatRequest request;
  if (!ParseWire(data, size, &request)) return;
  auto check = [](const v1::HeartbeatRequest& r) { return ParseHeartbeat(r).ok(); };
  auto args = ParseHeartbeat(request);
  CheckStableVerdict(request, args.ok(), check);
  if (!args.ok()) return;
  MEND_FUZZ_CHECK(IsIdentifier(args->learner_id, false));
  MEND_FUZZ_CHECK(args->session_id != 0);
  MEND_FUZZ_CHECK(args->step <= kMaxCounter && args->tokens_total <= kMaxCounter &&
                  args->tokens_since_last_round <= kMaxCounter);
  MEND_FUZZ_CHECK(args->step_ms.size() <= static_cast<size_t>(kMaxStepTimesPerHeartbeat));
  MEND_FUZZ_CHECK(args->step_ms.size() == static_cast<size_t>(request.step_time_us_size()));
  for (double ms : args->step_ms) MEND_FUZZ_CHECK(ms > 0 && ms <= kMaxStepTimeUs / 1000.0);
}

void FuzzQuorum(const uint8_t* data, size_t size) {
  v1::QuorumRequest request;
  if (!ParseWire(data, size, &request)) return;
  auto check = [](const v1::QuorumRequest& r) { return ParseQuorum(r).ok(); };
  auto args = ParseQuorum(request);
  CheckStableVerdict(request, args.ok(), check);
  if (!args.ok()) return;
  MEND_FUZZ_CHECK(IsIdentifier(args->learner_id, false));
  MEND_FUZZ_CHECK(args->session_id != 0);
  MEND_FUZZ_CHECK(args->last_round_id <= kMaxCounter && args->step <= kMaxCounter &&
                  args->tokens_since_last_round <= kMaxCounter);
  MEND_FUZZ_CHECK(args->timeout >= kMicrosPerMilli &&
                  args->timeout <= Micros{kMaxTimeoutMs} * kMicrosPerMilli);
}

void FuzzLeave(const uint8_t* data, size_t size) {
  v1::LeaveRequest request;
  if (!ParseWire(data, size, &request)) return;
  auto check = [](const v1::LeaveRequest& r) { return CheckLeave(r).ok(); };
  bool accepted = check(request);
  CheckStableVerdict(request, accepted, check);
  if (!accepted) return;
  MEND_FUZZ_CHECK(IsIdentifier(request.learner().learner_id(), false));
  MEND_FUZZ_CHECK(request.learner().session_id() != 0);
  MEND_FUZZ_CHECK(request.reason().size() <= kMaxReasonLength);
}

void FuzzStoreSet(const uint8_t* data, size_t size) {
  v1::StoreSetRequest request;
  if (!ParseWire(data, size, &request)) return;
  auto check = [](const v1::StoreSetRequest& r) {
    return CheckStoreSet(r, kFuzzMaxValueBytes).ok();
  };
  bool accepted = check(request);
  CheckStableVerdict(request, accepted, check);
  MEND_FUZZ_CHECK(accepted ==
                  (IsStoreKey(request.key()) && request.value().size() <= kFuzzMaxValueBytes));
}

void FuzzStoreGet(const uint8_t* data, size_t size) {
  v1::StoreGetRequest request;
  if (!ParseWire(data, size, &request)) return;
  auto check = [](const v1::StoreGetRequest& r) { return CheckStoreGet(r).ok(); };
  bool accepted = check(request);
  CheckStableVerdict(request, accepted, check);
  MEND_FUZZ_CHECK(accepted == (IsStoreKey(request.key()) && request.timeout_ms() <= kMaxTimeoutMs));
}

void FuzzStoreAdd(const uint8_t* data, size_t size) {
  v1::StoreAddRequest request;
  if (!ParseWire(data, size, &request)) return;
  auto check = [](const v1::StoreAddRequest& r) { return CheckStoreAdd(r).ok(); };
  bool accepted = check(request);
  CheckStableVerdict(request, accepted, check);
  MEND_FUZZ_CHECK(accepted == IsStoreKey(request.key()));
}

void FuzzStoreWait(const uint8_t* data, size_t size) {
  v1::StoreWaitRequest request;
  if (!ParseWire(data, size, &request)) return;
  auto check = [](const v1::StoreWaitRequest& r) { return CheckStoreWait(r).ok(); };
  bool accepted = check(request);
  CheckStableVerdict(request, accepted, check);
  bool keys_ok = request.keys_size() >= 1 && request.keys_size() <= kMaxStoreWaitKeys;
  for (const std::string& key : request.keys()) keys_ok = keys_ok && IsStoreKey(key);
  MEND_FUZZ_CHECK(accepted ==
                  (keys_ok && request.timeout_ms() >= 1 && request.timeout_ms() <= kMaxTimeoutMs));
}

void FuzzStoreDelete(const uint8_t* data, size_t size) {
  v1::StoreDeleteRequest request;
  if (!ParseWire(data, size, &request)) return;
  auto check = [](const v1::StoreDeleteRequest& r) { return CheckStoreDelete(r).ok(); };
  bool accepted = check(request);
  CheckStableVerdict(request, accepted, check);
  MEND_FUZZ_CHECK(accepted == IsStoreKey(request.key()));
}

void FuzzGetStatus(const uint8_t* data, size_t size) {
  v1::GetStatusRequest request;
  if (!ParseWire(data, size, &request)) return;
  auto check = [](const v1::GetStatusRequest& r) { return CheckGetStatus(r).ok(); };
  bool accepted = check(request);
  CheckStableVerdict(request, accepted, check);
  MEND_FUZZ_CHECK(accepted == (request.max_learners() <= kMaxStatusItems &&
                               request.max_rounds() <= kMaxStatusItems));
}

}  // namespace
}  // namespace mend::coordinator

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // Protobuf logs every string field that is not UTF-8; the fuzzer makes many.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mend::coordinator;
  using Target = void (*)(const uint8_t*, size_t);
  static constexpr Target kTargets[] = {FuzzRegister,    FuzzHeartbeat, FuzzQuorum,   FuzzLeave,
                                        FuzzStoreSet,    FuzzStoreGet,  FuzzStoreAdd, FuzzStoreWait,
                                        FuzzStoreDelete, FuzzGetStatus};
  if (size == 0) return 0;
  kTargets[data[0] % std::size(kTargets)](data + 1, size - 1);
  return 0;
}
