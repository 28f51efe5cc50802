#include "mend/learner_agent.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "coordinator/datagram_link.h"
#include "coordinator/group_ranks.h"
#include "core/mutex.h"
#include "core/status_format.h"
#include "core/text.h"
#include "dataplane/lighthouse_rendezvous.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace mend {
namespace {

constexpr size_t kMaxBufferedStepTimes = 1024;
constexpr Micros kMinRetry = 100 * kMicrosPerMilli;
constexpr Micros kMaxRetry = 2 * kMicrosPerSecond;
// A datagram join is sent again this often until its decision arrives.
constexpr Micros kJoinResend = 200 * kMicrosPerMilli;
constexpr int kMaxUdpSilences = 3;

bool IsFatal(StatusCode code) {
  return code == StatusCode::kUnauthenticated || code == StatusCode::kInvalidArgument ||
         code == StatusCode::kPermissionDenied;
}

// The lighthouse no longer knows this session: register again.
bool NeedsRegistration(StatusCode code) {
  return code == StatusCode::kNotFound || code == StatusCode::kFailedPrecondition;
}

// The group's own store when there is one, else the lighthouse's.
StatusOr<std::unique_ptr<RendezvousStore>> OpenStore(const GroupStoreOpener& group_store,
                                                     LighthouseClient& client) {
  if (group_store) return group_store();
  return std::unique_ptr<RendezvousStore>(std::make_unique<LighthouseRendezvousStore>(client));
}

class LearnerAgentImpl final : public LearnerAgent {
 public:
  LearnerAgentImpl(const Config& config, const std::string& token, const LearnerIdentity& identity,
                   std::unique_ptr<LighthouseClient> client, GroupStoreOpener group_store)
      : group_store_(std::move(group_store)),
        identity_(identity),
        address_(config.lighthouse),
        token_(token),
        use_udp_(config.control_transport == "udp"),
        client_(std::move(client)),
        heartbeat_interval_(config.heartbeat_ms * kMicrosPerMilli),
        heartbeat_timeout_(config.heartbeat_timeout_ms * kMicrosPerMilli) {}

  ~LearnerAgentImpl() override { Stop(); }

  // Registers, retrying in the background; waits up to `wait` for the
  // lighthouse to answer (0: not at all). UNAVAILABLE naming the address and
  // the attempts when it did not (the agent is stopped then).
  Status FirstRegistration(Micros wait) {
    TryRegister();
    {
      MutexLock lock(mu_);
      if (!fatal_.ok()) return fatal_;
      thread_ = std::thread([this]() { HeartbeatLoop(); });
      const Micros deadline = RealClock()->NowMicros() + wait;
      while (!registered_ && fatal_.ok() && WaitOnce(deadline)) {
      }
      if (!fatal_.ok()) {
        lock.Unlock();
        Stop();
        lock.Lock();
        return fatal_;
      }
      if (registered_ || wait <= 0) return OkStatus();
    }
    Stop();
    MutexLock lock(mu_);
    return UnavailableError(fmt::format(
        "learner '{}': the lighthouse at {} did not answer within lighthouse_wait_ms = {} ({} "
        "registration "
        "attempt(s); the last: {}); check the `lighthouse` address and that the lighthouse runs",
        identity_.id, address_, wait / kMicrosPerMilli, register_attempts_, last_register_error_));
  }

  void RecordStep(uint64_t step, uint64_t tokens, Micros step_time) override {
    MutexLock lock(mu_);
    step_ = std::max(step_, step);
    tokens_total_ += tokens;
    tokens_since_round_ += tokens;
    if (step_times_.size() >= kMaxBufferedStepTimes) step_times_.erase(step_times_.begin());
    step_times_.push_back(static_cast<uint32_t>(std::clamp<Micros>(step_time, 1, 3'600'000'000)));
  }

  StatusOr<QuorumResult> Quorum(uint64_t last_round_id, uint64_t tokens_since_last_round,
                                Micros timeout, bool include_members,
                                uint64_t boundary_step) override {
    Micros deadline = RealClock()->NowMicros() + timeout;
    Micros retry = kMinRetry;
    while (true) {
      QuorumRequestArgs args;
      {
        MutexLock lock(mu_);
        last_round_id_ = last_round_id;
        while (!registered_ && fatal_.ok() && !stopping_ && !interrupted_ && WaitOnce(deadline)) {
        }
        if (!fatal_.ok()) return fatal_;
        if (stopping_ || interrupted_) return AbortedError("learner agent is stopping");
        if (!registered_) {
          return DeadlineExceededError(
              fmt::format("learner '{}': not registered with lighthouse {} within {} ms",
                          identity_.id, address_, timeout / kMicrosPerMilli));
        }
        args.learner = session_;
        args.step = boundary_step > 0 ? boundary_step : step_;
        short_of_quorum_since_.store(0);  // news of the join before this one
      }
      args.last_round_id = last_round_id;
      args.tokens_since_last_round = tokens_since_last_round;
      args.include_members = include_members;
      args.timeout = deadline - RealClock()->NowMicros();
      if (args.timeout <= 0) {
        return DeadlineExceededError(fmt::format("learner '{}': quorum timeout of {} ms passed",
                                                 identity_.id, timeout / kMicrosPerMilli));
      }
      StatusOr<QuorumResult> result = CallQuorum(args);
      if (result.ok()) {
        Heard();
        MutexLock lock(mu_);
        RaiseTo(latest_round_id_, result->round_id);
        tokens_since_round_ = 0;
        return result;
      }
      StatusCode code = result.status().code();
      if (code == StatusCode::kDeadlineExceeded) return result.status();
      if (IsFatal(code)) {
        SetFatal(result.status());
        return result.status();
      }
      MutexLock lock(mu_);
      if (NeedsRegistration(code)) {
        if (registered_ && session_.session_id == args.learner.session_id) {
          spdlog::warn("{}; registering again", result.status().message());
          registered_ = false;
          register_now_ = true;
          wake_.NotifyAll();
        }
        continue;
      }
      // UNAVAILABLE (lighthouse down or restarting), ABORTED (declared dead
      // while stopped, or membership changed), CANCELLED (server shutdown):
      // try again until the deadline.
      if (code != StatusCode::kAborted) CallFailed();
      spdlog::debug("quorum call failed, retrying: {}", result.status().message());
      const Micros retry_at = std::min(deadline, RealClock()->NowMicros() + retry);
      while (!stopping_ && !interrupted_ && WaitOnce(retry_at)) {
      }
      retry = std::min(retry * 2, kMaxRetry);
    }
  }

  void Interrupt() override {
    std::shared_ptr<PendingCall> call;
    {
      MutexLock lock(mu_);
      interrupted_ = true;
      call = current_call_;
      wake_.NotifyAll();
    }
    if (call) {
      MutexLock lock(call->mu);
      call->interrupted = true;
      call->done.NotifyAll();
    }
    if (coordinator::DatagramLink* link = Link()) link->Interrupt();
  }

  Status Leave(const std::string& reason) override {
    LearnerRef session;
    {
      MutexLock lock(mu_);
      if (registered_) session = session_;
    }
    Status status = OkStatus();
    if (session.session_id != 0) status = client_->Leave(session, reason);
    Stop();
    return status;
  }

  void WithholdHeartbeats(bool withhold) override {
    MutexLock lock(mu_);
    if (withhold_ && !withhold) resumed_at_ = RealClock()->NowMicros();
    withhold_ = withhold;
  }

  void Stop() override {
    Interrupt();
    {
      MutexLock lock(mu_);
      stopping_ = true;
      wake_.NotifyAll();
    }
    if (thread_.joinable()) thread_.join();
    stream_.reset();
  }

  const std::string& id() const override { return identity_.id; }
  bool slow() const override { return slow_.load(); }
  double slow_zscore() const override { return zscore_.load(); }
  uint64_t latest_round_id() const override { return latest_round_id_.load(); }
  uint64_t latest_round_step() const override { return latest_round_step_.load(); }
  bool lighthouse_lost() const override {
    const Micros timeout = HeartbeatTimeout();
    // A silence alone is not enough: a learner resumed after SIGSTOP has
    // heard nothing for as long, though its lighthouse is fine.
    const Micros heard = last_heard_.load();
    return heard != 0 && last_failure_.load() > heard && RealClock()->NowMicros() - heard > timeout;
  }
  bool short_of_quorum() const override {
    const Micros timeout = HeartbeatTimeout();
    // For a heartbeat timeout on end: an acknowledgement sent before the
    // latest join formed a round may arrive after it (see OnAck).
    const Micros since = short_of_quorum_since_.load();
    return since != 0 && RealClock()->NowMicros() - since >= timeout;
  }
  uint64_t registrations() const override { return registrations_.load(); }
  Status fatal_status() const override {
    MutexLock lock(mu_);
    return fatal_;
  }
  LighthouseClient& client() override { return *client_; }
  StatusOr<std::unique_ptr<RendezvousStore>> OpenGroupStore() override {
    return OpenStore(group_store_, *client_);
  }

 private:
  // A Quorum call in flight; shared with its completion callback, which may
  // run after the agent is gone.
  struct PendingCall {
    Mutex mu;
    CondVar done;
    std::optional<StatusOr<QuorumResult>> result ABSL_GUARDED_BY(mu);
    bool interrupted ABSL_GUARDED_BY(mu) = false;
  };

  Micros HeartbeatTimeout() const {
    MutexLock lock(mu_);
    return heartbeat_timeout_;
  }

  // The datagram link when this agent speaks UDP to its lighthouse, else nullptr.
  coordinator::DatagramLink* Link() {
    MutexLock lock(mu_);
    return link_disabled_ ? nullptr : link_.get();
  }

  // The lighthouse stopped acknowledging datagrams: register again over gRPC
  // (it may have restarted, perhaps elsewhere); after kMaxUdpSilences in a row
  // give up on the datagram channel (e.g. a firewall drops UDP) and use gRPC.
  void OnUdpSilence(Micros silent) {
    MutexLock lock(mu_);
    if (++udp_silences_ >= kMaxUdpSilences) {
      spdlog::warn("lighthouse {} acknowledged no datagram {} times in a row; using gRPC", address_,
                   udp_silences_);
      link_disabled_ = true;
    } else {
      spdlog::warn("lighthouse {} has not acknowledged heartbeats for {} ms; registering again",
                   address_, silent / kMicrosPerMilli);
    }
    registered_ = false;
    register_now_ = true;
    wake_.NotifyAll();
  }

  void OnAck(const HeartbeatAck& ack) {
    Heard();
    {
      MutexLock lock(mu_);
      udp_silences_ = 0;
    }
    if (ack.slow != slow_.load()) {
      spdlog::info("lighthouse {} this learner as fail-slow (z = {:.1f})",
                   ack.slow ? "flagged" : "cleared", ack.slow_zscore);
    }
    slow_ = ack.slow;
    zscore_ = ack.slow_zscore;
    RaiseTo(latest_round_id_, ack.latest_round_id);
    RaiseTo(latest_round_step_, ack.latest_round_step);
    if (!ack.short_of_quorum) {
      short_of_quorum_since_.store(0);
    } else {
      Micros unset = 0;  // (kept from the first such acknowledgement)
      short_of_quorum_since_.compare_exchange_strong(unset, RealClock()->NowMicros());
    }
  }

  // The lighthouse answered, or a call to it failed as if it were down or
  // cut off (see lighthouse_lost()).
  void Heard() { last_heard_.store(RealClock()->NowMicros()); }
  void CallFailed() { last_failure_.store(RealClock()->NowMicros()); }

  // value = max(value, candidate), atomically (acks and Quorum answers race).
  static void RaiseTo(std::atomic<uint64_t>& value, uint64_t candidate) {
    uint64_t seen = value.load();
    while (candidate > seen && !value.compare_exchange_weak(seen, candidate)) {
    }
  }

  void OnUnknownSession(uint64_t session_id) {
    MutexLock lock(mu_);
    if (registered_ && session_.session_id == session_id) {
      spdlog::warn("lighthouse {} does not know this learner's session; registering again",
                   address_);
      registered_ = false;
      register_now_ = true;
      wake_.NotifyAll();
    }
  }

  // Opens the datagram link on the first registration that offers one.
  void MaybeOpenLink(int udp_port) {
    if (!use_udp_) return;
    if (udp_port <= 0) {
      spdlog::warn(
          "control_transport = udp, but lighthouse {} serves no datagram channel; "
          "using gRPC",
          address_);
      return;
    }
    MutexLock lock(mu_);
    if (link_disabled_) return;
    if (link_) {
      if (link_->port() != udp_port) {
        if (Status moved = link_->Retarget(udp_port); !moved.ok()) {
          spdlog::warn("datagram channel: {}", moved.message());
        }
      }
      return;
    }
    coordinator::DatagramLink::Hooks hooks;
    hooks.on_ack = [this](const HeartbeatAck& ack) { OnAck(ack); };
    hooks.on_unknown_session = [this](uint64_t session) { OnUnknownSession(session); };
    auto link = coordinator::DatagramLink::Open(SplitHostPort(address_).first, udp_port, token_,
                                                std::move(hooks));
    if (!link.ok()) {
      spdlog::warn("cannot open the datagram channel, using gRPC: {}", link.status().message());
      return;
    }
    link_ = std::move(*link);
  }

  // One Quorum call that Interrupt() can abandon: a datagram join when the
  // link is up (and no member list is wanted), else a gRPC call.
  StatusOr<QuorumResult> CallQuorum(const QuorumRequestArgs& args) {
    if (coordinator::DatagramLink* link = Link(); link && !args.include_members) {
      return link->Join(args, kJoinResend);
    }
    auto call = std::make_shared<PendingCall>();
    {
      MutexLock lock(mu_);
      if (interrupted_) return AbortedError("learner agent is stopping");
      current_call_ = call;
    }
    client_->QuorumAsync(args, [call](StatusOr<QuorumResult> result) {
      MutexLock lock(call->mu);
      call->result = std::move(result);
      call->done.NotifyAll();
    });
    StatusOr<QuorumResult> result = AbortedError("learner agent is stopping");
    {
      MutexLock lock(call->mu);
      while (!call->result && !call->interrupted) call->done.Wait(call->mu);
      if (call->result) result = std::move(*call->result);
    }
    MutexLock lock(mu_);
    current_call_.reset();
    return result;
  }

  // Waits on wake_ once: until notified (or woken spuriously), at most until
  // `deadline`. False, without waiting, once `deadline` has passed.
  bool WaitOnce(Micros deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Micros remaining = deadline - RealClock()->NowMicros();
    if (remaining <= 0) return false;
    wake_.WaitFor(mu_, std::chrono::microseconds(remaining));
    return true;
  }

  void SetFatal(const Status& status) {
    MutexLock lock(mu_);
    if (fatal_.ok()) {
      spdlog::error("learner '{}' refused by the lighthouse: {}", identity_.id, status.message());
      fatal_ = status;
    }
    wake_.NotifyAll();
  }

  // Registers once; on success starts a new session.
  void TryRegister() ABSL_LOCKS_EXCLUDED(mu_) {
    uint64_t session_before = 0;
    uint64_t step = 0;
    uint64_t last_round = 0;
    {
      MutexLock lock(mu_);
      step = step_;
      last_round = last_round_id_;
      session_before = session_.session_id;
    }
    StatusOr<Registration> registration = client_->Register(identity_, step, last_round);
    {
      MutexLock lock(mu_);
      register_attempts_++;
      if (!registration.ok()) last_register_error_ = registration.status().ToString();
    }
    if (!registration.ok()) {
      if (IsFatal(registration.status().code())) {
        SetFatal(registration.status());
      } else {
        CallFailed();
        spdlog::warn("cannot register with the lighthouse yet: {}",
                     registration.status().message());
      }
      return;
    }
    Heard();
    MutexLock lock(mu_);
    if (lighthouse_instance_ != 0 && lighthouse_instance_ != registration->lighthouse_instance) {
      spdlog::info("lighthouse {} restarted; registered again", address_);
    }
    lighthouse_instance_ = registration->lighthouse_instance;
    if (registration->heartbeat_interval > 0)
      heartbeat_interval_ = registration->heartbeat_interval;
    if (registration->heartbeat_timeout > 0) heartbeat_timeout_ = registration->heartbeat_timeout;
    session_ = LearnerRef{identity_.id, registration->session_id};
    registered_ = true;
    registrations_++;
    stream_restart_ = true;
    wake_.NotifyAll();
    lock.Unlock();
    MaybeOpenLink(registration->udp_port);
    if (coordinator::DatagramLink* link = Link();
        link && registration->session_id != session_before) {
      link->Attach(registration->session_id);
    }
  }

  void HeartbeatLoop() {
    Micros retry = kMinRetry;
    Micros next_registration = 0;
    MutexLock lock(mu_);
    while (!stopping_) {
      if (!fatal_.ok()) {
        while (!stopping_) wake_.Wait(mu_);
        break;
      }
      if (register_now_) {
        register_now_ = false;
        next_registration = 0;
      }
      Micros now = RealClock()->NowMicros();
      if (!registered_ && now >= next_registration) {
        lock.Unlock();
        stream_.reset();
        TryRegister();
        lock.Lock();
        if (!registered_) {
          next_registration = RealClock()->NowMicros() + retry;
          retry = std::min(retry * 2, kMaxRetry);
        } else {
          retry = kMinRetry;
        }
      }
      if (registered_) {
        lock.Unlock();
        PumpStream();
        lock.Lock();
      }
      const Micros next_beat = RealClock()->NowMicros() + heartbeat_interval_;
      while (!stopping_ && !register_now_ && WaitOnce(next_beat)) {
      }
    }
  }

  // Opens, checks and feeds the heartbeat stream.
  void PumpStream() ABSL_LOCKS_EXCLUDED(mu_) {
    if (stream_ && stream_->done()) {
      Status ended = stream_->status();
      stream_.reset();
      if (IsFatal(ended.code())) {
        SetFatal(ended);
        return;
      }
      MutexLock lock(mu_);
      if (NeedsRegistration(ended.code())) {
        spdlog::warn("{}; registering again", ended.message());
        registered_ = false;
        register_now_ = true;
        return;
      }
      CallFailed();
      spdlog::debug("heartbeat stream ended: {}", ended.message());
    }
    HeartbeatUpdate update;
    LearnerRef session;
    bool restart = false;
    Micros ack_timeout = 0;
    Micros resumed_at = 0;
    {
      MutexLock lock(mu_);
      if (!registered_ || withhold_) return;
      ack_timeout = heartbeat_timeout_;
      resumed_at = resumed_at_;
      session = session_;
      restart = stream_restart_;
      stream_restart_ = false;
      update.step = step_;
      update.tokens_total = tokens_total_;
      update.tokens_since_last_round = tokens_since_round_;
      update.step_time_us.swap(step_times_);
    }
    Micros now = RealClock()->NowMicros();
    // No acknowledgement is due for heartbeats withheld (WithholdHeartbeats).
    const auto silent_since = [&](Micros last_ack) { return now - std::max(last_ack, resumed_at); };
    if (coordinator::DatagramLink* link = Link()) {
      if (silent_since(link->last_ack_at()) > ack_timeout) {
        OnUdpSilence(silent_since(link->last_ack_at()));
        return;
      }
      link->SendHeartbeat(update);
      return;
    }
    if (stream_ && silent_since(stream_->last_ack_at()) > ack_timeout) {
      spdlog::warn("lighthouse {} has not acknowledged heartbeats for {} ms; reconnecting",
                   address_, silent_since(stream_->last_ack_at()) / kMicrosPerMilli);
      stream_.reset();
    }
    if (restart) stream_.reset();
    if (!stream_) {
      stream_ = client_->OpenHeartbeat(session, [this](const HeartbeatAck& ack) { OnAck(ack); });
    }
    stream_->Send(std::move(update));
  }

  // Constant after construction.
  const GroupStoreOpener group_store_;
  const LearnerIdentity identity_;
  const std::string address_;
  const std::string token_;
  const bool use_udp_;
  const std::unique_ptr<LighthouseClient> client_;

  // Owned by the heartbeat thread (and Stop after the join).
  std::unique_ptr<HeartbeatStream> stream_;
  std::thread thread_;

  std::atomic<bool> slow_{false};
  std::atomic<double> zscore_{0};
  std::atomic<uint64_t> latest_round_id_{0};
  std::atomic<uint64_t> latest_round_step_{0};
  // When the acknowledgements began to say the pending join is short of a
  // quorum (0: the last one did not, or a join was sent since).
  std::atomic<Micros> short_of_quorum_since_{0};
  std::atomic<uint64_t> registrations_{0};
  std::atomic<Micros> last_heard_{0};    // when the lighthouse last answered (0: never)
  std::atomic<Micros> last_failure_{0};  // when a call to it last failed (down, unreachable)

  mutable Mutex mu_;
  CondVar wake_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  bool stream_restart_ ABSL_GUARDED_BY(mu_) = false;
  bool register_now_ ABSL_GUARDED_BY(mu_) = false;
  bool interrupted_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<PendingCall> current_call_ ABSL_GUARDED_BY(mu_);
  // Created once, destroyed with the agent (after its threads).
  std::unique_ptr<coordinator::DatagramLink> link_ ABSL_GUARDED_BY(mu_);
  bool link_disabled_ ABSL_GUARDED_BY(mu_) = false;
  int udp_silences_ ABSL_GUARDED_BY(mu_) = 0;
  Status fatal_ ABSL_GUARDED_BY(mu_);
  uint64_t register_attempts_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_register_error_ ABSL_GUARDED_BY(mu_);
  LearnerRef session_ ABSL_GUARDED_BY(mu_);
  uint64_t lighthouse_instance_ ABSL_GUARDED_BY(mu_) = 0;
  // From config until the lighthouse says otherwise at registration.
  Micros heartbeat_interval_ ABSL_GUARDED_BY(mu_);
  Micros heartbeat_timeout_ ABSL_GUARDED_BY(mu_);
  bool withhold_ ABSL_GUARDED_BY(mu_) = false;  // see WithholdHeartbeats
  Micros resumed_at_ ABSL_GUARDED_BY(mu_) = 0;  // when heartbeats were last resumed
  uint64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t tokens_total_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t tokens_since_round_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_round_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint32_t> step_times_ ABSL_GUARDED_BY(mu_);
};

// A rank other than 0 of a multi-rank learner: it neither registers nor
// heartbeats (group rank 0 speaks for the group) and learns the rounds from
// its group (reducer/learner_group.h); it keeps a lighthouse client for the
// store, where the rounds' communicators rendezvous.
class GroupRankAgent final : public LearnerAgent {
 public:
  GroupRankAgent(std::string id, int64_t rank, std::unique_ptr<LighthouseClient> client,
                 GroupStoreOpener group_store)
      : id_(std::move(id)),
        rank_(rank),
        client_(std::move(client)),
        group_store_(std::move(group_store)) {}

  void RecordStep(uint64_t, uint64_t, Micros) override {}
  StatusOr<QuorumResult> Quorum(uint64_t, uint64_t, Micros, bool, uint64_t) override {
    return FailedPreconditionError(fmt::format(
        "learner '{}' group rank {}: only group rank 0 joins rounds; the others learn them from it",
        id_, rank_));
  }
  void Interrupt() override {}
  Status Leave(const std::string&) override { return OkStatus(); }
  void Stop() override {}
  void WithholdHeartbeats(bool) override {}
  const std::string& id() const override { return id_; }
  bool slow() const override { return false; }
  double slow_zscore() const override { return 0; }
  uint64_t latest_round_id() const override { return 0; }
  uint64_t latest_round_step() const override { return 0; }
  bool lighthouse_lost() const override { return false; }
  bool short_of_quorum() const override { return false; }
  uint64_t registrations() const override { return 1; }
  Status fatal_status() const override { return OkStatus(); }
  LighthouseClient& client() override { return *client_; }
  StatusOr<std::unique_ptr<RendezvousStore>> OpenGroupStore() override {
    return OpenStore(group_store_, *client_);
  }

 private:
  const std::string id_;
  const int64_t rank_;
  std::unique_ptr<LighthouseClient> client_;
  const GroupStoreOpener group_store_;
};

}  // namespace

StatusOr<std::vector<std::string>> ShareWithGroupRanks(RendezvousStore& store, const Config& config,
                                                       const std::string& learner_id,
                                                       const std::string& prefix,
                                                       const std::string& mine,
                                                       bool only_rank0_waits,
                                                       std::string_view missing) {
  const Micros deadline = RealClock()->NowMicros() + config.quorum_timeout_ms * kMicrosPerMilli;
  const auto give_up = [&](int64_t rank, const Status& why) {
    return Status(
        why.code(),
        fmt::format("learner '{}' group rank {}: group rank {}{} within quorum_timeout_ms = {}: {}",
                    learner_id, config.group_rank, rank, missing, config.quorum_timeout_ms,
                    why.message()));
  };
  Micros retry = kMinRetry;
  while (true) {
    Status set = store.Set(fmt::format("{}{}", prefix, config.group_rank), mine);
    if (set.ok()) break;
    if (set.code() != StatusCode::kUnavailable || RealClock()->NowMicros() + retry > deadline) {
      return give_up(config.group_rank, set);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(retry));  // the lighthouse is not up yet
    retry = std::min(retry * 2, kMaxRetry);
  }
  if (only_rank0_waits && config.group_rank != 0) return std::vector<std::string>{};
  std::vector<std::string> values;
  for (int64_t r = 0; r < config.group_size; ++r) {
    if (r == config.group_rank) {
      values.push_back(mine);
      continue;
    }
    StatusOr<std::string> value = std::string();
    retry = kMinRetry;
    while (true) {
      value = store.Get(fmt::format("{}{}", prefix, r),
                        std::clamp<Micros>(deadline - RealClock()->NowMicros(), 1, kMaxRetry));
      if (value.ok() || RealClock()->NowMicros() >= deadline) break;
      // An unreachable store fails at once, and a Get whose wait rounds down
      // to 0 ms answers NOT_FOUND at once: both mean "not yet".
      if (value.status().code() == StatusCode::kUnavailable ||
          value.status().code() == StatusCode::kNotFound) {
        std::this_thread::sleep_for(std::chrono::microseconds(retry));
        retry = std::min(retry * 2, kMaxRetry);
      } else if (value.status().code() != StatusCode::kDeadlineExceeded) {
        break;
      }
    }
    if (!value.ok()) {
      // The value did not come in time, however the last Get put it.
      const Status& why = value.status();
      return give_up(
          r, why.code() == StatusCode::kNotFound ? DeadlineExceededError(why.message()) : why);
    }
    values.push_back(*std::move(value));
  }
  return values;
}

std::string GroupStorePrefix(const Config& config, const std::string& learner_id) {
  const char* restarts = std::getenv("TORCHELASTIC_RESTART_COUNT");
  return fmt::format("{}/group/{}/{}.{}/", config.job_id, learner_id, config.group_generation,
                     restarts != nullptr && *restarts != '\0' ? restarts : "0");
}

StatusOr<std::unique_ptr<LearnerAgent>> LearnerAgent::Start(const Config& config,
                                                            const std::string& token,
                                                            const LearnerIdentity& identity,
                                                            GroupStoreOpener group_store) {
  LighthouseClientOptions options;
  options.address = config.lighthouse;
  options.token = token;
  options.tls_ca_file = config.tls_ca_file;
  options.rpc_timeout = config.rpc_timeout_ms * kMicrosPerMilli;
  MEND_ASSIGN_OR_RETURN(auto client, LighthouseClient::Connect(options));
  LearnerIdentity full = identity;
  if (full.job_id.empty()) full.job_id = config.job_id;
  if (full.rack.empty()) full.rack = config.rack;
  full.group_size = static_cast<uint32_t>(config.group_size);
  if (config.group_size > 1) {
    MEND_ASSIGN_OR_RETURN(std::unique_ptr<RendezvousStore> store, OpenStore(group_store, *client));
    // Rank 0 registers every rank's data-plane host, once all have started.
    MEND_ASSIGN_OR_RETURN(
        full.rank_addresses,
        ShareWithGroupRanks(*store, config, full.id, GroupStorePrefix(config, full.id) + "address/",
                            config.dataplane_host, /*only_rank0_waits=*/true,
                            "'s data-plane address did not come"));
  } else {
    full.rank_addresses = {config.dataplane_host};
  }
  if (config.group_rank > 0) {
    return std::unique_ptr<LearnerAgent>(std::make_unique<GroupRankAgent>(
        full.id, config.group_rank, std::move(client), std::move(group_store)));
  }
  auto agent = std::make_unique<LearnerAgentImpl>(config, token, full, std::move(client),
                                                  std::move(group_store));
  MEND_RETURN_IF_ERROR(agent->FirstRegistration(config.lighthouse_wait_ms * kMicrosPerMilli));
  return std::unique_ptr<LearnerAgent>(std::move(agent));
}

}  // namespace mend
