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

void FillMember(const MemberInfo& member, v1::Member* out) {
  out->set_learner_id(member.id);
  out->set_step(member.step);
  out->set_tokens_since_last_round(member.tokens_since_last_round);
  out->set_last_round_id(member.last_round_id);
  out->set_heal_from(member.heal_from);
  out->set_rack(member.rack);
  out->set_address(member.address);
}

constexpr size_t kMaxMembersInReply = 1024;

// One learner's heartbeat stream. Reads continuously; answers when the
// learner's view changed or ack_interval passed. Deletes itself in OnDone.
class HeartbeatReactor final
    : public grpc::ServerBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse> {
 public:
  HeartbeatReactor(LighthouseService* service, grpc::CallbackServerContext* context)
      : service_(service),
        context_(context),
        clock_(service->core()->clock()),
        ack_interval_(service->core()->options().ack_interval) {
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
    auto args = ParseHeartbeat(request_);
    if (!args.ok()) {
      Finish(service_->Refuse(*context_, args.status()));
      return;
    }
    auto result = service_->core()->Heartbeat(*args);
    if (!result.ok()) {
      Finish(ToGrpcStatus(result.status()));
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
    Micros now = clock_->NowMicros();
    {
      MutexLock lock(mu_);
      // Answered at once: a slow-flag change, and a round that closed while
      // this learner waits (see DatagramServer).
      bool changed = result.slow != response_.slow() ||
                     (result.waiting && result.latest_round_id != response_.latest_round_id()) ||
                     result.short_of_quorum != response_.short_of_quorum();
      bool due = now - last_write_at_ >= ack_interval_;
      if (writing_ || !(changed || due || first_)) return;
      first_ = false;
      writing_ = true;
      last_write_at_ = now;
      // response_ is not touched again until OnWriteDone clears writing_.
      response_.set_slow(result.slow);
      response_.set_slow_zscore(result.slow_zscore);
      response_.set_latest_round_id(result.latest_round_id);
      response_.set_latest_round_step(result.latest_round_step);
      response_.set_short_of_quorum(result.short_of_quorum);
      response_.set_lighthouse_instance(service_->core()->instance_id());
    }
    StartWrite(&response_);
  }

  LighthouseService* const service_;
  grpc::CallbackServerContext* const context_;
  const Clock* const clock_;
  const Micros ack_interval_;
  bool counted_ = false;          // in the service's stream count
  v1::HeartbeatRequest request_;  // touched only by the read chain

  Mutex mu_;
  v1::HeartbeatResponse response_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool first_ ABSL_GUARDED_BY(mu_) = true;
  Micros last_write_at_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

void FillQuorumResponse(const RoundAssignment& assignment, bool include_members,
                        v1::QuorumResponse* response) {
  const Round& round = *assignment.round;
  const MemberInfo& me = round.members[assignment.rank];
  response->set_round_id(round.id);
  response->set_rank(assignment.rank);
  response->set_world_size(static_cast<uint32_t>(round.members.size()));
  response->set_total_tokens(round.total_tokens);
  response->set_rendezvous_prefix(round.rendezvous_prefix);
  response->set_closed_by(round.closed_by);
  response->set_waited_ms(static_cast<uint32_t>(round.waited() / kMicrosPerMilli));
  response->set_heal_round_id(round.heal_round_id);
  response->set_step(round.step);
  if (const MemberInfo* source = FindMember(round, me.heal_from)) {
    FillMember(*source, response->mutable_heal_from());
  }
  if (auto it = round.heal_to.find(me.id); it != round.heal_to.end()) {
    for (const std::string& id : it->second) response->add_heal_to(id);
  }
  if (include_members && round.members.size() <= kMaxMembersInReply) {
    for (const MemberInfo& member : round.members) FillMember(member, response->add_members());
  }
}

LighthouseService::LighthouseService(LighthouseCore* core, const std::string& token,
                                     size_t max_value_bytes)
    : StoreService(&core->store(), token, max_value_bytes), core_(core) {}

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
      "time out. Learners of large jobs should set control_transport = \"udp\" (served on the "
      "lighthouse's bind port; docs/tuning.md)",
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
  auto args = ParseQuorum(*request);
  if (!args.ok()) {
    reactor->Finish(Refuse(*context, args.status()));
    return reactor;
  }
  LighthouseCore* core = core_;
  std::string learner_id = args->learner_id;
  reactor->Begin(
      [&]() {
        bool include_members = request->include_members();
        return core->Quorum(*args,
                            [reactor, response, include_members](StatusOr<RoundAssignment> result) {
                              if (result.ok())
                                FillQuorumResponse(*result, include_members, response);
                              reactor->Finish(ToGrpcStatus(result.status()));
                            });
      },
      [core, learner_id](uint64_t wait_id) { core->CancelQuorum(learner_id, wait_id); });
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
