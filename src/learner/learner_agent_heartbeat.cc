// LearnerAgentImpl's heartbeat thread, the choice of control channel
// (Channel: gRPC, or the datagram link when the agent speaks UDP to its
// lighthouse), and what the acknowledgements tell.
#include <algorithm>
#include <utility>

#include "core/status_format.h"
#include "core/text.h"
#include "learner/learner_agent_impl.h"
#include "spdlog/spdlog.h"
#include "wire/protocol_rules.h"

namespace mend {

void LearnerAgentImpl::HeartbeatLoop() {
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
    Micros now = clock_.NowMicros();
    if (!registered_ && now >= next_registration) {
      lock.Unlock();
      grpc_->Restart();
      TryRegister();
      lock.Lock();
      if (!registered_) {
        next_registration = clock_.NowMicros() + retry;
        retry = std::min(retry * 2, kMaxRetry);
      } else {
        retry = kMinRetry;
      }
    }
    if (registered_) {
      lock.Unlock();
      PumpHeartbeat();
      lock.Lock();
    }
    const Micros next_beat = clock_.NowMicros() + heartbeat_interval_;
    while (!stopping_ && !register_now_ && WaitOnce(next_beat)) {
    }
  }
}

ControlChannel& LearnerAgentImpl::Channel(bool members) {
  if (coordinator::DatagramLink* link = Link(); link && !members) return *link;
  return *grpc_;
}

void LearnerAgentImpl::PumpHeartbeat() {
  v1::HeartbeatRequest update;
  Micros ack_timeout = 0;
  Micros resumed_at = 0;
  {
    MutexLock lock(mu_);
    if (!registered_ || withhold_) return;
    ack_timeout = heartbeat_timeout_;
    resumed_at = resumed_at_;
    update.set_step(step_);
    update.set_tokens_total(tokens_total_);
    update.set_tokens_since_last_round(tokens_since_round_);
    update.mutable_step_time_us()->Assign(step_times_.begin(), step_times_.end());
    step_times_.clear();
  }
  ControlChannel& channel = Channel(/*members=*/false);
  const bool datagrams = &channel != grpc_.get();
  // No acknowledgement is due for heartbeats withheld (WithholdHeartbeats).
  const Micros silent = clock_.NowMicros() - std::max(channel.last_ack_at(), resumed_at);
  if (silent > ack_timeout) {
    if (datagrams) {
      OnUdpSilence(silent);
      return;
    }
    spdlog::warn("lighthouse {} has not acknowledged heartbeats for {} ms; reconnecting",
                 options_.lighthouse, silent / kMicrosPerMilli);
    channel.Restart();
  }
  Status sent = channel.SendHeartbeat(update);
  if (sent.ok()) return;
  // The heartbeat stream ended.
  if (IsFatal(sent.code())) {
    SetFatal(sent);
    return;
  }
  if (wire::Superseded(sent.code())) {
    // (The stream belongs to the current session: Attach replaces it.)
    uint64_t session_id = 0;
    {
      MutexLock lock(mu_);
      session_id = session_.session_id;
    }
    StopIfSuperseded(session_id, sent);
    return;
  }
  if (wire::NeedsRegistration(sent.code())) {
    spdlog::warn("{}; registering again", sent.message());
    MutexLock lock(mu_);
    registered_ = false;
    register_now_ = true;
    return;
  }
  CallFailed();
  spdlog::debug("heartbeat stream ended: {}", sent.message());
  (void)channel.SendHeartbeat(update);  // on a new stream
}

void LearnerAgentImpl::OnAck(const HeartbeatAck& ack) {
  Heard();
  {
    MutexLock lock(mu_);
    udp_silences_ = 0;
  }
  if (ack.slow() != slow_.load()) {
    spdlog::info("lighthouse {} this learner as fail-slow (z = {:.1f})",
                 ack.slow() ? "flagged" : "cleared", ack.slow_zscore());
  }
  slow_ = ack.slow();
  zscore_ = ack.slow_zscore();
  RaiseTo(latest_round_id_, ack.latest_round_id());
  RaiseTo(latest_round_step_, ack.latest_round_step());
  if (!ack.short_of_quorum()) {
    short_of_quorum_since_.store(0);
  } else {
    Micros unset = 0;  // (kept from the first such acknowledgement)
    short_of_quorum_since_.compare_exchange_strong(unset, clock_.NowMicros());
  }
}

void LearnerAgentImpl::OnUdpSilence(Micros silent) {
  MutexLock lock(mu_);
  if (++udp_silences_ >= kMaxUdpSilences) {
    spdlog::warn("lighthouse {} acknowledged no datagram {} times in a row; using gRPC",
                 options_.lighthouse, udp_silences_);
    link_disabled_ = true;
  } else {
    spdlog::warn("lighthouse {} has not acknowledged heartbeats for {} ms; registering again",
                 options_.lighthouse, silent / kMicrosPerMilli);
  }
  registered_ = false;
  register_now_ = true;
  wake_.NotifyAll();
}

void LearnerAgentImpl::OnSessionEnded(uint64_t session_id, const Status& why) {
  if (wire::Superseded(why.code())) {
    StopIfSuperseded(session_id, why);
    return;
  }
  MutexLock lock(mu_);
  if (registered_ && session_.session_id == session_id) {
    spdlog::warn("lighthouse {} does not know this learner's session; registering again",
                 options_.lighthouse);
    registered_ = false;
    register_now_ = true;
    wake_.NotifyAll();
  }
}

void LearnerAgentImpl::MaybeOpenLink(int udp_port) {
  if (options_.control_plane != ControlPlane::kUdp) return;
  if (udp_port <= 0) {
    spdlog::warn(
        "control_plane = udp, but lighthouse {} serves no datagram channel; "
        "using gRPC",
        options_.lighthouse);
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
  hooks.on_session_ended = [this](uint64_t session, const Status& why) {
    OnSessionEnded(session, why);
  };
  auto link = coordinator::DatagramLink::Open(SplitHostPort(options_.lighthouse).first, udp_port,
                                              token_, clock_, std::move(hooks), kJoinResend);
  if (!link.ok()) {
    spdlog::warn("cannot open the datagram channel, using gRPC: {}", link.status().message());
    return;
  }
  link_ = std::move(*link);
}

}  // namespace mend
