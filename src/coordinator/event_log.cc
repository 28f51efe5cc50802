#include "coordinator/event_log.h"

#include "core/status_format.h"
#include "spdlog/spdlog.h"

namespace mend::coordinator {

void EventLog::Add(Micros at, std::string kind, std::string learner_id, std::string message) {
  if (kind == "dead" || kind == "slow" || kind == "rejected") {
    spdlog::warn("{} {}: {}", kind, learner_id, message);
  } else {
    spdlog::info("{} {}: {}", kind, learner_id, message);
  }
  events_.push_back(
      Event{next_seq_++, at, std::move(kind), std::move(learner_id), std::move(message)});
  while (events_.size() > capacity_) events_.pop_front();
}

}  // namespace mend::coordinator
