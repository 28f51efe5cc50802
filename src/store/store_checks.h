// The bounds of every store request (the lighthouse's store and a learner
// group's own): a request out of bounds gets INVALID_ARGUMENT naming the
// field, the value and the bound.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string_view>

#include "mend/status.h"
#include "mend/v1/lighthouse.pb.h"

namespace mend::store {

inline constexpr uint32_t kMaxTimeoutMs = 3'600'000;
inline constexpr int kMaxStoreWaitKeys = 1024;

// A wait of `timeout_ms` (0 only where `allow_zero`: no wait) up to kMaxTimeoutMs.
[[nodiscard]] Status CheckTimeout(uint32_t timeout_ms, std::string_view field, bool allow_zero);
// Store keys: 1..512 printable ASCII characters.
[[nodiscard]] Status CheckStoreKey(std::string_view key, std::string_view field);

[[nodiscard]] Status CheckStoreSet(const v1::StoreSetRequest& request, size_t max_value_bytes);
[[nodiscard]] Status CheckStoreGet(const v1::StoreGetRequest& request);
[[nodiscard]] Status CheckStoreAdd(const v1::StoreAddRequest& request);
[[nodiscard]] Status CheckStoreWait(const v1::StoreWaitRequest& request);
[[nodiscard]] Status CheckStoreDelete(const v1::StoreDeleteRequest& request);

}  // namespace mend::store
