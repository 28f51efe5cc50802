#include "mend/logging.h"

#include <map>
#include <memory>
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
  // Called again (a second runtime in one Python process, or the two ranks
  // of a learner on threads of one process, at once): the default logger is
  // replaced, never dropped, and the replaced ones stay alive until exit.
  // Another thread may be inside spdlog::info, which reads the default
  // logger by raw pointer: spdlog::drop of its name set it to null for a
  // moment (seen: a crash in logger::log_ with this = 0), and destroying it
  // would free it under that thread. One logger is kept per tag, and a tag
  // seen before gets its logger back at the new level, so that a process
  // that starts learners over and over keeps as many loggers as it had ids.
  static std::mutex* const mu = new std::mutex();  // never destroyed: used until exit
  static auto* const loggers = new std::map<std::string, std::shared_ptr<spdlog::logger>>();
  std::lock_guard lock(*mu);
  std::shared_ptr<spdlog::logger>& logger = (*loggers)[std::string(tag)];
  if (logger == nullptr) {
    logger = std::make_shared<spdlog::logger>(fmt::format("mend-{}", tag),
                                              std::make_shared<spdlog::sinks::stderr_sink_mt>());
    logger->set_pattern(fmt::format("%Y-%m-%d %H:%M:%S.%e %L {}] %v", tag));
    logger->flush_on(spdlog::level::info);
  }
  logger->set_level(parsed);
  spdlog::set_default_logger(logger);
  return OkStatus();
}

}  // namespace mend
