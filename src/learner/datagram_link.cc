#include "learner/datagram_link.h"

#include <chrono>

#include "core/status_format.h"
#include "fmt/format.h"
#include "learner/control_proto.h"

namespace mend::coordinator {

StatusOr<std::unique_ptr<DatagramLink>> DatagramLink::Open(const std::string& host, int port,
                                                           const std::string& token,
                                                           const Clock& clock, Hooks hooks,
                                                           Micros resend) {
  std::unique_ptr<DatagramLink> link(new DatagramLink(host, port, clock, std::move(hooks), resend));
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

void DatagramLink::Attach(const LearnerRef& session) {
  const uint64_t session_id = session.session_id;
  uint64_t previous = 0;
  {
    MutexLock lock(mu_);
    previous = session_id_;
    if (previous == session_id) return;  // the same session: nothing changes
    session_id_ = session_id;
    last_ack_at_ = clock_.NowMicros();
  }
  if (previous != 0) client_->Detach(previous);
  DatagramClient::Callbacks callbacks;
  callbacks.on_ack = [this](const v1::HeartbeatResponse& ack) {
    {
      MutexLock lock(mu_);
      last_ack_at_ = clock_.NowMicros();
    }
    if (hooks_.on_ack) hooks_.on_ack(ack);
  };
  callbacks.on_decision = [this](const v1::DatagramDecision& decision) {
    MutexLock lock(mu_);
    if (decision.join_id() != waiting_for_ || waiting_for_ == 0) return;  // a stale resend
    decision_ = decision;
    decided_.NotifyAll();
  };
  callbacks.on_session_ended = [this, session_id](const Status& why) {
    {
      // A join waiting on this session will never be decided: end it.
      MutexLock lock(mu_);
      if (waiting_for_ != 0 && session_id_ == session_id) {
        v1::DatagramDecision lost;
        lost.set_join_id(waiting_for_);
        lost.set_code(static_cast<uint32_t>(why.code()));
        lost.set_message(std::string(StatusMessage(why)));
        decision_ = std::move(lost);
        decided_.NotifyAll();
      }
    }
    if (hooks_.on_session_ended) hooks_.on_session_ended(session_id, why);
  };
  client_->Attach(session_id, std::move(callbacks));
}

Status DatagramLink::SendHeartbeat(const v1::HeartbeatRequest& update) {
  uint64_t session = 0;
  {
    MutexLock lock(mu_);
    session = session_id_;
  }
  if (session == 0) return OkStatus();
  v1::HeartbeatRequest body = update;
  body.clear_learner();  // the session says who
  client_->SendHeartbeats({{session, std::move(body)}});
  return OkStatus();
}

StatusOr<QuorumResult> DatagramLink::Join(const v1::QuorumRequest& request) {
  const Micros resend = resend_;
  Micros deadline = clock_.NowMicros() + JoinTimeout(request);
  v1::DatagramJoin join;
  *join.mutable_request() = request;
  join.mutable_request()->clear_learner();  // the session says who
  join.mutable_request()->set_include_members(false);
  MutexLock lock(mu_);
  join.set_join_id(next_join_id_++);
  waiting_for_ = join.join_id();
  decision_.reset();
  while (!decision_ && !interrupted_) {
    Micros now = clock_.NowMicros();
    if (now >= deadline) break;
    const auto resend_at = std::chrono::steady_clock::now() +
                           std::chrono::microseconds(std::min(resend, deadline - now));
    lock.Unlock();
    client_->SendJoins({{request.learner().session_id(), join}});
    lock.Lock();
    while (!decision_ && !interrupted_ && decided_.WaitUntil(mu_, resend_at)) {
    }
  }
  waiting_for_ = 0;
  if (interrupted_) return AbortedError("learner agent is stopping");
  if (!decision_) {
    lock.Unlock();
    return DeadlineExceededError(
        fmt::format("{}: no round decision within {} ms", Where(), request.timeout_ms()));
  }
  v1::DatagramDecision decision = std::move(*decision_);
  decision_.reset();
  lock.Unlock();
  return DecisionFromProto(decision, fmt::format("{}: Quorum", Where()));
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
