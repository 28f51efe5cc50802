// Process-wide logging on spdlog: one line per event on stderr,
// "2026-11-22 10:00:00.123 I lighthouse] round 7 closed ...".
// Thread-safety: spdlog's default logger is thread-safe. InitLogging may be
// called from several threads at once (two learners of one process), also
// while others log: the default logger is replaced, never removed, and each
// one replaced stays alive until exit.
#pragma once

#include <string_view>

#include "mend/config_enums.h"
#include "mend/status.h"

namespace mend {

// Sets the default logger's level ("trace" ... "off") and the tag shown in
// front of every line (the process's role, e.g. "lighthouse" or a learner id).
[[nodiscard]] Status InitLogging(LogLevel level, std::string_view tag);
// `level` as the log_level key's text (trace | debug | info | warn | error | off).
[[nodiscard]] Status InitLogging(std::string_view level, std::string_view tag);

}  // namespace mend
