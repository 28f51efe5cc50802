// A bounded log of what happened to the job (registrations, deaths, slow
// flags...), newest last, for the status page and /status.json. Every event is
// also written to the process log.
// Thread-safety: none; LighthouseCore serializes access under its mutex.
#pragma once

#include <cstdint>
#include <deque>
#include <string>

#include "mend/clock.h"

namespace mend::coordinator {

struct Event {
  uint64_t seq = 0;
  Micros at = 0;
  std::string kind;
  std::string learner_id;
  std::string message;
};

class EventLog {
 public:
  explicit EventLog(size_t capacity) : capacity_(capacity) {}
  void Add(Micros at, std::string kind, std::string learner_id, std::string message);
  const std::deque<Event>& events() const { return events_; }
  uint64_t total() const { return next_seq_ - 1; }

 private:
  size_t capacity_;
  uint64_t next_seq_ = 1;
  std::deque<Event> events_;
};

}  // namespace mend::coordinator
