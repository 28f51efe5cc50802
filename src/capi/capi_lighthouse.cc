// The C ABI's coordinator calls: an embedded lighthouse, a remote one's
// status, and a learner group's store.
#include <memory>
#include <string>

#include "capi/capi_common.h"
#include "core/job_token.h"
#include "mend/group_store.h"
#include "mend/lighthouse.h"
#include "mend/lighthouse_client.h"
#include "mend/logging.h"

struct mend_lighthouse {
  std::unique_ptr<mend::LighthouseServer> server;
  std::string token;
  std::string address;
  std::string http_address;
};

struct mend_group_store {
  std::shared_ptr<mend::GroupStoreServer> server;
};

using mend::capi::CopyOut;
using mend::capi::Guarded;
using mend::capi::NullArgument;
using mend::capi::Return;

namespace {

mend::StatusOr<std::string> FetchStatus(const std::string& address, const std::string& token,
                                        const std::string& ca, uint32_t max_learners,
                                        uint32_t max_rounds, mend::Micros timeout) {
  MEND_ASSIGN_OR_RETURN(auto client,
                        mend::LighthouseClient::Connect({address, token, ca, timeout}));
  return client->StatusJson(max_learners, max_rounds);
}

mend_status HandStatus(const mend::StatusOr<std::string>& json, char** out) {
  if (!json.ok()) return Return(json.status());
  *out = CopyOut(*json);
  return MEND_OK;
}

}  // namespace

extern "C" {

mend_status mend_lighthouse_start(const mend_config* config, const char* token,
                                  mend_lighthouse** out) {
  return Guarded([&] {
    if (config == nullptr) return NullArgument("mend_lighthouse_start", "config");
    if (token == nullptr) return NullArgument("mend_lighthouse_start", "token");
    if (out == nullptr) return NullArgument("mend_lighthouse_start", "out");
    if (mend::Status rule = mend::CheckJobToken(token, "the caller"); !rule.ok())
      return Return(rule);
    mend::StatusOr<mend::ValidConfig> checked = mend::ValidConfig::Check(config->value);
    if (!checked.ok()) return Return(checked.status());
    if (mend::Status logging = mend::InitLogging(config->value.log_level, "lighthouse");
        !logging.ok()) {
      return Return(logging);
    }
    auto server = mend::LighthouseServer::Start(*checked, token, *mend::RealClock());
    if (!server.ok()) return Return(server.status());
    auto lighthouse = std::make_unique<mend_lighthouse>();
    lighthouse->address = (*server)->grpc_address();
    lighthouse->http_address = (*server)->http_address();
    lighthouse->server = std::move(*server);
    lighthouse->token = token;
    *out = lighthouse.release();
    return MEND_OK;
  });
}

const char* mend_lighthouse_address(const mend_lighthouse* lighthouse) {
  return lighthouse != nullptr ? lighthouse->address.c_str() : "";
}

const char* mend_lighthouse_http_address(const mend_lighthouse* lighthouse) {
  return lighthouse != nullptr ? lighthouse->http_address.c_str() : "";
}

mend_status mend_lighthouse_status_json(const mend_lighthouse* lighthouse, uint32_t max_learners,
                                        uint32_t max_rounds, char** json) {
  return Guarded([&] {
    if (lighthouse == nullptr) return NullArgument("mend_lighthouse_status_json", "lighthouse");
    if (json == nullptr) return NullArgument("mend_lighthouse_status_json", "json");
    return HandStatus(FetchStatus(lighthouse->address, lighthouse->token, "", max_learners,
                                  max_rounds, 5 * mend::kMicrosPerSecond),
                      json);
  });
}

void mend_lighthouse_stop(mend_lighthouse* lighthouse) {
  if (lighthouse == nullptr) return;
  (void)Guarded([&] {
    lighthouse->server->Shutdown();
    delete lighthouse;
    return MEND_OK;
  });
}

mend_status mend_status_json(const char* address, const char* token, const char* ca_file,
                             uint32_t max_learners, uint32_t max_rounds, int64_t timeout_ms,
                             char** json) {
  return Guarded([&] {
    if (address == nullptr) return NullArgument("mend_status_json", "address");
    if (token == nullptr) return NullArgument("mend_status_json", "token");
    if (json == nullptr) return NullArgument("mend_status_json", "json");
    if (timeout_ms <= 0) {
      return mend::capi::Fail(
          mend::InvalidArgumentError("mend_status_json: timeout_ms must be > 0"));
    }
    return HandStatus(FetchStatus(address, token, ca_file != nullptr ? ca_file : "", max_learners,
                                  max_rounds, timeout_ms * mend::kMicrosPerMilli),
                      json);
  });
}

mend_status mend_group_store_serve(const mend_config* config, const char* token,
                                   const char* address, mend_group_store** out) {
  return Guarded([&] {
    if (config == nullptr) return NullArgument("mend_group_store_serve", "config");
    if (token == nullptr) return NullArgument("mend_group_store_serve", "token");
    if (address == nullptr) return NullArgument("mend_group_store_serve", "address");
    if (out == nullptr) return NullArgument("mend_group_store_serve", "out");
    if (mend::Status logging = mend::InitLogging(config->value.log_level, "group-store");
        !logging.ok()) {
      return Return(logging);
    }
    auto server = mend::GroupStoreServer::Serve(token, address, *mend::RealClock());
    if (!server.ok()) return Return(server.status());
    *out = new mend_group_store{std::move(*server)};
    return MEND_OK;
  });
}

const char* mend_group_store_address(const mend_group_store* store) {
  return store != nullptr ? store->server->address().c_str() : "";
}

void mend_group_store_stop(mend_group_store* store) { delete store; }

}  // extern "C"
