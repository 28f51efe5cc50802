#include "store/store_checks.h"

#include "core/status_format.h"
#include "core/text.h"
#include "fmt/format.h"

namespace mend::store {
namespace {

constexpr size_t kMaxStoreKeyLength = 512;

Status Invalid(std::string_view field, std::string_view why) {
  return InvalidArgumentError(fmt::format("{}: {}", field, why));
}

}  // namespace

Status CheckTimeout(uint32_t timeout_ms, std::string_view field, bool allow_zero) {
  if ((timeout_ms == 0 && !allow_zero) || timeout_ms > kMaxTimeoutMs) {
    return Invalid(field, fmt::format("{} ms is outside [{}, {}]", timeout_ms, allow_zero ? 0 : 1,
                                      kMaxTimeoutMs));
  }
  return OkStatus();
}

Status CheckStoreKey(std::string_view key, std::string_view field) {
  if (key.empty()) return Invalid(field, "must not be empty");
  if (key.size() > kMaxStoreKeyLength) {
    return Invalid(
        field, fmt::format("\"{}\" is longer than {} bytes", ShowValue(key), kMaxStoreKeyLength));
  }
  for (char c : key) {
    if (c < 0x21 || c > 0x7e) {
      return Invalid(field,
                     fmt::format("\"{}\" has a byte outside printable ASCII", ShowValue(key)));
    }
  }
  return OkStatus();
}

Status CheckStoreSet(const v1::StoreSetRequest& request, size_t max_value_bytes) {
  MEND_RETURN_IF_ERROR(CheckStoreKey(request.key(), "key"));
  if (request.value().size() > max_value_bytes) {
    return Invalid("value",
                   fmt::format("{} bytes, at most {}", request.value().size(), max_value_bytes));
  }
  return OkStatus();
}

Status CheckStoreGet(const v1::StoreGetRequest& request) {
  MEND_RETURN_IF_ERROR(CheckStoreKey(request.key(), "key"));
  return CheckTimeout(request.timeout_ms(), "timeout_ms", true);
}

Status CheckStoreAdd(const v1::StoreAddRequest& request) {
  return CheckStoreKey(request.key(), "key");
}

Status CheckStoreWait(const v1::StoreWaitRequest& request) {
  if (request.keys_size() == 0 || request.keys_size() > kMaxStoreWaitKeys) {
    return Invalid("keys",
                   fmt::format("{} keys, need 1 to {}", request.keys_size(), kMaxStoreWaitKeys));
  }
  for (int i = 0; i < request.keys_size(); ++i) {
    MEND_RETURN_IF_ERROR(CheckStoreKey(request.keys(i), fmt::format("keys[{}]", i)));
  }
  return CheckTimeout(request.timeout_ms(), "timeout_ms", false);
}

Status CheckStoreDelete(const v1::StoreDeleteRequest& request) {
  return CheckStoreKey(request.key(), "key");
}

}  // namespace mend::store
