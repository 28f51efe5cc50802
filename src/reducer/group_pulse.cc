#include "reducer/group_pulse.h"

#include <algorithm>
#include <chrono>

#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace mend::reducer {
namespace {

constexpr char kDone[] = "done";

}  // namespace

PulseJudge::PulseJudge(int size, Micros silence_limit, Micros now)
    : silence_limit_(silence_limit), ranks_(static_cast<size_t>(std::max(size, 1))) {
  for (Rank& r : ranks_) r.heard_at = now;
}

void PulseJudge::Observe(int rank, const StatusOr<std::string>& value, Micros now) {
  Rank& r = ranks_[static_cast<size_t>(rank)];
  if (r.done) return;
  if (!value.ok()) {
    // A key not there (yet, or lost with a restarted store) is no beat; a
    // store that does not answer is no evidence either way.
    const StatusCode code = value.status().code();
    if (code != StatusCode::kDeadlineExceeded && code != StatusCode::kNotFound) r.heard_at = now;
    return;
  }
  if (*value == kDone) {
    r.done = true;
    return;
  }
  if (*value != r.last) {
    r.last = *value;
    r.heard_at = now;
  }
}

int PulseJudge::Silent(Micros now) const {
  for (size_t q = 1; q < ranks_.size(); ++q) {
    if (!ranks_[q].done && now - ranks_[q].heard_at > silence_limit_) return static_cast<int>(q);
  }
  return -1;
}

GroupPulse::GroupPulse(std::unique_ptr<RendezvousStore> store, std::string base, int rank, int size,
                       LearnerAgent& agent, Micros interval, Micros silence_limit)
    : store_(std::move(store)),
      base_(std::move(base)),
      rank_(rank),
      size_(size),
      agent_(agent),
      interval_(std::max<Micros>(interval, kMicrosPerMilli)),
      silence_limit_(silence_limit) {
  thread_ = std::thread([this] { rank_ == 0 ? Watch() : Beat(); });
}

GroupPulse::~GroupPulse() { Stop(/*done=*/false); }

std::string GroupPulse::Key(const std::string& base, int rank) {
  return fmt::format("{}pulse/{}", base, rank);
}

void GroupPulse::Stop(bool done) {
  {
    MutexLock lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  wake_.NotifyAll();
  if (thread_.joinable()) thread_.join();
  if (rank_ != 0 && done) (void)store_->Set(Key(base_, rank_), kDone);
}

bool GroupPulse::Pause() {
  MutexLock lock(mu_);
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(interval_);
  while (!stopping_ && wake_.WaitUntil(mu_, until)) {
  }
  return !stopping_;
}

void GroupPulse::Beat() {
  uint64_t count = 0;
  const std::string key = Key(base_, rank_);
  do {
    // A failed write is retried at the next beat; rank 0 reads a store it
    // cannot reach as no evidence.
    (void)store_->Set(key, std::to_string(++count));
  } while (Pause());
}

void GroupPulse::Watch() {
  const Clock& clock = agent_.clock();
  PulseJudge judge(size_, silence_limit_, clock.NowMicros());
  int withheld_for = -1;  // the silent rank the heartbeats are withheld for, or -1
  do {
    for (int q = 1; q < size_; ++q) {
      if (judge.done(q)) continue;
      // A key there answers at once; the wait is for one not there yet,
      // and long enough that a slow answer on a loaded machine is read.
      judge.Observe(q, store_->Get(Key(base_, q), std::max(interval_, silence_limit_ / 4)),
                    clock.NowMicros());
    }
    const int silent = judge.Silent(clock.NowMicros());
    if ((silent >= 0) != (withheld_for >= 0)) {
      if (silent >= 0) {
        spdlog::warn(
            "learner '{}': group rank {} has written no pulse for over {} ms (stopped or hung); "
            "withholding the learner's heartbeats so that the lighthouse leaves it out of rounds",
            agent_.id(), silent, silence_limit_ / kMicrosPerMilli);
      } else {
        spdlog::info("learner '{}': group rank {} beats again; heartbeats resume", agent_.id(),
                     withheld_for);
      }
      agent_.WithholdHeartbeats(silent >= 0);
    }
    withheld_for = silent;
  } while (Pause());
  if (withheld_for >= 0) agent_.WithholdHeartbeats(false);
}

}  // namespace mend::reducer
