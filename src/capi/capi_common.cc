// The C ABI's shared parts: versions, status names, the last error, logging.
#include "capi/capi_common.h"

#include "fmt/format.h"
#include "mend/logging.h"
#include "spdlog/spdlog.h"

namespace mend::capi {
namespace {

thread_local std::string last_error;

}  // namespace

mend_status Fail(const Status& status) {
  last_error = std::string(StatusMessage(status));
  if (last_error.empty()) last_error = absl::StatusCodeToString(status.code());
  return static_cast<mend_status>(status.code());
}

mend_status NullArgument(std::string_view function, std::string_view argument) {
  return Fail(InvalidArgumentError(fmt::format("{}: {} is NULL", function, argument)));
}

char* CopyOut(std::string_view text) {
  auto* copy = static_cast<char*>(std::malloc(text.size() + 1));
  if (copy == nullptr) return nullptr;
  std::memcpy(copy, text.data(), text.size());
  copy[text.size()] = '\0';
  return copy;
}

}  // namespace mend::capi

using mend::capi::Guarded;

extern "C" {

uint32_t mend_abi_version(void) { return MEND_ABI_VERSION; }

const char* mend_version(void) { return MEND_VERSION; }

const char* mend_last_error(void) { return mend::capi::last_error.c_str(); }

const char* mend_status_name(mend_status status) {
  if (status == MEND_PENDING) return "PENDING";
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  const auto index = static_cast<size_t>(status);
  return index < sizeof(kNames) / sizeof(kNames[0]) ? kNames[index] : "UNKNOWN";
}

void mend_string_free(char* text) { std::free(text); }

void mend_bytes_free(void* bytes) { std::free(bytes); }

mend_status mend_set_logging(const char* level, const char* name) {
  return Guarded([&] {
    if (level == nullptr) return mend::capi::NullArgument("mend_set_logging", "level");
    return mend::capi::Return(mend::InitLogging(level, name != nullptr ? name : "mend"));
  });
}

mend_status mend_log(const char* level, const char* message) {
  return Guarded([&] {
    if (level == nullptr) return mend::capi::NullArgument("mend_log", "level");
    if (message == nullptr) return mend::capi::NullArgument("mend_log", "message");
    const spdlog::level::level_enum parsed = spdlog::level::from_str(level);
    if (parsed == spdlog::level::off && std::string_view(level) != "off") {
      return mend::capi::Fail(mend::InvalidArgumentError(fmt::format(
          "mend_log: level \"{}\": must be one of trace | debug | info | warn | error | off",
          level)));
    }
    spdlog::log(parsed, "{}", message);
    return MEND_OK;
  });
}

}  // extern "C"
