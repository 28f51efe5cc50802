#include "coordinator/service.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "coordinator/status_snapshot.h"
#include "coordinator/validation.h"
#include "core/mutex.h"
#include "core/status_format.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace mend::coordinator {
namespace {

constexpr std::string_view kBearer = "Bearer ";
constexpr size_t kDefaultStatusLearners = 200;
constexpr size_t kDefaultStatusRounds = 50;

std::array<unsigned char, 32> Sha256(std::string_view data) {
  std::array<unsigned char, 32> digest{};
  unsigned int length = 0;
  EVP_Digest(data.data(), data.size(), digest.data(), &length, EVP_sha256(), nullptr);
  return digest;
}

// A unary call that waits inside the core and is finished by the core's
// callback. OnCancel withdraws the wait. Deletes itself in OnDone.
class WaitingReactor final : public grpc::ServerUnaryReactor {
 public:
  using Cancel = std::function<void(uint64_t wait_id)>;

  // Runs `start`, which registers the wait and returns its id; the callback
  // it registered may already have finished this reactor (gRPC keeps it alive
  // until the handler returns).
  void Begin(const std::function<uint64_t()>& start, Cancel cancel) {
    cancel_ = std::move(cancel);
    uint64_t id = start();
    bool cancel_now = false;
    {
      MutexLock lock(mu_);
      wait_id_ = id;
      cancel_now = cancelled_;
    }
    if (cancel_now && id != 0) cancel_(id);
  }

  void OnCancel() override {
    uint64_t id = 0;
    {
      MutexLock lock(mu_);
      cancelled_ = true;
      id = wait_id_;
    }
    if (id != 0) cancel_(id);
  }

  void OnDone() override { delete this; }

 private:
  Mutex mu_;
  Cancel cancel_;
  uint64_t wait_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

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

grpc::Status ToGrpcStatus(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message().data(), status.message().size()));
}

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
    : core_(core), max_value_bytes_(max_value_bytes), token_digest_(Sha256(token)) {}

Status LighthouseService::Authenticate(const grpc::CallbackServerContext& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  std::string_view presented;
  if (it != metadata.end()) presented = std::string_view(it->second.data(), it->second.size());
  bool well_formed = presented.substr(0, kBearer.size()) == kBearer;
  auto digest = Sha256(well_formed ? presented.substr(kBearer.size()) : std::string_view());
  if (well_formed && CRYPTO_memcmp(digest.data(), token_digest_.data(), digest.size()) == 0) {
    return OkStatus();
  }
  Status status = UnauthenticatedError(
      it == metadata.end() ? "no job token: send metadata \"authorization: Bearer <token>\""
                           : "wrong job token");
  core_->RecordRejection("UNAUTHENTICATED", context.peer(), StatusMessage(status));
  return status;
}

grpc::Status LighthouseService::Refuse(const grpc::CallbackServerContext& context,
                                       const Status& status) {
  core_->RecordRejection(absl::StatusCodeToString(status.code()), context.peer(),
                         StatusMessage(status));
  return ToGrpcStatus(status);
}

grpc::ServerUnaryReactor* LighthouseService::Answer(grpc::CallbackServerContext* context,
                                                    const std::function<grpc::Status()>& body) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(body());
  return reactor;
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
  auto* reactor = new WaitingReactor();
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

grpc::ServerUnaryReactor* LighthouseService::StoreSet(grpc::CallbackServerContext* context,
                                                      const v1::StoreSetRequest* request,
                                                      v1::StoreSetResponse* response) {
  return Answer(context, [&]() {
    if (Status auth = Authenticate(*context); !auth.ok()) return ToGrpcStatus(auth);
    if (Status check = CheckStoreSet(*request, max_value_bytes_); !check.ok()) {
      return Refuse(*context, check);
    }
    return ToGrpcStatus(core_->StoreSet(request->key(), request->value()));
  });
}

grpc::ServerUnaryReactor* LighthouseService::StoreAdd(grpc::CallbackServerContext* context,
                                                      const v1::StoreAddRequest* request,
                                                      v1::StoreAddResponse* response) {
  return Answer(context, [&]() {
    if (Status auth = Authenticate(*context); !auth.ok()) return ToGrpcStatus(auth);
    if (Status check = CheckStoreAdd(*request); !check.ok()) return Refuse(*context, check);
    auto sum = core_->StoreAdd(request->key(), request->delta());
    if (sum.ok()) response->set_value(*sum);
    return ToGrpcStatus(sum.status());
  });
}

grpc::ServerUnaryReactor* LighthouseService::StoreDelete(grpc::CallbackServerContext* context,
                                                         const v1::StoreDeleteRequest* request,
                                                         v1::StoreDeleteResponse* response) {
  return Answer(context, [&]() {
    if (Status auth = Authenticate(*context); !auth.ok()) return ToGrpcStatus(auth);
    if (Status check = CheckStoreDelete(*request); !check.ok()) return Refuse(*context, check);
    response->set_deleted(core_->StoreDelete(request->key(), request->prefix()));
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* LighthouseService::StoreGet(grpc::CallbackServerContext* context,
                                                      const v1::StoreGetRequest* request,
                                                      v1::StoreGetResponse* response) {
  Status check = Authenticate(*context);
  if (check.ok()) check = CheckStoreGet(*request);
  if (check.ok() && request->timeout_ms() == 0) {
    return Answer(context, [&]() {
      std::optional<std::string> value = core_->StoreGet(request->key());
      if (!value) {
        return ToGrpcStatus(NotFoundError(fmt::format("store has no key '{}'", request->key())));
      }
      response->set_value(std::move(*value));
      return grpc::Status::OK;
    });
  }
  return WaitForKeys(context, check, {request->key()}, request->timeout_ms(),
                     [response](std::vector<std::string>& values) {
                       response->set_value(std::move(values.at(0)));
                     });
}

grpc::ServerUnaryReactor* LighthouseService::StoreWait(grpc::CallbackServerContext* context,
                                                       const v1::StoreWaitRequest* request,
                                                       v1::StoreWaitResponse* response) {
  Status check = Authenticate(*context);
  if (check.ok()) check = CheckStoreWait(*request);
  std::vector<std::string> keys(request->keys().begin(), request->keys().end());
  return WaitForKeys(context, check, std::move(keys), request->timeout_ms(),
                     [](std::vector<std::string>&) {});
}

grpc::ServerUnaryReactor* LighthouseService::WaitForKeys(
    grpc::CallbackServerContext* context, const Status& check, std::vector<std::string> keys,
    uint32_t timeout_ms, std::function<void(std::vector<std::string>&)> on_values) {
  auto* reactor = new WaitingReactor();
  if (!check.ok()) {
    reactor->Finish(check.code() == StatusCode::kUnauthenticated ? ToGrpcStatus(check)
                                                                 : Refuse(*context, check));
    return reactor;
  }
  LighthouseCore* core = core_;
  reactor->Begin(
      [&]() {
        return core->StoreWait(std::move(keys), Micros{timeout_ms} * kMicrosPerMilli,
                               [reactor, on_values = std::move(on_values)](
                                   Status status, std::vector<std::string> values) {
                                 if (status.ok()) on_values(values);
                                 reactor->Finish(ToGrpcStatus(status));
                               });
      },
      [core](uint64_t wait_id) { core->StoreCancel(wait_id); });
  return reactor;
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
