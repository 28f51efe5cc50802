// LearnerAgent::Start, and LearnerAgentImpl's registration and joins (its
// heartbeat thread is in learner_agent_heartbeat.cc).
#include "mend/learner_agent.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "core/status_format.h"
#include "fmt/format.h"
#include "learner/control_proto.h"
#include "learner/group_ranks.h"
#include "learner/learner_agent_impl.h"
#include "learner/lighthouse_rendezvous.h"
#include "spdlog/spdlog.h"
#include "wire/protocol_rules.h"

namespace mend {

LearnerAgentImpl::LearnerAgentImpl(const AgentOptions& options, const std::string& token,
                                   const LearnerIdentity& identity, const Clock& clock,
                                   std::unique_ptr<LighthouseClient> client,
                                   GroupStoreOpener group_store)
    : options_(options),
      group_store_(std::move(group_store)),
      identity_(identity),
      clock_(clock),
      token_(token),
      secrets_(AgentSecrets::Of(options, token)),
      client_(std::move(client)),
      heartbeat_interval_(options.heartbeat_ms * kMicrosPerMilli),
      heartbeat_timeout_(options.heartbeat_timeout_ms * kMicrosPerMilli),
      grpc_(NewGrpcControlChannel(*client_, clock_,
                                  [this](const HeartbeatAck& ack) { OnAck(ack); })) {}

Status LearnerAgentImpl::FirstRegistration(Micros wait) {
  TryRegister();
  {
    MutexLock lock(mu_);
    if (!fatal_.ok()) return fatal_;
    thread_ = std::thread([this]() { HeartbeatLoop(); });
    const Micros deadline = clock_.NowMicros() + wait;
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
      identity_.id, options_.lighthouse, wait / kMicrosPerMilli, register_attempts_,
      last_register_error_));
}

void LearnerAgentImpl::RecordStep(uint64_t step, uint64_t tokens, Micros step_time) {
  MutexLock lock(mu_);
  step_ = std::max(step_, step);
  tokens_total_ += tokens;
  tokens_since_round_ += tokens;
  if (step_times_.size() >= kMaxBufferedStepTimes) step_times_.erase(step_times_.begin());
  step_times_.push_back(static_cast<uint32_t>(std::clamp<Micros>(step_time, 1, 3'600'000'000)));
}

StatusOr<QuorumResult> LearnerAgentImpl::Quorum(uint64_t last_round_id,
                                                uint64_t tokens_since_last_round, Micros timeout,
                                                bool include_members, uint64_t boundary_step) {
  const Micros deadline = clock_.NowMicros() + timeout;
  // Lost for longer than this join's timeout (a join before it waited that
  // long for the lighthouse): no round can form before it answers again, so
  // the join fails at once and the learner trains on, instead of waiting
  // out the quorum timeout at every boundary of a job whose lighthouse is
  // gone for good.
  if (const Micros silent = clock_.NowMicros() - last_heard_.load();
      lighthouse_lost() && silent > timeout) {
    return UnavailableError(fmt::format(
        "lighthouse {} has answered nothing for {} s, longer than the quorum timeout ({} ms): "
        "no round can form before it is back; training on, joining again once it answers",
        options_.lighthouse, silent / kMicrosPerSecond, timeout / kMicrosPerMilli));
  }
  Micros retry = kMinRetry;
  while (true) {
    MEND_ASSIGN_OR_RETURN(v1::QuorumRequest request,
                          AwaitRegistration(last_round_id, boundary_step, deadline, timeout));
    request.set_last_round_id(last_round_id);
    request.set_tokens_since_last_round(tokens_since_last_round);
    request.set_include_members(include_members);
    // A synchronous learner's join gives up when the job is short of a quorum.
    request.set_give_up_short_of_quorum(!options_.concurrent_outer_step);
    const Micros left = deadline - clock_.NowMicros();
    if (left <= 0) {
      return DeadlineExceededError(fmt::format("learner '{}': quorum timeout of {} ms passed",
                                               identity_.id, timeout / kMicrosPerMilli));
    }
    SetJoinTimeout(request, left);
    StatusOr<QuorumResult> result = CallQuorum(request);
    if (result.ok()) {
      Heard();
      MutexLock lock(mu_);
      RaiseTo(latest_round_id_, result->round_id());
      tokens_since_round_ = 0;
      return result;
    }
    MEND_RETURN_IF_ERROR(
        AfterFailedJoin(result.status(), request.learner().session_id(), deadline, &retry));
  }
}

StatusOr<v1::QuorumRequest> LearnerAgentImpl::AwaitRegistration(uint64_t last_round_id,
                                                                uint64_t boundary_step,
                                                                Micros deadline, Micros timeout) {
  MutexLock lock(mu_);
  last_round_id_ = last_round_id;
  while (!registered_ && fatal_.ok() && !stopping_ && !interrupted_ && WaitOnce(deadline)) {
  }
  if (!fatal_.ok()) return fatal_;
  if (stopping_ || interrupted_) return AbortedError("learner agent is stopping");
  if (!registered_) {
    return DeadlineExceededError(
        fmt::format("learner '{}': not registered with lighthouse {} within {} ms", identity_.id,
                    options_.lighthouse, timeout / kMicrosPerMilli));
  }
  v1::QuorumRequest request;
  FillLearnerRef(session_, &request);
  request.set_step(boundary_step > 0 ? boundary_step : step_);
  short_of_quorum_since_.store(0);  // news of the join before this one
  return request;
}

Status LearnerAgentImpl::AfterFailedJoin(const Status& failure, uint64_t session_id,
                                         Micros deadline, Micros* retry) {
  const StatusCode code = failure.code();
  if (code == StatusCode::kDeadlineExceeded) return failure;
  if (IsFatal(code)) {
    SetFatal(failure);
    return failure;
  }
  if (wire::Superseded(code)) {
    if (StopIfSuperseded(session_id, failure)) return fatal_status();
    return OkStatus();  // an older session's call: join under the current one
  }
  MutexLock lock(mu_);
  if (wire::NeedsRegistration(code)) {
    if (registered_ && session_.session_id == session_id) {
      spdlog::warn("{}; registering again", failure.message());
      registered_ = false;
      register_now_ = true;
      wake_.NotifyAll();
    }
    return OkStatus();
  }
  // UNAVAILABLE (lighthouse down or restarting), ABORTED (declared dead
  // while stopped, or membership changed), CANCELLED (server shutdown):
  // try again until the deadline.
  if (code != StatusCode::kAborted) CallFailed();
  spdlog::debug("quorum call failed, retrying: {}", failure.message());
  const Micros retry_at = std::min(deadline, clock_.NowMicros() + *retry);
  while (!stopping_ && !interrupted_ && WaitOnce(retry_at)) {
  }
  *retry = std::min(*retry * 2, kMaxRetry);
  return OkStatus();
}

void LearnerAgentImpl::Interrupt() {
  {
    MutexLock lock(mu_);
    interrupted_ = true;
    wake_.NotifyAll();
  }
  grpc_->Interrupt();
  if (coordinator::DatagramLink* link = Link()) link->Interrupt();
}

Status LearnerAgentImpl::Leave(const std::string& reason) {
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

void LearnerAgentImpl::WithholdHeartbeats(bool withhold) {
  MutexLock lock(mu_);
  if (withhold_ && !withhold) resumed_at_ = clock_.NowMicros();
  withhold_ = withhold;
}

void LearnerAgentImpl::Stop() {
  Interrupt();
  {
    MutexLock lock(mu_);
    stopping_ = true;
    wake_.NotifyAll();
  }
  if (thread_.joinable()) thread_.join();
  grpc_->Restart();  // closes the heartbeat stream
}

bool LearnerAgentImpl::lighthouse_lost() const {
  const Micros timeout = HeartbeatTimeout();
  // A silence alone is not enough: a learner resumed after SIGSTOP has
  // heard nothing for as long, though its lighthouse is fine.
  const Micros heard = last_heard_.load();
  return heard != 0 && last_failure_.load() > heard && clock_.NowMicros() - heard > timeout;
}

bool LearnerAgentImpl::short_of_quorum() const {
  const Micros timeout = HeartbeatTimeout();
  // For a heartbeat timeout on end: an acknowledgement sent before the
  // latest join formed a round may arrive after it (see OnAck).
  const Micros since = short_of_quorum_since_.load();
  return since != 0 && clock_.NowMicros() - since >= timeout;
}

StatusOr<QuorumResult> LearnerAgentImpl::CallQuorum(const v1::QuorumRequest& request) {
  return Channel(request.include_members()).Join(request);
}

bool LearnerAgentImpl::WaitOnce(Micros deadline) {
  Micros remaining = deadline - clock_.NowMicros();
  if (remaining <= 0) return false;
  wake_.WaitFor(mu_, std::chrono::microseconds(remaining));
  return true;
}

bool LearnerAgentImpl::StopIfSuperseded(uint64_t session_id, const Status& why) {
  {
    MutexLock lock(mu_);
    if (!registered_ || session_.session_id != session_id) return false;
  }
  SetFatal(AlreadyExistsError(
      fmt::format("{}; this process stops (give every learner its own id)", why.message())));
  return true;
}

void LearnerAgentImpl::SetFatal(const Status& status) {
  MutexLock lock(mu_);
  if (fatal_.ok()) {
    spdlog::error("learner '{}' refused by the lighthouse: {}", identity_.id, status.message());
    fatal_ = status;
  }
  wake_.NotifyAll();
}

void LearnerAgentImpl::TryRegister() {
  uint64_t step = 0;
  uint64_t last_round = 0;
  {
    MutexLock lock(mu_);
    step = step_;
    last_round = last_round_id_;
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
      spdlog::warn("cannot register with the lighthouse yet: {}", registration.status().message());
    }
    return;
  }
  Heard();
  MutexLock lock(mu_);
  if (lighthouse_instance_ != 0 && lighthouse_instance_ != registration->lighthouse_instance) {
    spdlog::info("lighthouse {} restarted; registered again", options_.lighthouse);
  }
  lighthouse_instance_ = registration->lighthouse_instance;
  if (registration->heartbeat_interval > 0) heartbeat_interval_ = registration->heartbeat_interval;
  if (registration->heartbeat_timeout > 0) heartbeat_timeout_ = registration->heartbeat_timeout;
  session_ = LearnerRef{identity_.id, registration->session_id};
  registered_ = true;
  registrations_++;
  const LearnerRef session = session_;
  wake_.NotifyAll();
  lock.Unlock();
  grpc_->Attach(session);  // a new stream for every registration
  MaybeOpenLink(registration->udp_port);
  if (coordinator::DatagramLink* link = Link()) link->Attach(session);
}

std::string GroupStorePrefix(const AgentOptions& options, const std::string& learner_id) {
  const char* restarts = std::getenv("TORCHELASTIC_RESTART_COUNT");
  return fmt::format("{}/group/{}/{}.{}/", options.job_id, learner_id, options.group_generation,
                     restarts != nullptr && *restarts != '\0' ? restarts : "0");
}

LighthouseClientOptions LighthouseClientOptionsFor(const AgentOptions& options,
                                                   const std::string& token) {
  return {options.lighthouse, token, options.tls_ca_file, options.rpc_timeout_ms * kMicrosPerMilli};
}

StatusOr<std::unique_ptr<LearnerAgent>> LearnerAgent::Start(const AgentOptions& options,
                                                            const std::string& token,
                                                            const LearnerIdentity& identity,
                                                            const Clock& clock,
                                                            GroupStoreOpener group_store) {
  MEND_ASSIGN_OR_RETURN(auto client,
                        LighthouseClient::Connect(LighthouseClientOptionsFor(options, token)));
  LearnerIdentity full = identity;
  if (full.job_id.empty()) full.job_id = options.job_id;
  if (full.rack.empty()) full.rack = options.rack;
  full.group_size = static_cast<uint32_t>(options.group_size);
  if (full.job_settings.empty()) full.job_settings = options.job_settings;
  if (options.group_size > 1) {
    // Where the ranks tell why they could not start: what this rank told at
    // an earlier start of its group is not news.
    LighthouseRendezvousStore told(*client, clock);
    ForgetToldFailure(told, options, full.id);
    MEND_ASSIGN_OR_RETURN(std::unique_ptr<RendezvousStore> store,
                          OpenGroupOrLighthouseStore(group_store, *client, clock));
    // Rank 0 registers every rank's data-plane host, once all have started.
    MEND_ASSIGN_OR_RETURN(
        full.rank_addresses,
        ShareWithGroupRanks(*store, &told, clock, options, full.id,
                            GroupStorePrefix(options, full.id) + "address/", options.dataplane_host,
                            /*only_rank0_waits=*/true, "'s data-plane address did not come"));
  } else {
    full.rank_addresses = {options.dataplane_host};
  }
  if (options.group_rank > 0) {
    return NewGroupRankAgent(full.id, options, token, clock, std::move(client),
                             std::move(group_store));
  }
  auto agent = std::make_unique<LearnerAgentImpl>(options, token, full, clock, std::move(client),
                                                  std::move(group_store));
  MEND_RETURN_IF_ERROR(agent->FirstRegistration(options.lighthouse_wait_ms * kMicrosPerMilli));
  spdlog::info("learner '{}': data plane {}", full.id,
               options.dataplane_encrypt ? "secure (AES-256-GCM, keys from the job token)"
                                         : "in the clear (dataplane_encrypt = false)");
  return std::unique_ptr<LearnerAgent>(std::move(agent));
}

}  // namespace mend
