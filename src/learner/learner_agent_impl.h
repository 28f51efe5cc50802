// LearnerAgentImpl: the LearnerAgent of a single-rank learner, or of group
// rank 0 of a multi-rank one (the other ranks get a group-rank agent, see
// group_ranks.h). LearnerAgent::Start builds it.
//
// learner_agent.cc holds registration and joins; learner_agent_heartbeat.cc
// the heartbeat thread, what the acknowledgements tell, and which control
// channel (control_channel.h: gRPC, or the datagram link) carries the
// heartbeats and joins: Channel(), the one place of that rule.
//
// Thread-safety: as LearnerAgent. One mutex, mu_, guards the mutable state;
// what the accessors read without it is atomic.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "core/mutex.h"
#include "learner/control_channel.h"
#include "learner/datagram_link.h"
#include "learner/group_ranks.h"
#include "mend/clock.h"
#include "mend/learner_agent.h"
#include "mend/lighthouse_client.h"
#include "mend/status.h"

namespace mend {

class LearnerAgentImpl final : public LearnerAgent {
 public:
  // `clock` is not owned and must outlive the agent; every wait and
  // timestamp of the agent is on it.
  LearnerAgentImpl(const AgentOptions& options, const std::string& token,
                   const LearnerIdentity& identity, const Clock& clock,
                   std::unique_ptr<LighthouseClient> client, GroupStoreOpener group_store);
  ~LearnerAgentImpl() override { Stop(); }

  // Registers, retrying in the background; waits up to `wait` for the
  // lighthouse to answer (0: not at all). UNAVAILABLE naming the address and
  // the attempts when it did not (the agent is stopped then).
  [[nodiscard]] Status FirstRegistration(Micros wait);

  void RecordStep(uint64_t step, uint64_t tokens, Micros step_time) override;
  StatusOr<QuorumResult> Quorum(uint64_t last_round_id, uint64_t tokens_since_last_round,
                                Micros timeout, bool include_members,
                                uint64_t boundary_step) override;
  void Interrupt() override;
  Status Leave(const std::string& reason) override;
  void WithholdHeartbeats(bool withhold) override;
  void Stop() override;

  const std::string& id() const override { return identity_.id; }
  bool slow() const override { return slow_.load(); }
  double slow_zscore() const override { return zscore_.load(); }
  uint64_t latest_round_id() const override { return latest_round_id_.load(); }
  uint64_t latest_round_step() const override { return latest_round_step_.load(); }
  bool lighthouse_lost() const override;
  bool short_of_quorum() const override;
  uint64_t registrations() const override { return registrations_.load(); }
  Status fatal_status() const override {
    MutexLock lock(mu_);
    return fatal_;
  }
  const Clock& clock() const override { return clock_; }
  LighthouseClient& client() override { return *client_; }
  StatusOr<std::unique_ptr<RendezvousStore>> OpenGroupStore() override {
    return OpenGroupOrLighthouseStore(group_store_, *client_, clock_);
  }
  std::string data_plane_secret() const override { return secrets_.data_plane; }
  std::string checkpoint_secret() const override { return secrets_.checkpoints; }
  const AgentOptions& options() const override { return options_; }

 private:
  static constexpr size_t kMaxBufferedStepTimes = 1024;
  static constexpr Micros kMinRetry = 100 * kMicrosPerMilli;
  static constexpr Micros kMaxRetry = 2 * kMicrosPerSecond;
  // A datagram join is sent again this often until its decision arrives.
  static constexpr Micros kJoinResend = 200 * kMicrosPerMilli;
  static constexpr int kMaxUdpSilences = 3;

  // A refusal that retrying cannot fix (wrong token, bad identity).
  // OUT_OF_RANGE: the job finished, and this learner would train a new one
  // alone (LighthouseCore::JobFinishedLocked).
  static bool IsFatal(StatusCode code) {
    return code == StatusCode::kUnauthenticated || code == StatusCode::kInvalidArgument ||
           code == StatusCode::kPermissionDenied || code == StatusCode::kOutOfRange;
  }
  // value = max(value, candidate), atomically (acks and Quorum answers race).
  static void RaiseTo(std::atomic<uint64_t>& value, uint64_t candidate) {
    uint64_t seen = value.load();
    while (candidate > seen && !value.compare_exchange_weak(seen, candidate)) {
    }
  }

  // Registration and joins (learner_agent.cc).

  // Quorum's first step: waits until `deadline` for a registration, and
  // returns the join's session and step (the rest of its arguments are the
  // caller's). `timeout` is Quorum's, for the error.
  StatusOr<v1::QuorumRequest> AwaitRegistration(uint64_t last_round_id, uint64_t boundary_step,
                                                Micros deadline, Micros timeout)
      ABSL_LOCKS_EXCLUDED(mu_);
  // What a join of session `session_id` that failed with `failure` leads
  // to: the error Quorum returns, or OK to join again: at once when the
  // lighthouse no longer knows the session (the heartbeat thread registers
  // again), else after waiting `*retry` (at most until `deadline`), which
  // doubles up to kMaxRetry.
  Status AfterFailedJoin(const Status& failure, uint64_t session_id, Micros deadline, Micros* retry)
      ABSL_LOCKS_EXCLUDED(mu_);
  // One join that Interrupt() cancels, on Channel(args.include_members).
  StatusOr<QuorumResult> CallQuorum(const v1::QuorumRequest& request) ABSL_LOCKS_EXCLUDED(mu_);
  // Registers once; on success starts a new session.
  void TryRegister() ABSL_LOCKS_EXCLUDED(mu_);
  void SetFatal(const Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits on wake_ once: until notified (or woken spuriously), at most until
  // `deadline`. False, without waiting, once `deadline` has passed.
  bool WaitOnce(Micros deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Micros HeartbeatTimeout() const ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(mu_);
    return heartbeat_timeout_;
  }
  // The lighthouse answered, or a call to it failed as if it were down or
  // cut off (see lighthouse_lost()).
  void Heard() { last_heard_.store(clock_.NowMicros()); }
  void CallFailed() { last_failure_.store(clock_.NowMicros()); }

  // The heartbeat thread and its channels (learner_agent_heartbeat.cc).

  // The heartbeat thread: registers when not registered (backing off while
  // that fails), and feeds the heartbeat channel every heartbeat interval.
  void HeartbeatLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Sends the heartbeat on Channel(), after checking that the channel is
  // still acknowledged, and handles a channel that broke.
  void PumpHeartbeat() ABSL_LOCKS_EXCLUDED(mu_);
  // The channel for heartbeats and joins: the datagram link when this agent
  // speaks UDP, its lighthouse serves the channel (the link opened) and the
  // link was not given up (kMaxUdpSilences); gRPC otherwise, and always for
  // a join that wants the member list (`members`).
  ControlChannel& Channel(bool members) ABSL_LOCKS_EXCLUDED(mu_);
  // An acknowledgement of either channel: what the lighthouse says of this
  // learner and of the rounds.
  void OnAck(const HeartbeatAck& ack) ABSL_LOCKS_EXCLUDED(mu_);
  // The lighthouse stopped acknowledging datagrams: register again over gRPC
  // (it may have restarted, perhaps elsewhere); after kMaxUdpSilences in a row
  // give up on the datagram channel (e.g. a firewall drops UDP) and use gRPC.
  void OnUdpSilence(Micros silent) ABSL_LOCKS_EXCLUDED(mu_);
  // The lighthouse ended `session_id` (DatagramLink's on_session_ended).
  void OnSessionEnded(uint64_t session_id, const Status& why) ABSL_LOCKS_EXCLUDED(mu_);
  // A newer registration took this learner's id while `session_id` was the
  // current session: the learner stops with `why` (true), as it would for a
  // refused token. False for an older session (this process registered
  // again itself).
  bool StopIfSuperseded(uint64_t session_id, const Status& why) ABSL_LOCKS_EXCLUDED(mu_);
  // Opens the datagram link on the first registration that offers one.
  void MaybeOpenLink(int udp_port) ABSL_LOCKS_EXCLUDED(mu_);
  // The datagram link when this agent speaks UDP to its lighthouse, else nullptr.
  coordinator::DatagramLink* Link() ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(mu_);
    return link_disabled_ ? nullptr : link_.get();
  }

  // Constant after construction.
  const AgentOptions options_;
  const GroupStoreOpener group_store_;
  const LearnerIdentity identity_;
  const Clock& clock_;
  const std::string token_;
  const AgentSecrets secrets_;
  const std::unique_ptr<LighthouseClient> client_;

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
  bool register_now_ ABSL_GUARDED_BY(mu_) = false;
  bool interrupted_ ABSL_GUARDED_BY(mu_) = false;
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

  // The gRPC channel (over client_). Last, so that it goes first: its
  // acknowledgements call OnAck, which uses the members above.
  const std::unique_ptr<ControlChannel> grpc_;
};

}  // namespace mend
