#include "mend/lighthouse_client.h"

#include <grpcpp/grpcpp.h>

#include <fstream>
#include <sstream>

#include "core/mutex.h"
#include "core/status_format.h"
#include "core/text.h"
#include "fmt/format.h"
#include "learner/control_proto.h"
#include "mend/v1/lighthouse.grpc.pb.h"
#include "wire/protocol_rules.h"

namespace mend {
namespace {

constexpr int kMaxMessageBytes = 8 << 20;
// The least time a connect attempt to the lighthouse is given (gRPC's default).
constexpr int kMinConnectMs = 20000;
// Quorum and store waits get this much beyond their own timeout before the
// client gives up on the call, so the server's answer (which says why) wins.
constexpr Micros kDeadlineMargin = 2 * kMicrosPerSecond;

Status FromGrpc(const grpc::Status& status, std::string_view call, const std::string& address) {
  if (status.ok()) return OkStatus();
  return Status(static_cast<StatusCode>(status.error_code()),
                fmt::format("lighthouse {}: {}: {}", address, call, status.error_message()));
}

std::chrono::system_clock::time_point DeadlineAfter(Micros timeout) {
  return std::chrono::system_clock::now() + std::chrono::microseconds(timeout);
}

}  // namespace

struct CallCanceller::State {
  Mutex mu;
  bool cancelled ABSL_GUARDED_BY(mu) = false;
  std::function<void()> cancel ABSL_GUARDED_BY(mu);
};

CallCanceller::CallCanceller() : state_(std::make_unique<State>()) {}
CallCanceller::~CallCanceller() = default;

void CallCanceller::Cancel() {
  MutexLock lock(state_->mu);
  state_->cancelled = true;
  // Under the lock, so the call cannot return and free what `cancel` uses.
  if (state_->cancel) state_->cancel();
  state_->cancel = nullptr;
}

bool CallCanceller::Hold(std::function<void()> cancel) {
  MutexLock lock(state_->mu);
  if (state_->cancelled) return false;
  state_->cancel = std::move(cancel);
  return true;
}

void CallCanceller::Release() {
  MutexLock lock(state_->mu);
  state_->cancel = nullptr;
}

namespace {

class HeartbeatStreamImpl final
    : public HeartbeatStream,
      public grpc::ClientBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse> {
 public:
  HeartbeatStreamImpl(v1::Lighthouse::Stub* stub, const std::string& token,
                      const std::string& address, LearnerRef learner, const Clock& clock,
                      std::function<void(const HeartbeatAck&)> on_ack)
      : address_(address), learner_(std::move(learner)), clock_(clock), on_ack_(std::move(on_ack)) {
    last_ack_at_ = clock_.NowMicros();
    context_.AddMetadata("authorization", "Bearer " + token);
    stub->async()->Heartbeat(&context_, this);
    // Send starts writes from the agent's thread, outside any reaction: the
    // hold keeps gRPC from ending the call (OnDone, which frees it) while
    // one may be starting. It goes once the stream is ending (a read or
    // write failed, or this is destroyed) and no write is in flight
    // (ReleaseIfIdle). Without it a Send racing the stream's end started a
    // write on a freed call (ASan's build aborted: a pure virtual call).
    AddHold();
    StartRead(&ack_);
    StartCall();
  }

  ~HeartbeatStreamImpl() override {
    context_.TryCancel();
    MutexLock lock(mu_);
    release_ = true;
    if (ReleaseIfIdle()) {
      lock.Unlock();
      RemoveHold();
      lock.Lock();
    }
    while (!done_) done_cv_.Wait(mu_);
  }

  void Send(v1::HeartbeatRequest update) override {
    {
      MutexLock lock(mu_);
      if (done_ || broken_ || release_) return;
      if (writing_) {
        // The queued update's step times are not in the newer one (each
        // update carries the times since the last): they are kept, the
        // newest of them up to what one heartbeat may carry.
        if (queued_ && !queued_->step_time_us().empty()) {
          std::vector<uint32_t> times(queued_->step_time_us().begin(),
                                      queued_->step_time_us().end());
          times.insert(times.end(), update.step_time_us().begin(), update.step_time_us().end());
          const size_t keep = wire::kMaxHeartbeatStepTimes;
          if (times.size() > keep) times.erase(times.begin(), times.end() - keep);
          update.mutable_step_time_us()->Assign(times.begin(), times.end());
        }
        queued_ = std::move(update);
        return;
      }
      writing_ = true;
      Fill(update);
    }
    StartWrite(&request_);
  }

  bool done() const override {
    MutexLock lock(mu_);
    return done_;
  }
  Status status() const override {
    MutexLock lock(mu_);
    return status_;
  }
  Micros last_ack_at() const override {
    MutexLock lock(mu_);
    return last_ack_at_;
  }
  void Cancel() override { context_.TryCancel(); }

  void OnWriteDone(bool ok) override {
    bool next = false;
    bool release = false;
    {
      MutexLock lock(mu_);
      if (!ok) {
        broken_ = true;
        release_ = true;
      }
      if (ok && queued_ && !release_) {
        Fill(*queued_);
        next = true;
      } else {
        writing_ = false;
      }
      queued_.reset();
      release = ReleaseIfIdle();
    }
    if (next) StartWrite(&request_);
    if (release) RemoveHold();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the stream is ending: OnDone follows once the hold is gone
      bool release = false;
      {
        MutexLock lock(mu_);
        release_ = true;
        release = ReleaseIfIdle();
      }
      if (release) RemoveHold();
      return;
    }
    {
      MutexLock lock(mu_);
      last_ack_at_ = clock_.NowMicros();
    }
    if (on_ack_) on_ack_(ack_);  // (before the next read reuses it)
    StartRead(&ack_);
  }

  void OnDone(const grpc::Status& status) override {
    MutexLock lock(mu_);
    status_ = status.ok()
                  ? UnavailableError(fmt::format("lighthouse {}: heartbeat stream ended", address_))
                  : FromGrpc(status, "Heartbeat", address_);
    done_ = true;
    done_cv_.NotifyAll();
  }

 private:
  // Whether the hold is to be removed now (by the caller, after unlocking):
  // the stream is ending and no write is in flight.
  bool ReleaseIfIdle() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!held_ || !release_ || writing_) return false;
    held_ = false;
    return true;
  }

  void Fill(const v1::HeartbeatRequest& update) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    request_ = update;
    FillLearnerRef(learner_, &request_);
  }

  const std::string address_;
  const LearnerRef learner_;
  const Clock& clock_;
  const std::function<void(const HeartbeatAck&)> on_ack_;
  grpc::ClientContext context_;
  v1::HeartbeatResponse ack_;  // owned by the read chain

  mutable Mutex mu_;
  CondVar done_cv_;
  v1::HeartbeatRequest request_;  // owned by the write in flight
  std::optional<v1::HeartbeatRequest> queued_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool held_ ABSL_GUARDED_BY(mu_) = true;  // the hold taken at the start
  // The stream is ending: the hold goes when no write is in flight.
  bool release_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  Status status_ ABSL_GUARDED_BY(mu_);
  Micros last_ack_at_ ABSL_GUARDED_BY(mu_) = 0;
};

class LighthouseClientImpl final : public LighthouseClient {
 public:
  LighthouseClientImpl(const LighthouseClientOptions& options,
                       std::shared_ptr<grpc::Channel> channel)
      : options_(options), stub_(v1::Lighthouse::NewStub(channel)) {}

  StatusOr<Registration> Register(const LearnerIdentity& identity, uint64_t step,
                                  uint64_t last_round_id) override {
    v1::RegisterRequest request;
    request.set_learner_id(identity.id);
    request.set_job_id(identity.job_id);
    request.set_rack(identity.rack);
    request.set_group_size(identity.group_size);
    request.set_address(identity.address);
    for (const std::string& address : identity.rank_addresses) request.add_rank_addresses(address);
    for (const std::string& setting : identity.job_settings) request.add_job_settings(setting);
    request.set_step(step);
    request.set_last_round_id(last_round_id);
    MEND_ASSIGN_OR_RETURN(const v1::RegisterResponse response,
                          Unary(&Stub::Register, "Register", request, options_.rpc_timeout));
    Registration registration;
    registration.session_id = response.session_id();
    registration.lighthouse_instance = response.lighthouse_instance();
    registration.heartbeat_interval = Micros{response.heartbeat_ms()} * kMicrosPerMilli;
    registration.heartbeat_timeout = Micros{response.heartbeat_timeout_ms()} * kMicrosPerMilli;
    registration.ack_interval = Micros{response.ack_interval_ms()} * kMicrosPerMilli;
    registration.udp_port = static_cast<int>(response.udp_port());
    return registration;
  }

  Status Leave(const LearnerRef& learner, const std::string& reason) override {
    v1::LeaveRequest request;
    FillLearnerRef(learner, &request);
    request.set_reason(reason);
    return Unary(&Stub::Leave, "Leave", request, options_.rpc_timeout).status();
  }

  StatusOr<QuorumResult> Quorum(const v1::QuorumRequest& request) override {
    return Unary(&Stub::Quorum, "Quorum", request, JoinTimeout(request) + kDeadlineMargin);
  }

  void QuorumAsync(const v1::QuorumRequest& request, CallCanceller& cancel,
                   std::function<void(StatusOr<QuorumResult>)> done) override {
    struct Call {
      std::unique_ptr<grpc::ClientContext> context;
      v1::QuorumRequest request;
      v1::QuorumResponse response;
    };
    // Shared with `cancel`, whose TryCancel may come after the call ended
    // (harmless then): `done` does not touch `cancel`, so it may run on any
    // thread, even inside Cancel().
    auto call = std::make_shared<Call>(
        Call{NewContext(JoinTimeout(request) + kDeadlineMargin), request, {}});
    if (!cancel.Hold([call]() { call->context->TryCancel(); })) {
      done(CancelledError(fmt::format("lighthouse {}: Quorum: cancelled", options_.address)));
      return;
    }
    stub_->async()->Quorum(
        call->context.get(), &call->request, &call->response,
        [call, done = std::move(done), address = options_.address](grpc::Status status) {
          Status result = FromGrpc(status, "Quorum", address);
          if (!result.ok()) {
            done(result);
          } else {
            done(std::move(call->response));
          }
        });
  }

  Status StoreSet(const std::string& key, const std::string& value) override {
    v1::StoreSetRequest request;
    request.set_key(key);
    request.set_value(value);
    return Unary(&Stub::StoreSet, "StoreSet", request, options_.rpc_timeout).status();
  }

  StatusOr<std::string> StoreGet(const std::string& key, Micros timeout) override {
    return CallStoreGet(key, timeout, nullptr);
  }

  StatusOr<std::string> StoreGetCancellable(const std::string& key, Micros timeout,
                                            CallCanceller& cancel) override {
    return CallStoreGet(key, timeout, &cancel);
  }

  StatusOr<int64_t> StoreAdd(const std::string& key, int64_t delta) override {
    v1::StoreAddRequest request;
    request.set_key(key);
    request.set_delta(delta);
    MEND_ASSIGN_OR_RETURN(const v1::StoreAddResponse response,
                          Unary(&Stub::StoreAdd, "StoreAdd", request, options_.rpc_timeout));
    return response.value();
  }

  Status StoreWait(const std::vector<std::string>& keys, Micros timeout) override {
    v1::StoreWaitRequest request;
    for (const auto& key : keys) request.add_keys(key);
    request.set_timeout_ms(static_cast<uint32_t>(timeout / kMicrosPerMilli));
    return Unary(&Stub::StoreWait, "StoreWait", request, timeout + kDeadlineMargin).status();
  }

  StatusOr<uint64_t> StoreDelete(const std::string& key, bool prefix) override {
    v1::StoreDeleteRequest request;
    request.set_key(key);
    request.set_prefix(prefix);
    MEND_ASSIGN_OR_RETURN(const v1::StoreDeleteResponse response,
                          Unary(&Stub::StoreDelete, "StoreDelete", request, options_.rpc_timeout));
    return response.deleted();
  }

  StatusOr<std::string> StatusJson(uint32_t max_learners, uint32_t max_rounds) override {
    v1::GetStatusRequest request;
    request.set_max_learners(max_learners);
    request.set_max_rounds(max_rounds);
    MEND_ASSIGN_OR_RETURN(const v1::GetStatusResponse response,
                          Unary(&Stub::GetStatus, "GetStatus", request, options_.rpc_timeout));
    return response.json();
  }

  std::unique_ptr<HeartbeatStream> OpenHeartbeat(
      const LearnerRef& learner, const Clock& clock,
      std::function<void(const HeartbeatAck&)> on_ack) override {
    return std::make_unique<HeartbeatStreamImpl>(stub_.get(), options_.token, options_.address,
                                                 learner, clock, std::move(on_ack));
  }

 private:
  using Stub = v1::Lighthouse::Stub;

  // One unary call of the stub's `method`, with the job token, within
  // `timeout`; its error names the call (`name`) and the lighthouse.
  template <typename Request, typename Response>
  StatusOr<Response> Unary(grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&,
                                                        Response*),
                           std::string_view name, const Request& request, Micros timeout) {
    Response response;
    auto context = NewContext(timeout);
    MEND_RETURN_IF_ERROR(FromGrpc((stub_.get()->*method)(context.get(), request, &response), name,
                                  options_.address));
    return response;
  }

  std::unique_ptr<grpc::ClientContext> NewContext(Micros timeout) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->AddMetadata("authorization", "Bearer " + options_.token);
    context->set_deadline(DeadlineAfter(timeout));
    return context;
  }

  // StoreGet, which `cancel` (when given) can end early from another thread.
  StatusOr<std::string> CallStoreGet(const std::string& key, Micros timeout,
                                     CallCanceller* cancel) {
    v1::StoreGetRequest request;
    request.set_key(key);
    request.set_timeout_ms(static_cast<uint32_t>(timeout / kMicrosPerMilli));
    v1::StoreGetResponse response;
    auto context = NewContext(timeout + kDeadlineMargin);
    grpc::ClientContext* raw = context.get();
    if (cancel != nullptr && !cancel->Hold([raw]() { raw->TryCancel(); })) {
      return CancelledError(fmt::format("lighthouse {}: StoreGet: cancelled", options_.address));
    }
    const grpc::Status result = stub_->StoreGet(raw, request, &response);
    if (cancel != nullptr) cancel->Release();
    MEND_RETURN_IF_ERROR(FromGrpc(result, "StoreGet", options_.address));
    return response.value();
  }

  const LighthouseClientOptions options_;
  std::unique_ptr<v1::Lighthouse::Stub> stub_;
};

}  // namespace

StatusOr<std::unique_ptr<LighthouseClient>> LighthouseClient::Connect(
    const LighthouseClientOptions& options) {
  MEND_RETURN_IF_ERROR(CheckHostPort(options.address, "lighthouse"));
  if (options.token.empty()) return InvalidArgumentError("no job token given to the client");
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!options.tls_ca_file.empty()) {
    std::ifstream in(options.tls_ca_file);
    if (!in) {
      return NotFoundError(
          fmt::format("tls_ca_file = \"{}\": cannot be read", options.tls_ca_file));
    }
    std::ostringstream roots;
    roots << in.rdbuf();
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = roots.str();
    credentials = grpc::SslCredentials(ssl);
  }
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(kMaxMessageBytes);
  arguments.SetMaxSendMessageSize(kMaxMessageBytes);
  // Each client gets its own connection (not the process-wide subchannel pool).
  arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  arguments.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  arguments.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  arguments.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Reconnect quickly after a lighthouse restart: a refused connect is
  // tried again after 100 ms, then at most every second. gRPC also takes
  // the minimum backoff as the least time a connect attempt is given (its
  // TCP and HTTP/2 handshakes): kept at gRPC's 20 s, so that a far link
  // (seen: 0.3 s each way) or a loaded host still connects; at 100 ms
  // every attempt gave up before the handshake's answer came back.
  arguments.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  arguments.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kMinConnectMs);
  arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  auto channel = grpc::CreateCustomChannel(options.address, credentials, arguments);
  return std::unique_ptr<LighthouseClient>(new LighthouseClientImpl(options, channel));
}

}  // namespace mend
