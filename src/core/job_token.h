// The job token's rule (ReadJobToken applies it to MEND_JOB_TOKEN and
// token_file; the C ABI to a token its caller gives): 8 to 4096 printable
// ASCII characters, no spaces.
// Thread-safety: a pure function.
#pragma once

#include <string_view>

#include "mend/status.h"

namespace mend {

// INVALID_ARGUMENT naming `origin` (where the token came from) when `token`
// breaks the rule.
[[nodiscard]] Status CheckJobToken(std::string_view token, std::string_view origin);

}  // namespace mend
