#include "learner/datagram_link.h"

#include <chrono>

#include "core/status_format.h"
#include "fmt/format.h"

namespace mend::coordinator {

StatusOr<std::unique_ptr<DatagramLink>> DatagramLink::Open(const std::string& host, int port,
                                                           const std::string& token,
                                                           const Clock& clock, Hooks hooks) {
  std::unique_ptr<DatagramLink> link(new DatagramLink(host, port, clock, std::move(hooks)));
  MEND_ASSIGN_OR_RETURN(link->client_, DatagramClient::Open(host, port, token));
  return link;
}

std::string DatagramLink::Where() const {
  return fmt::format("lighthouse {}:{} (udp)", host_, port());
}

int DatagramLink::port() const {
  MutexLock lock(mu_);
  return port_;
}

Status DatagramLink::Retarget(int port) {
  MEND_RETURN_IF_ERROR(client_->Retarget(host_, port));
  MutexLock lock(mu_);
  port_ = port;
  return OkStatus();
}

void DatagramLink::Attach(uint64_t session_id) {
  uint64_t previous = 0;
  {
    MutexLock lock(mu_);
    previous = session_id_;
    session_id_ = session_id;
    last_ack_at_ = clock_.NowMicros();
  }
  if (previous != 0) client_->Detach(previous);
  DatagramClient::Callbacks callbacks;
  callbacks.on_ack = [this](const datagram::Ack& ack) {
    {
      MutexLock lock(mu_);
      last_ack_at_ = clock_.NowMicros();
    }
    if (hooks_.on_ack) {
      hooks_.on_ack({ack.slow, ack.slow_zscore, ack.latest_round_id, ack.lighthouse_instance,
                     ack.latest_round_step, ack.short_of_quorum});
    }
  };
  callbacks.on_decision = [this](const datagram::Decision& decision) {
    MutexLock lock(mu_);
    if (decision.join_id != waiting_for_ || waiting_for_ == 0) return;  // a stale resend
    decision_ = decision;
    decided_.NotifyAll();
  };
  callbacks.on_unknown_session = [this, session_id]() {
    {
      // A join waiting on this session will never be decided: end it.
      MutexLock lock(mu_);
      if (waiting_for_ != 0 && session_id_ == session_id) {
        datagram::Decision lost;
        lost.join_id = waiting_for_;
        lost.code = static_cast<uint8_t>(StatusCode::kNotFound);
        lost.message = "the lighthouse does not know this session (restarted?); register again";
        decision_ = std::move(lost);
        decided_.NotifyAll();
      }
    }
    if (hooks_.on_unknown_session) hooks_.on_unknown_session(session_id);
  };
  client_->Attach(session_id, std::move(callbacks));
}

void DatagramLink::SendHeartbeat(const HeartbeatUpdate& update) {
  uint64_t session = 0;
  {
    MutexLock lock(mu_);
    session = session_id_;
  }
  if (session == 0) return;
  datagram::Heartbeat body;
  body.step = update.step;
  body.tokens_total = update.tokens_total;
  body.tokens_since_last_round = update.tokens_since_last_round;
  body.step_time_us = update.step_time_us;
  client_->SendHeartbeats({{session, std::move(body)}});
}

StatusOr<QuorumResult> DatagramLink::Join(const QuorumRequestArgs& args, Micros resend) {
  Micros deadline = clock_.NowMicros() + args.timeout;
  datagram::Join join;
  join.last_round_id = args.last_round_id;
  join.step = args.step;
  join.tokens_since_last_round = args.tokens_since_last_round;
  join.timeout_ms =
      static_cast<uint32_t>(std::clamp<Micros>(args.timeout / kMicrosPerMilli, 1, 3'600'000));
  MutexLock lock(mu_);
  join.join_id = next_join_id_++;
  waiting_for_ = join.join_id;
  decision_.reset();
  while (!decision_ && !interrupted_) {
    Micros now = clock_.NowMicros();
    if (now >= deadline) break;
    const auto resend_at = std::chrono::steady_clock::now() +
                           std::chrono::microseconds(std::min(resend, deadline - now));
    lock.Unlock();
    client_->SendJoins({{args.learner.session_id, join}});
    lock.Lock();
    while (!decision_ && !interrupted_ && decided_.WaitUntil(mu_, resend_at)) {
    }
  }
  waiting_for_ = 0;
  if (interrupted_) return AbortedError("learner agent is stopping");
  if (!decision_) {
    lock.Unlock();
    return DeadlineExceededError(
        fmt::format("{}: no round decision within {} ms", Where(), args.timeout / kMicrosPerMilli));
  }
  datagram::Decision decision = std::move(*decision_);
  decision_.reset();
  lock.Unlock();
  if (decision.code != 0) {
    return Status(static_cast<StatusCode>(decision.code),
                  fmt::format("{}: Quorum: {}", Where(), decision.message));
  }
  QuorumResult result;
  result.round_id = decision.round_id;
  result.rank = decision.rank;
  result.world_size = decision.world_size;
  result.total_tokens = decision.total_tokens;
  result.rendezvous_prefix = decision.rendezvous_prefix;
  result.closed_by = decision.closed_by;
  result.waited_ms = decision.waited_ms;
  result.heal_round_id = decision.heal_round_id;
  result.step = decision.step;
  if (!decision.heal_from_id.empty()) {
    RoundMember source;
    source.id = decision.heal_from_id;
    source.address = decision.heal_from_address;
    source.last_round_id = decision.heal_round_id;
    result.heal_from = std::move(source);
  }
  result.heal_to = std::move(decision.heal_to);
  return result;
}

void DatagramLink::Interrupt() {
  MutexLock lock(mu_);
  interrupted_ = true;
  decided_.NotifyAll();
}

Micros DatagramLink::last_ack_at() const {
  MutexLock lock(mu_);
  return last_ack_at_;
}

}  // namespace mend::coordinator
