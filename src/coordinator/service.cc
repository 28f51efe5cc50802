#include "coordinator/service.h"

#include "coordinator/status_snapshot.h"
#include "coordinator/validation.h"
#include "core/mutex.h"
#include "core/status_format.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace mend::coordinator {
namespace {

constexpr size_t kDefaultStatusLearners = 200;
constexpr size_t kDefaultStatusRounds = 50;

// One learner's heartbeat stream. Reads continuously; answers when the
// learner's view changed or ack_interval passed. Deletes itself in OnDone.
class HeartbeatReactor final
    : public grpc::ServerBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse> {
 public:
  HeartbeatReactor(LighthouseService* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context), handler_(service->handler()) {
    Status auth = service_->Authenticate(*context);
    if (!auth.ok()) {
      Finish(ToGrpcStatus(auth));
      return;
    }
    counted_ = true;
    service_->HeartbeatStreamOpened();
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the learner closed its side, or the call broke
      Finish(grpc::Status::OK);
      return;
    }
    auto result = handler_.Heartbeat(request_);
    if (!result.ok()) {
      const Status& status = result.status();
      Finish(status.code() == StatusCode::kInvalidArgument ? service_->Refuse(*context_, status)
                                                           : ToGrpcStatus(status));
      return;
    }
    MaybeAnswer(*result);
    StartRead(&request_);
  }

  void OnWriteDone(bool ok) override {
    MutexLock lock(mu_);
    writing_ = false;
  }

  void OnDone() override {
    if (counted_) service_->HeartbeatStreamClosed();
    delete this;
  }

 private:
  void MaybeAnswer(const HeartbeatResult& result) {
    {
      MutexLock lock(mu_);
      if (writing_) return;  // the next heartbeat answers
      auto ack = handler_.AckDue(ack_, result);
      if (!ack) return;
      writing_ = true;
      // response_ is not touched again until OnWriteDone clears writing_.
      response_ = std::move(*ack);
    }
    StartWrite(&response_);
  }

  LighthouseService* const service_;
  grpc::CallbackServerContext* const context_;
  ControlHandler& handler_;
  bool counted_ = false;          // in the service's stream count
  v1::HeartbeatRequest request_;  // touched only by the read chain

  Mutex mu_;
  v1::HeartbeatResponse response_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  ControlHandler::AckState ack_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

LighthouseService::LighthouseService(LighthouseCore* core, const std::string& token,
                                     size_t max_value_bytes)
    : StoreService(&core->store(), token, max_value_bytes),
      core_(core),
      handler_(core),
      local_hosts_(LocalHosts()) {}

void LighthouseService::Rejected(std::string_view code, std::string_view peer,
                                 std::string_view why) {
  core_->RecordRejection(code, peer, why);
}

grpc::ServerUnaryReactor* LighthouseService::Register(grpc::CallbackServerContext* context,
                                                      const v1::RegisterRequest* request,
                                                      v1::RegisterResponse* response) {
  return Answer(context, [&]() {
    if (Status auth = Authenticate(*context); !auth.ok()) return ToGrpcStatus(auth);
    if (!ready_.load()) {
      return ToGrpcStatus(UnavailableError("the lighthouse is starting; register again"));
    }
    auto args = ParseRegister(*request);
    if (!args.ok()) return Refuse(*context, args.status());
    args->peer_host = PeerHost(context->peer(), local_hosts_);
    auto result = core_->Register(*args);
    if (!result.ok()) return Refuse(*context, result.status());
    response->set_session_id(result->session_id);
    response->set_heartbeat_ms(static_cast<uint32_t>(result->heartbeat_interval / kMicrosPerMilli));
    response->set_heartbeat_timeout_ms(
        static_cast<uint32_t>(result->heartbeat_timeout / kMicrosPerMilli));
    response->set_ack_interval_ms(static_cast<uint32_t>(result->ack_interval / kMicrosPerMilli));
    response->set_lighthouse_instance(result->lighthouse_instance);
    response->set_udp_port(static_cast<uint32_t>(udp_port_.load()));
    response->set_job_id(args->job_id.empty() ? std::string() : args->job_id);
    return grpc::Status::OK;
  });
}

void LighthouseService::HeartbeatStreamOpened() {
  size_t open = ++heartbeat_streams_;
  if (open <= kGrpcLearnersHeld || warned_.exchange(true)) return;
  spdlog::warn(
      "{} learners heartbeat over gRPC; on a 2-core lighthouse gRPC holds about {} (round "
      "decisions under 50 ms at p99), past that rounds slow down and at 10,000 heartbeat streams "
      "time out. Large jobs should set control_plane = \"udp\" (the lighthouse and its learners; "
      "docs/tuning.md)",
      open, kGrpcLearnersHeld);
}

void LighthouseService::HeartbeatStreamClosed() { --heartbeat_streams_; }

grpc::ServerBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse>* LighthouseService::Heartbeat(
    grpc::CallbackServerContext* context) {
  return new HeartbeatReactor(this, context);
}

grpc::ServerUnaryReactor* LighthouseService::Quorum(grpc::CallbackServerContext* context,
                                                    const v1::QuorumRequest* request,
                                                    v1::QuorumResponse* response) {
  auto* reactor = new store::WaitingReactor();
  if (Status auth = Authenticate(*context); !auth.ok()) {
    reactor->Finish(ToGrpcStatus(auth));
    return reactor;
  }
  ControlHandler* handler = &handler_;
  std::string learner_id = request->learner().learner_id();
  bool include_members = request->include_members();
  Status refused;
  reactor->Begin(
      [&]() -> uint64_t {
        auto waiting = handler->Quorum(
            *request, [reactor, response, include_members](StatusOr<RoundAssignment> result) {
              if (result.ok()) FillQuorumResponse(*result, include_members, response);
              reactor->Finish(ToGrpcStatus(result.status()));
            });
        if (waiting.ok()) return *waiting;
        refused = waiting.status();
        return 0;
      },
      [handler, learner_id](uint64_t wait_id) { handler->CancelQuorum(learner_id, wait_id); });
  if (!refused.ok()) reactor->Finish(Refuse(*context, refused));
  return reactor;
}

grpc::ServerUnaryReactor* LighthouseService::Leave(grpc::CallbackServerContext* context,
                                                   const v1::LeaveRequest* request,
                                                   v1::LeaveResponse* response) {
  return Answer(context, [&]() {
    if (Status auth = Authenticate(*context); !auth.ok()) return ToGrpcStatus(auth);
    if (Status check = CheckLeave(*request); !check.ok()) return Refuse(*context, check);
    return ToGrpcStatus(core_->Leave(request->learner().learner_id(),
                                     request->learner().session_id(), request->reason()));
  });
}

grpc::ServerUnaryReactor* LighthouseService::GetStatus(grpc::CallbackServerContext* context,
                                                       const v1::GetStatusRequest* request,
                                                       v1::GetStatusResponse* response) {
  return Answer(context, [&]() {
    if (Status auth = Authenticate(*context); !auth.ok()) return ToGrpcStatus(auth);
    if (Status check = CheckGetStatus(*request); !check.ok()) return Refuse(*context, check);
    size_t learners = request->max_learners() ? request->max_learners() : kDefaultStatusLearners;
    size_t rounds = request->max_rounds() ? request->max_rounds() : kDefaultStatusRounds;
    response->set_json(StatusJson(core_->Snapshot(learners, rounds)));
    return grpc::Status::OK;
  });
}

}  // namespace mend::coordinator
