// Fuzz target: LighthouseCore on a FakeClock, driven the way the gRPC service
// drives it. The input picks the core's settings (through Config and
// CheckConfig, as the server does) and then a sequence of operations:
// Register, Heartbeat, Quorum, CancelQuorum, Leave, the store calls, clock
// advances with Tick, and status snapshots. Each request is built as its
// protobuf message and goes through its Parse*/Check* function first; a
// refused one is recorded with RecordRejection, as the service does.
//
// Invariants checked (besides "no crash, no sanitizer report"):
//  - every Quorum and store-wait callback runs exactly once, never under the
//    core's mutex, and none is outstanding after a Tick past every deadline;
//  - a round's assignment is consistent: ranks, sorted members, growing round
//    ids above every member's last round, heal sources, the token total
//    (saturated, never wrapped);
//  - after Tick(), NextDeadline() is in the future;
//  - when a call moves NextDeadline() earlier, it calls the wakeup;
//  - the status snapshot's counts match its learner list and the callbacks
//    still outstanding;
//  - the store gives back what was set, added or deleted.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/lighthouse_core.h"
#include "coordinator/service.h"
#include "coordinator/status_snapshot.h"
#include "coordinator/validation.h"
#include "core/status_format.h"
#include "fuzz_check.h"
#include "mend/clock.h"
#include "mend/config.h"
#include "mend/v1/lighthouse.pb.h"
#include "spdlog/spdlog.h"

namespace mend::coordinator {
namespace {

constexpr const char* kJobId = "job";
constexpr const char* kLearners[] = {"a", "b", "c", "d", "e"};
constexpr const char* kRacks[] = {"", "r1", "r2"};
// Includes keys under the rendezvous prefixes the core deletes as rounds pass.
constexpr const char* kKeys[] = {"k", "k1", "k2", "n", "job/round/1/x", "job/round/2/y"};
constexpr const char* kPeer = "ipv4:127.0.0.1:50000";
constexpr size_t kMaxOperations = 256;
constexpr size_t kStatusListLimit = 1000;

struct QuorumWaiter {
  std::string learner_id;
  uint64_t last_round_id = 0;
  bool include_members = false;
  uint64_t waiter_id = 0;
  int calls = 0;
};

struct StoreWaiter {
  size_t keys = 0;
  int calls = 0;
};

// Strings as proto3 may carry them: 7-bit ASCII is always valid UTF-8.
std::string AsciiString(FuzzedDataProvider& in, size_t max_length) {
  std::string text = in.ConsumeRandomLengthString(max_length);
  for (char& c : text) c = static_cast<char>(c & 0x7f);
  return text;
}

template <size_t N>
const char* PickFrom(FuzzedDataProvider& in, const char* const (&choices)[N]) {
  return choices[in.ConsumeIntegralInRange<size_t>(0, N - 1)];
}

// Settings for the core, from a Config that passes CheckConfig.
LighthouseOptions ConsumeOptions(FuzzedDataProvider& in) {
  Config config;
  config.job_id = kJobId;
  config.quorum_min_learners = in.ConsumeIntegralInRange<int64_t>(1, 4);
  config.grace_window_ms = in.ConsumeIntegralInRange<int64_t>(0, 2000);
  config.grace_window_min_ms = in.ConsumeIntegralInRange<int64_t>(0, config.grace_window_ms);
  config.grace_window_adaptive = in.ConsumeBool();
  config.rack_aware = in.ConsumeBool();
  config.heartbeat_ms = in.ConsumeIntegralInRange<int64_t>(10, 500);
  config.heartbeat_timeout_ms =
      2 * config.heartbeat_ms + in.ConsumeIntegralInRange<int64_t>(0, 2000);
  config.failslow_window_steps = in.ConsumeIntegralInRange<int64_t>(3, 8);
  MEND_FUZZ_CHECK(CheckConfig(config).ok());
  LighthouseOptions options = LighthouseOptionsFromConfig(config);
  // Small limits, so that the fuzzer reaches them.
  options.store =
      KvStoreLimits{.max_key_bytes = 512, .max_value_bytes = 1024, .max_total_bytes = 4096};
  options.keep_round_prefixes = in.ConsumeIntegralInRange<uint64_t>(1, 4);
  options.gone_retention = in.ConsumeIntegralInRange<Micros>(0, 5000) * kMicrosPerMilli;
  options.event_capacity = 32;
  options.quorum.history_size = 8;
  return options;
}

class Driver {
 public:
  Driver(FuzzedDataProvider& in, LighthouseOptions options)
      : in_(in), core_(std::move(options), &clock_, /*instance_id=*/7) {
    core_.SetWakeup([this]() { wakeups_++; });
  }

  void Run() {
    for (size_t i = 0; i < kMaxOperations && in_.remaining_bytes() > 0; ++i) Step();
    // Past every deadline a request may carry, and past every heartbeat timeout.
    clock_.Advance(Micros{kMaxTimeoutMs} * kMicrosPerMilli + kMicrosPerSecond);
    TickAndCheck();
    for (const auto& waiter : quorum_waiters_) MEND_FUZZ_CHECK(waiter->calls == 1);
    for (const auto& waiter : store_waiters_) MEND_FUZZ_CHECK(waiter->calls == 1);
    CheckSnapshot();
  }

 private:
  void Step() {
    Micros deadline_before = core_.NextDeadline();
    uint64_t wakeups_before = wakeups_;
    const bool ticked = Operate(in_.ConsumeIntegralInRange<int>(0, 13));
    // The owner re-reads NextDeadline after its own Tick; every other call
    // that moves it earlier must say so.
    if (!ticked && core_.NextDeadline() < deadline_before) {
      MEND_FUZZ_CHECK(wakeups_ > wakeups_before);
    }
    CheckSnapshot();
  }

  // One operation on the core; true when it ticked.
  bool Operate(int operation) {
    bool ticked = false;
    switch (operation) {
      case 0:
        Register();
        break;
      case 1:
        Heartbeat();
        break;
      case 2:
        Quorum();
        break;
      case 3:
        core_.CancelQuorum(LearnerId(), WaiterId());
        break;
      case 4:
        Leave();
        break;
      case 5:
        StoreSet();
        break;
      case 6:
        StoreGet();
        break;
      case 7:
        StoreAdd();
        break;
      case 8:
        StoreWait();
        break;
      case 9:
        StoreCancel();
        break;
      case 10:
        StoreDelete();
        break;
      case 11:
        clock_.Advance(in_.ConsumeIntegralInRange<Micros>(0, 3000) * kMicrosPerMilli);
        TickAndCheck();
        ticked = true;
        break;
      case 12: {
        Micros next = core_.NextDeadline();
        Micros now = clock_.NowMicros();
        if (next != INT64_MAX && next > now) clock_.Advance(next - now);
        TickAndCheck();
        ticked = true;
        break;
      }
      case 13:
        GetStatus();
        break;
    }
    return ticked;
  }

  void TickAndCheck() {
    core_.Tick();
    MEND_FUZZ_CHECK(core_.NextDeadline() > clock_.NowMicros());
  }

  // Mostly the known learners; sometimes any text (validation refuses most).
  std::string LearnerId() {
    if (in_.ConsumeIntegralInRange<int>(0, 15) == 0) return AsciiString(in_, 16);
    return PickFrom(in_, kLearners);
  }

  // The current session, an older one, or a made-up one.
  uint64_t SessionOf(const std::string& id) {
    const std::vector<uint64_t>& known = sessions_[id];
    switch (in_.ConsumeIntegralInRange<int>(0, 5)) {
      case 0:
        return in_.ConsumeIntegral<uint64_t>();
      case 1:
        return known.empty() ? 0 : known[in_.ConsumeIntegralInRange<size_t>(0, known.size() - 1)];
      default:
        return known.empty() ? 1 : known.back();
    }
  }

  uint64_t WaiterId() {
    if (in_.ConsumeBool() || quorum_waiters_.empty()) {
      return in_.ConsumeIntegralInRange<uint64_t>(0, 8);
    }
    size_t index = in_.ConsumeIntegralInRange<size_t>(0, quorum_waiters_.size() - 1);
    return quorum_waiters_[index]->waiter_id;
  }

  // A round id near the newest one, or anywhere up to past the bound.
  uint64_t RoundId() {
    switch (in_.ConsumeIntegralInRange<int>(0, 4)) {
      case 0:
        return 0;
      case 1:
        return latest_round_id_;
      case 2:
        return latest_round_id_ > 0 ? latest_round_id_ - 1 : 0;
      case 3:
        return latest_round_id_ + in_.ConsumeIntegralInRange<uint64_t>(1, 3);
      default:
        return in_.ConsumeIntegralInRange<uint64_t>(0, kMaxCounter + 1);
    }
  }

  uint64_t Counter() {
    if (in_.ConsumeBool()) return in_.ConsumeIntegralInRange<uint64_t>(0, 1000);
    return in_.ConsumeIntegralInRange<uint64_t>(0, kMaxCounter + 1);
  }

  uint32_t TimeoutMs() {
    if (in_.ConsumeIntegralInRange<int>(0, 7) == 0) {
      return in_.ConsumeIntegralInRange<uint32_t>(0, kMaxTimeoutMs + 1);
    }
    return in_.ConsumeIntegralInRange<uint32_t>(0, 5000);
  }

  std::string Key() {
    if (in_.ConsumeIntegralInRange<int>(0, 7) == 0) return AsciiString(in_, 32);
    return PickFrom(in_, kKeys);
  }

  void Reject(const Status& status) {
    MEND_FUZZ_CHECK(status.code() == StatusCode::kInvalidArgument);
    core_.RecordRejection(absl::StatusCodeToString(status.code()), kPeer, StatusMessage(status));
  }

  void Register() {
    v1::RegisterRequest request;
    request.set_learner_id(LearnerId());
    const char* jobs[] = {"", kJobId, "other"};
    request.set_job_id(PickFrom(in_, jobs));
    request.set_rack(PickFrom(in_, kRacks));
    if (in_.ConsumeBool()) {
      request.set_address(in_.ConsumeBool() ? "10.0.0.1:29600" : AsciiString(in_, 40));
    }
    request.set_step(Counter());
    request.set_last_round_id(RoundId());
    auto args = ParseRegister(request);
    if (!args.ok()) return Reject(args.status());
    auto result = core_.Register(*args);
    if (!result.ok()) {
      MEND_FUZZ_CHECK(args->job_id == "other");
      return Reject(result.status());
    }
    MEND_FUZZ_CHECK(args->job_id != "other");
    MEND_FUZZ_CHECK(result->session_id != 0);
    sessions_[args->learner_id].push_back(result->session_id);
  }

  void Heartbeat() {
    v1::HeartbeatRequest request;
    std::string id = LearnerId();
    request.mutable_learner()->set_learner_id(id);
    request.mutable_learner()->set_session_id(SessionOf(id));
    request.set_step(Counter());
    request.set_tokens_total(Counter());
    request.set_tokens_since_last_round(Counter());
    size_t samples = in_.ConsumeIntegralInRange<size_t>(0, 6);
    for (size_t i = 0; i < samples; ++i) {
      request.add_step_time_us(in_.ConsumeIntegralInRange<uint32_t>(0, 2000) * 1000);
    }
    auto args = ParseHeartbeat(request);
    if (!args.ok()) return Reject(args.status());
    auto result = core_.Heartbeat(*args);
    if (!result.ok()) {
      MEND_FUZZ_CHECK(result.status().code() == StatusCode::kNotFound ||
                      result.status().code() == StatusCode::kFailedPrecondition);
      return;
    }
    MEND_FUZZ_CHECK(result->latest_round_id == latest_round_id_);
  }

  void Quorum() {
    v1::QuorumRequest request;
    std::string id = LearnerId();
    request.mutable_learner()->set_learner_id(id);
    request.mutable_learner()->set_session_id(SessionOf(id));
    request.set_last_round_id(RoundId());
    request.set_step(Counter());
    request.set_tokens_since_last_round(Counter());
    request.set_timeout_ms(TimeoutMs());
    request.set_include_members(in_.ConsumeBool());
    auto args = ParseQuorum(request);
    if (!args.ok()) return Reject(args.status());
    auto waiter = std::make_shared<QuorumWaiter>();
    waiter->learner_id = args->learner_id;
    quorum_waiters_.push_back(waiter);
    waiter->last_round_id = args->last_round_id;
    waiter->include_members = request.include_members();
    waiter->waiter_id = core_.Quorum(*args, [this, waiter](StatusOr<RoundAssignment> result) {
      // Never called under the core's mutex: this would deadlock otherwise.
      (void)core_.NextDeadline();
      MEND_FUZZ_CHECK(++waiter->calls == 1);
      if (result.ok()) {
        CheckAssignment(*waiter, *result);
        return;
      }
      StatusCode code = result.status().code();
      MEND_FUZZ_CHECK(code == StatusCode::kDeadlineExceeded || code == StatusCode::kAborted ||
                      code == StatusCode::kCancelled || code == StatusCode::kNotFound ||
                      code == StatusCode::kFailedPrecondition);
    });
    // No waiter id: the call was refused at once.
    if (waiter->waiter_id == 0) MEND_FUZZ_CHECK(waiter->calls == 1);
  }

  void CheckAssignment(const QuorumWaiter& waiter, const RoundAssignment& assignment) {
    MEND_FUZZ_CHECK(assignment.round != nullptr);
    const Round& round = *assignment.round;
    const LighthouseOptions& options = core_.options();
    MEND_FUZZ_CHECK(round.members.size() >= options.quorum.min_learners);
    MEND_FUZZ_CHECK(assignment.rank < round.members.size());
    MEND_FUZZ_CHECK(round.members[assignment.rank].id == waiter.learner_id);
    MEND_FUZZ_CHECK(round.members[assignment.rank].last_round_id == waiter.last_round_id);
    if (assignment.round != latest_round_) {
      MEND_FUZZ_CHECK(round.id > latest_round_id_);
      latest_round_ = assignment.round;
      latest_round_id_ = round.id;
    }
    MEND_FUZZ_CHECK(round.rendezvous_prefix == RendezvousPrefix(options.job_id, round.id));
    uint64_t newest = 0;
    unsigned __int128 tokens = 0;
    for (size_t i = 0; i < round.members.size(); ++i) {
      const MemberInfo& member = round.members[i];
      if (i > 0) MEND_FUZZ_CHECK(round.members[i - 1].id < member.id);
      newest = std::max(newest, member.last_round_id);
      tokens += member.tokens_since_last_round;
    }
    MEND_FUZZ_CHECK(round.id > newest && round.heal_round_id == newest);
    MEND_FUZZ_CHECK(round.total_tokens == std::min<unsigned __int128>(tokens, UINT64_MAX));
    CheckHealing(round);
    v1::QuorumResponse response;
    FillQuorumResponse(assignment, waiter.include_members, &response);
    MEND_FUZZ_CHECK(response.rank() == assignment.rank);
    MEND_FUZZ_CHECK(response.world_size() == round.members.size());
    MEND_FUZZ_CHECK(response.has_heal_from() == !round.members[assignment.rank].heal_from.empty());
    MEND_FUZZ_CHECK(static_cast<size_t>(response.members_size()) ==
                    (waiter.include_members ? round.members.size() : 0));
  }

  static void CheckHealing(const Round& round) {
    std::map<std::string, const MemberInfo*> by_id;
    for (const MemberInfo& member : round.members) by_id[member.id] = &member;
    size_t healing = 0;
    for (const MemberInfo& member : round.members) {
      bool behind = member.last_round_id != round.heal_round_id;
      MEND_FUZZ_CHECK(behind == !member.heal_from.empty());
      if (!behind) continue;
      healing++;
      auto source = by_id.find(member.heal_from);
      MEND_FUZZ_CHECK(source != by_id.end());
      MEND_FUZZ_CHECK(source->second->last_round_id == round.heal_round_id);
    }
    size_t listed = 0;
    for (const auto& [source, healees] : round.heal_to) listed += healees.size();
    MEND_FUZZ_CHECK(listed == healing);
  }

  void Leave() {
    v1::LeaveRequest request;
    std::string id = LearnerId();
    request.mutable_learner()->set_learner_id(id);
    request.mutable_learner()->set_session_id(SessionOf(id));
    request.set_reason(AsciiString(in_, 600));
    if (Status check = CheckLeave(request); !check.ok()) return Reject(check);
    Status left = core_.Leave(id, request.learner().session_id(), request.reason());
    MEND_FUZZ_CHECK(left.ok() || left.code() == StatusCode::kNotFound ||
                    left.code() == StatusCode::kFailedPrecondition);
  }

  void StoreSet() {
    v1::StoreSetRequest request;
    request.set_key(Key());
    request.set_value(in_.ConsumeRandomLengthString(1100));
    Status check = CheckStoreSet(request, core_.options().store.max_value_bytes);
    if (!check.ok()) return Reject(check);
    Status set = core_.store().Set(request.key(), request.value());
    if (!set.ok()) {
      MEND_FUZZ_CHECK(set.code() == StatusCode::kResourceExhausted);
      return;
    }
    MEND_FUZZ_CHECK(core_.store().Get(request.key()) == request.value());
  }

  void StoreGet() {
    v1::StoreGetRequest request;
    request.set_key(Key());
    request.set_timeout_ms(in_.ConsumeBool() ? 0 : TimeoutMs());
    if (Status check = CheckStoreGet(request); !check.ok()) return Reject(check);
    if (request.timeout_ms() == 0) {
      (void)core_.store().Get(request.key());
      return;
    }
    Wait({request.key()}, request.timeout_ms());
  }

  void StoreAdd() {
    v1::StoreAddRequest request;
    request.set_key(Key());
    request.set_delta(in_.ConsumeBool() ? in_.ConsumeIntegralInRange<int64_t>(-3, 3)
                                        : in_.ConsumeIntegral<int64_t>());
    if (Status check = CheckStoreAdd(request); !check.ok()) return Reject(check);
    auto sum = core_.store().Add(request.key(), request.delta());
    if (!sum.ok()) {
      StatusCode code = sum.status().code();
      MEND_FUZZ_CHECK(code == StatusCode::kFailedPrecondition || code == StatusCode::kOutOfRange ||
                      code == StatusCode::kResourceExhausted);
      return;
    }
    MEND_FUZZ_CHECK(core_.store().Get(request.key()) == std::to_string(*sum));
  }

  void StoreWait() {
    v1::StoreWaitRequest request;
    size_t keys = in_.ConsumeIntegralInRange<size_t>(0, 4);
    for (size_t i = 0; i < keys; ++i) request.add_keys(Key());
    request.set_timeout_ms(TimeoutMs());
    if (Status check = CheckStoreWait(request); !check.ok()) return Reject(check);
    Wait({request.keys().begin(), request.keys().end()}, request.timeout_ms());
  }

  void Wait(std::vector<std::string> keys, uint32_t timeout_ms) {
    auto waiter = std::make_shared<StoreWaiter>();
    waiter->keys = keys.size();
    store_waiters_.push_back(waiter);
    uint64_t id = core_.store().Wait(
        std::move(keys), Micros{timeout_ms} * kMicrosPerMilli,
        [this, waiter](Status status, std::vector<std::string> values) {
          (void)core_.NextDeadline();  // deadlocks if called under the core's mutex
          MEND_FUZZ_CHECK(++waiter->calls == 1);
          MEND_FUZZ_CHECK(status.ok() || status.code() == StatusCode::kDeadlineExceeded ||
                          status.code() == StatusCode::kCancelled);
          MEND_FUZZ_CHECK(values.size() == (status.ok() ? waiter->keys : 0));
        });
    store_wait_ids_.push_back(id);
  }

  void StoreCancel() {
    uint64_t id = in_.ConsumeIntegralInRange<uint64_t>(0, 8);
    if (in_.ConsumeBool() && !store_wait_ids_.empty()) {
      id = store_wait_ids_[in_.ConsumeIntegralInRange<size_t>(0, store_wait_ids_.size() - 1)];
    }
    core_.store().Cancel(id);
  }

  void StoreDelete() {
    v1::StoreDeleteRequest request;
    request.set_key(Key());
    request.set_prefix(in_.ConsumeBool());
    if (Status check = CheckStoreDelete(request); !check.ok()) return Reject(check);
    (void)core_.store().Delete(request.key(), request.prefix());
    MEND_FUZZ_CHECK(!core_.store().Get(request.key()).has_value());
  }

  void GetStatus() {
    v1::GetStatusRequest request;
    request.set_max_learners(in_.ConsumeIntegralInRange<uint32_t>(0, kMaxStatusItems + 1));
    request.set_max_rounds(in_.ConsumeIntegralInRange<uint32_t>(0, kMaxStatusItems + 1));
    if (Status check = CheckGetStatus(request); !check.ok()) return Reject(check);
    StatusSnapshot snapshot = core_.Snapshot(request.max_learners(), request.max_rounds());
    MEND_FUZZ_CHECK(snapshot.learners.size() <= request.max_learners());
    MEND_FUZZ_CHECK(snapshot.rounds.size() <= request.max_rounds());
    MEND_FUZZ_CHECK(!StatusJson(snapshot).empty());
    MEND_FUZZ_CHECK(!PrometheusText(snapshot).empty());
  }

  // The snapshot's counts against its own learner list and the callbacks
  // this driver still waits for.
  void CheckSnapshot() {
    StatusSnapshot snapshot = core_.Snapshot(kStatusListLimit, 0);
    MEND_FUZZ_CHECK(snapshot.learners.size() == snapshot.learners_known);
    size_t alive = 0, waiting = 0, slow = 0;
    for (const LearnerView& learner : snapshot.learners) {
      if (learner.state == "waiting" || learner.state == "training") alive++;
      if (learner.state == "waiting") waiting++;
      if (learner.slow) slow++;
    }
    MEND_FUZZ_CHECK(snapshot.learners_alive == alive);
    MEND_FUZZ_CHECK(snapshot.learners_waiting == waiting);
    MEND_FUZZ_CHECK(snapshot.learners_slow == slow);
    size_t quorum_outstanding = 0, store_outstanding = 0;
    for (const auto& waiter : quorum_waiters_) quorum_outstanding += waiter->calls == 0;
    for (const auto& waiter : store_waiters_) store_outstanding += waiter->calls == 0;
    MEND_FUZZ_CHECK(snapshot.learners_waiting == quorum_outstanding);
    MEND_FUZZ_CHECK(snapshot.store_waiters == store_outstanding);
    MEND_FUZZ_CHECK(snapshot.latest_round_id == latest_round_id_);
  }

  FuzzedDataProvider& in_;
  FakeClock clock_;
  LighthouseCore core_;
  uint64_t wakeups_ = 0;
  std::map<std::string, std::vector<uint64_t>> sessions_;
  std::vector<std::shared_ptr<QuorumWaiter>> quorum_waiters_;
  std::vector<std::shared_ptr<StoreWaiter>> store_waiters_;
  std::vector<uint64_t> store_wait_ids_;
  std::shared_ptr<const Round> latest_round_;
  uint64_t latest_round_id_ = 0;
};

}  // namespace
}  // namespace mend::coordinator

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  spdlog::set_level(spdlog::level::off);  // the core logs every event
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  mend::coordinator::Driver driver(in, mend::coordinator::ConsumeOptions(in));
  driver.Run();
  return 0;
}
