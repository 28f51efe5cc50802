// What the C ABI's translation units share: turning a Status into a
// mend_status with the thread's last error message, copying strings out, and
// catching C++ exceptions at the boundary (none may cross into C).
#pragma once

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "mend/config.h"
#include "mend/mend.h"
#include "mend/status.h"

// The configuration behind a mend_config handle.
struct mend_config {
  mend::Config value;
  // mend_config_add_job_setting's, as "key=value", sent at registration.
  std::vector<std::string> job_settings;
};

namespace mend::capi {

// Records `status`'s message as the thread's last error; returns its code.
mend_status Fail(const Status& status);
inline mend_status Return(const Status& status) { return status.ok() ? MEND_OK : Fail(status); }
// INVALID_ARGUMENT naming a null argument of `function`.
mend_status NullArgument(std::string_view function, std::string_view argument);

// A malloc'ed copy of `text` for a `char**` result (freed by mend_string_free).
char* CopyOut(std::string_view text);

// Runs `body` (returning mend_status); an exception becomes INTERNAL.
template <typename Body>
mend_status Guarded(Body&& body) noexcept {
  try {
    return body();
  } catch (const std::exception& error) {
    return Fail(InternalError(std::string("mend: unexpected C++ exception: ") + error.what()));
  } catch (...) {
    return Fail(InternalError("mend: unexpected C++ exception"));
  }
}

}  // namespace mend::capi
