#include "coordinator/event_log.h"

#include "core/status_format.h"
#include "spdlog/spdlog.h"

namespace mend::coordinator {

void EventLog::Add(Micros at, std::string kind, std::string learner_id, std::string message) {
  // (An event of the lighthouse's own names no learner.)
  const std::string who = learner_id.empty() ? kind : kind + " " + learner_id;
  if (kind == "dead" || kind == "slow" || kind == "rejected" || kind == "stalled" ||
      kind == "refused") {
    spdlog::warn("{}: {}", who, message);
  } else {
    spdlog::info("{}: {}", who, message);
  }
  events_.push_back(
      Event{next_seq_++, at, std::move(kind), std::move(learner_id), std::move(message)});
  while (events_.size() > capacity_) events_.pop_front();
}

}  // namespace mend::coordinator
