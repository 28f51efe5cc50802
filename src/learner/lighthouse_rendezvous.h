// The lighthouse's key-value store as a data-plane rendezvous store: what a
// learner hands Communicator::Connect for each round.
//
// Thread-safety: as the LighthouseClient it wraps (safe from any thread).
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <utility>

#include "mend/clock.h"
#include "mend/communicator.h"
#include "mend/lighthouse_client.h"

namespace mend {

class LighthouseRendezvousStore final : public RendezvousStore {
 public:
  // `client` and `clock` are not owned and must outlive this object. `check`
  // (optional) is asked at least every kCheckEvery while a Get waits; a status
  // not OK (the lighthouse that formed the round restarted, so its keys are
  // gone; the learner's rounds were called off) ends the Get with it instead
  // of its waiting out its timeout. `abort_key` (optional) is looked up at the
  // same times: the lighthouse sets it (to the reason) when a member of the
  // round died or restarted after the round closed, and the Get ends with
  // ABORTED and that reason. A Set that finds the lighthouse unreachable
  // (UNAVAILABLE: its channel reconnecting after a restart or a stall, which
  // fails calls at once while it backs off) is tried again, at most every
  // kCheckEvery, for up to `set_retry` (the round's timeout: the others wait
  // that long for this member's keys) while `check` and the abort key allow;
  // a watched Get so refused asks again after the same pauses.
  LighthouseRendezvousStore(LighthouseClient& client, const Clock& clock,
                            std::function<Status()> check = nullptr, std::string abort_key = "",
                            Micros set_retry = 0)
      : client_(client),
        clock_(clock),
        check_(std::move(check)),
        abort_key_(std::move(abort_key)),
        set_retry_(set_retry) {}
  static constexpr Micros kCheckEvery = 250 * kMicrosPerMilli;
  // The first pause after the lighthouse refused a call (UNAVAILABLE); each
  // next one twice as long, up to kCheckEvery.
  static constexpr Micros kFirstPause = 10 * kMicrosPerMilli;

  Status Set(const std::string& key, const std::string& value) override {
    const Micros deadline = clock_.NowMicros() + set_retry_;
    Backoff backoff;
    while (true) {
      Status status = client_.StoreSet(key, value);
      const Micros left = deadline - clock_.NowMicros();
      if (status.code() != absl::StatusCode::kUnavailable || left <= 0) return status;
      MEND_RETURN_IF_ERROR(StillOn());
      backoff.Wait(left);
    }
  }
  Status Delete(const std::string& key, bool prefix) override {
    return client_.StoreDelete(key, prefix).status();
  }
  StatusOr<std::string> Get(const std::string& key, Micros timeout) override {
    if (!check_ && abort_key_.empty()) return client_.StoreGet(key, timeout);
    const Micros deadline = clock_.NowMicros() + timeout;
    Backoff backoff;
    while (true) {
      Micros left = deadline - clock_.NowMicros();
      StatusOr<std::string> value =
          client_.StoreGet(key, std::max<Micros>(1, std::min(left, kCheckEvery)));
      if (value.ok() || left <= kCheckEvery) return value;
      MEND_RETURN_IF_ERROR(StillOn());
      const absl::StatusCode code = value.status().code();
      if (code != absl::StatusCode::kDeadlineExceeded && code != absl::StatusCode::kUnavailable) {
        return value;
      }
      // A channel that is reconnecting fails calls at once: ask again after
      // a pause, as Set does, rather than at once.
      if (code == absl::StatusCode::kUnavailable) {
        left = deadline - clock_.NowMicros();
        if (left <= 0) return value;
        backoff.Wait(left);
      } else {
        backoff = Backoff{};
      }
    }
  }

 private:
  // The pauses between calls the lighthouse refused: kFirstPause, each next
  // one twice as long up to kCheckEvery, none past the time `left`.
  struct Backoff {
    Micros pause = kFirstPause;
    void Wait(Micros left) {
      std::this_thread::sleep_for(std::chrono::microseconds(std::min(pause, left)));
      pause = std::min(2 * pause, kCheckEvery);
    }
  };

  // OK while the round may still rendezvous: `check` says so and the
  // lighthouse has not called the round off.
  Status StillOn() {
    if (check_) MEND_RETURN_IF_ERROR(check_());
    if (!abort_key_.empty()) {
      StatusOr<std::string> why = client_.StoreGet(abort_key_, 1);
      if (why.ok()) return AbortedError("rendezvous: the round was called off: " + *why);
    }
    return OkStatus();
  }

  LighthouseClient& client_;
  const Clock& clock_;
  std::function<Status()> check_;
  std::string abort_key_;
  Micros set_retry_;
};

// The options of a round's communicator: the configuration's part (`base`,
// options_from_config.h's CommunicatorOptionsFrom) and the round's prefix,
// id, rank, size and members.
inline CommunicatorOptions CommunicatorOptionsForRound(const CommunicatorOptions& base,
                                                       const QuorumResult& round) {
  CommunicatorOptions options = base;
  options.prefix = round.rendezvous_prefix();
  options.round_id = round.round_id();
  options.rank = static_cast<int>(round.rank());
  options.world_size = static_cast<int>(round.world_size());
  for (const RoundMember& member : round.members())
    options.member_ids.push_back(member.learner_id());
  return options;
}

}  // namespace mend
