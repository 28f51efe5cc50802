#include "store/store_service.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "core/status_format.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"
#include "store/store_checks.h"

namespace mend::store {
namespace {

constexpr std::string_view kBearer = "Bearer ";

std::array<unsigned char, 32> Sha256(std::string_view data) {
  std::array<unsigned char, 32> digest{};
  unsigned int length = 0;
  EVP_Digest(data.data(), data.size(), digest.data(), &length, EVP_sha256(), nullptr);
  return digest;
}

}  // namespace

grpc::Status ToGrpcStatus(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message().data(), status.message().size()));
}

void WaitingReactor::Begin(const std::function<uint64_t()>& start, Cancel cancel) {
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

void WaitingReactor::OnCancel() {
  uint64_t id = 0;
  {
    MutexLock lock(mu_);
    cancelled_ = true;
    id = wait_id_;
  }
  if (id != 0) cancel_(id);
}

StoreService::StoreService(StoreCore* store, const std::string& token, size_t max_value_bytes)
    : store_(store), max_value_bytes_(max_value_bytes), token_digest_(Sha256(token)) {}

Status StoreService::Authenticate(const grpc::CallbackServerContext& context) {
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
  Rejected("UNAUTHENTICATED", context.peer(), StatusMessage(status));
  return status;
}

grpc::Status StoreService::Refuse(const grpc::CallbackServerContext& context,
                                  const Status& status) {
  Rejected(absl::StatusCodeToString(status.code()), context.peer(), StatusMessage(status));
  return ToGrpcStatus(status);
}

void StoreService::Rejected(std::string_view code, std::string_view peer, std::string_view why) {
  spdlog::warn("store: refused a call from {}: {} {}", peer, code, why);
}

grpc::ServerUnaryReactor* StoreService::Answer(grpc::CallbackServerContext* context,
                                               const std::function<grpc::Status()>& body) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(body());
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::StoreSet(grpc::CallbackServerContext* context,
                                                 const v1::StoreSetRequest* request,
                                                 v1::StoreSetResponse* /*response*/) {
  return Answer(context, [&]() {
    if (Status auth = Authenticate(*context); !auth.ok()) return ToGrpcStatus(auth);
    if (Status check = CheckStoreSet(*request, max_value_bytes_); !check.ok()) {
      return Refuse(*context, check);
    }
    return ToGrpcStatus(store_->Set(request->key(), request->value()));
  });
}

grpc::ServerUnaryReactor* StoreService::StoreAdd(grpc::CallbackServerContext* context,
                                                 const v1::StoreAddRequest* request,
                                                 v1::StoreAddResponse* response) {
  return Answer(context, [&]() {
    if (Status auth = Authenticate(*context); !auth.ok()) return ToGrpcStatus(auth);
    if (Status check = CheckStoreAdd(*request); !check.ok()) return Refuse(*context, check);
    auto sum = store_->Add(request->key(), request->delta());
    if (sum.ok()) response->set_value(*sum);
    return ToGrpcStatus(sum.status());
  });
}

grpc::ServerUnaryReactor* StoreService::StoreDelete(grpc::CallbackServerContext* context,
                                                    const v1::StoreDeleteRequest* request,
                                                    v1::StoreDeleteResponse* response) {
  return Answer(context, [&]() {
    if (Status auth = Authenticate(*context); !auth.ok()) return ToGrpcStatus(auth);
    if (Status check = CheckStoreDelete(*request); !check.ok()) return Refuse(*context, check);
    response->set_deleted(store_->Delete(request->key(), request->prefix()));
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* StoreService::StoreGet(grpc::CallbackServerContext* context,
                                                 const v1::StoreGetRequest* request,
                                                 v1::StoreGetResponse* response) {
  Status check = Authenticate(*context);
  if (check.ok()) check = CheckStoreGet(*request);
  if (check.ok() && request->timeout_ms() == 0) {
    return Answer(context, [&]() {
      std::optional<std::string> value = store_->Get(request->key());
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

grpc::ServerUnaryReactor* StoreService::StoreWait(grpc::CallbackServerContext* context,
                                                  const v1::StoreWaitRequest* request,
                                                  v1::StoreWaitResponse* /*response*/) {
  Status check = Authenticate(*context);
  if (check.ok()) check = CheckStoreWait(*request);
  std::vector<std::string> keys(request->keys().begin(), request->keys().end());
  return WaitForKeys(context, check, std::move(keys), request->timeout_ms(),
                     [](std::vector<std::string>&) {});
}

grpc::ServerUnaryReactor* StoreService::WaitForKeys(
    grpc::CallbackServerContext* context, const Status& check, std::vector<std::string> keys,
    uint32_t timeout_ms, std::function<void(std::vector<std::string>&)> on_values) {
  auto* reactor = new WaitingReactor();
  if (!check.ok()) {
    reactor->Finish(check.code() == StatusCode::kUnauthenticated ? ToGrpcStatus(check)
                                                                 : Refuse(*context, check));
    return reactor;
  }
  StoreCore* store = store_;
  reactor->Begin(
      [&]() {
        return store->Wait(std::move(keys), Micros{timeout_ms} * kMicrosPerMilli,
                           [reactor, on_values = std::move(on_values)](
                               Status status, std::vector<std::string> values) {
                             if (status.ok()) on_values(values);
                             reactor->Finish(ToGrpcStatus(status));
                           });
      },
      [store](uint64_t wait_id) { store->Cancel(wait_id); });
  return reactor;
}

}  // namespace mend::store
