#include "mend/logging.h"

#include <mutex>
#include <string>

#include "core/status_format.h"
#include "fmt/format.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace mend {

Status InitLogging(std::string_view level, std::string_view tag) {
  MEND_ASSIGN_OR_RETURN(int parsed, ParseEnumText("log_level", level));
  return InitLogging(static_cast<LogLevel>(parsed), tag);
}

Status InitLogging(LogLevel level, std::string_view tag) {
  static constexpr spdlog::level::level_enum kLevels[] = {
      spdlog::level::trace, spdlog::level::debug, spdlog::level::info,
      spdlog::level::warn,  spdlog::level::err,   spdlog::level::off};
  const spdlog::level::level_enum parsed = kLevels[static_cast<int>(level)];
  // Called again (a second runtime in one Python process): replace the
  // logger. One call at a time: a group's ranks in one process start
  // together, and spdlog refuses a second logger of a name (seen: "logger
  // with name 'mend-learner-1' already exists").
  static std::mutex* const mu = new std::mutex();  // never destroyed: used until exit
  std::lock_guard lock(*mu);
  const std::string name = fmt::format("mend-{}", tag);
  spdlog::drop(name);
  auto logger = spdlog::stderr_logger_mt(name);
  logger->set_pattern(fmt::format("%Y-%m-%d %H:%M:%S.%e %L {}] %v", tag));
  logger->set_level(parsed);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  return OkStatus();
}

}  // namespace mend
