// The store's five calls of the v1.Lighthouse gRPC service (StoreSet,
// StoreGet, StoreAdd, StoreWait, StoreDelete) over a StoreCore: each call is
// authenticated (job token, constant-time comparison), checked
// (store_checks.h), handed to the store, and answered. Waiting calls keep
// their reactor and finish later from the store's callback; they never block
// a gRPC thread, and a cancelled call withdraws its wait. The lighthouse's
// service derives from it and adds the control calls; a learner group's own
// store (StoreServer) serves it alone, and answers the other calls
// UNIMPLEMENTED.
//
// Thread-safety: gRPC calls the handlers from its own threads; the shared
// state is the StoreCore's.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "core/mutex.h"
#include "mend/status.h"
#include "mend/v1/lighthouse.grpc.pb.h"
#include "store/store_core.h"

namespace mend::store {

// absl::Status -> grpc::Status; the codes are the same numbers.
grpc::Status ToGrpcStatus(const Status& status);

// A unary call that waits in a core and is finished by the core's callback.
// OnCancel withdraws the wait. Deletes itself in OnDone.
class WaitingReactor final : public grpc::ServerUnaryReactor {
 public:
  using Cancel = std::function<void(uint64_t wait_id)>;

  // Runs `start`, which registers the wait and returns its id; the callback
  // it registered may already have finished this reactor (gRPC keeps it alive
  // until the handler returns).
  void Begin(const std::function<uint64_t()>& start, Cancel cancel);
  void OnCancel() override;
  void OnDone() override { delete this; }

 private:
  Mutex mu_;
  Cancel cancel_;
  uint64_t wait_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

class StoreService : public v1::Lighthouse::CallbackService {
 public:
  // `store` is not owned and must outlive the service and its server.
  StoreService(StoreCore* store, const std::string& token, size_t max_value_bytes);

  grpc::ServerUnaryReactor* StoreSet(grpc::CallbackServerContext* context,
                                     const v1::StoreSetRequest* request,
                                     v1::StoreSetResponse* response) final;
  grpc::ServerUnaryReactor* StoreGet(grpc::CallbackServerContext* context,
                                     const v1::StoreGetRequest* request,
                                     v1::StoreGetResponse* response) final;
  grpc::ServerUnaryReactor* StoreAdd(grpc::CallbackServerContext* context,
                                     const v1::StoreAddRequest* request,
                                     v1::StoreAddResponse* response) final;
  grpc::ServerUnaryReactor* StoreWait(grpc::CallbackServerContext* context,
                                      const v1::StoreWaitRequest* request,
                                      v1::StoreWaitResponse* response) final;
  grpc::ServerUnaryReactor* StoreDelete(grpc::CallbackServerContext* context,
                                        const v1::StoreDeleteRequest* request,
                                        v1::StoreDeleteResponse* response) final;

  // OK when `context` carries "authorization: Bearer <token>" with the job's
  // token; UNAUTHENTICATED otherwise (and the refusal is recorded).
  Status Authenticate(const grpc::CallbackServerContext& context);
  // Records a refused request and turns `status` into a gRPC status.
  grpc::Status Refuse(const grpc::CallbackServerContext& context, const Status& status);

 protected:
  // A refused call (bad token, bad request): the lighthouse keeps it in its
  // events and counters; a group's store logs it.
  virtual void Rejected(std::string_view code, std::string_view peer, std::string_view why);
  // Finishes `context`'s default reactor at once with what `body` returns.
  static grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context,
                                          const std::function<grpc::Status()>& body);

 private:
  // Waits in the store for `keys` (after `check` passed) and finishes the call.
  grpc::ServerUnaryReactor* WaitForKeys(grpc::CallbackServerContext* context, const Status& check,
                                        std::vector<std::string> keys, uint32_t timeout_ms,
                                        std::function<void(std::vector<std::string>&)> on_values);

  StoreCore* const store_;
  const size_t max_value_bytes_;
  const std::array<unsigned char, 32> token_digest_;
};

}  // namespace mend::store
