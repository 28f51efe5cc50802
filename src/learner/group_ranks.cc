#include "learner/group_ranks.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <thread>
#include <utility>

#include "core/status_format.h"
#include "fmt/format.h"
#include "learner/lighthouse_rendezvous.h"
#include "spdlog/spdlog.h"

namespace mend {
namespace {

// Pauses between tries of a store that is not up yet.
constexpr Micros kMinRetry = 100 * kMicrosPerMilli;
constexpr Micros kMaxRetry = 2 * kMicrosPerSecond;

// Sets `key`, trying again while the store fails at once (the lighthouse is
// not up yet, or rank 0's store) and `deadline` is not passed, or until
// `told_failure` (optional) gives rank 0's told failure: its store is gone
// (returned, with `*told` set).
Status SetWhenStoreIsUp(RendezvousStore& store, const Clock& clock, const std::string& key,
                        const std::string& value, Micros deadline,
                        const std::function<std::optional<Status>()>& told_failure, bool* told) {
  Micros retry = kMinRetry;
  while (true) {
    Status set = store.Set(key, value);
    if (set.ok() || !StoreNotUpOrGone(set) || clock.NowMicros() + retry > deadline) {
      return set;
    }
    if (told_failure) {
      if (std::optional<Status> failed = told_failure()) {
        *told = true;
        return *failed;
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(retry));
    retry = std::min(retry * 2, kMaxRetry);
  }
}

// Where group rank `rank` tells why it could not start: under the group's
// store address too, which tells one launch from the next wherever that
// address changes with each launch (mend_init under torchrun serves it on a
// port rank 0 picks; mend train's launcher picks a free one): a relaunch of
// the group then never reads the failure of the launch before it.
std::string FailedKey(const AgentOptions& options, const std::string& learner_id, int64_t rank) {
  return fmt::format("{}failed/{}/{}", GroupStorePrefix(options, learner_id),
                     options.group_store.empty() ? "-" : options.group_store, rank);
}

// A rank's failure as its store value ("<code> <unix ms> <message>").
std::string FailureValue(const Status& why) {
  return fmt::format("{} {} {}", static_cast<int>(why.code()), UnixMillis(), why.message());
}

// Gets `key`, waiting for it until `deadline`. NOT_FOUND or
// DEADLINE_EXCEEDED when it did not come in time, however the last Get put
// it; the waited-for rank's own error (CouldNotStartAsTold), and
// `*told_failure` set, once that rank told one in `told` (looked at between
// the waits, every kMaxRetry at most).
StatusOr<std::string> GetByDeadline(RendezvousStore& store, RendezvousStore* told,
                                    const Clock& clock, const AgentOptions& options,
                                    const std::string& learner_id, int64_t rank,
                                    const std::string& key, Micros deadline, bool* told_failure) {
  const int64_t since = UnixMillis();
  StatusOr<std::string> value = std::string();
  Micros retry = kMinRetry;
  while (true) {
    value = store.Get(key, std::clamp<Micros>(deadline - clock.NowMicros(), 1, kMaxRetry));
    if (value.ok()) return value;
    if (told != nullptr) {
      if (std::optional<Status> failed =
              CouldNotStartAsTold(*told, options, learner_id, rank, since)) {
        *told_failure = true;
        return *failed;
      }
    }
    if (clock.NowMicros() >= deadline) return value;
    // An unreachable store fails at once, and a Get whose wait rounds down
    // to 0 ms answers NOT_FOUND at once: both mean "not yet".
    if (StoreNotUpOrGone(value.status()) || value.status().code() == StatusCode::kNotFound) {
      std::this_thread::sleep_for(std::chrono::microseconds(retry));
      retry = std::min(retry * 2, kMaxRetry);
    } else if (value.status().code() != StatusCode::kDeadlineExceeded) {
      return value;
    }
  }
}

class GroupRankAgent final : public LearnerAgent {
 public:
  GroupRankAgent(std::string id, const AgentOptions& options, const std::string& token,
                 const Clock& clock, std::unique_ptr<LighthouseClient> client,
                 GroupStoreOpener group_store)
      : id_(std::move(id)),
        options_(options),
        clock_(clock),
        client_(std::move(client)),
        group_store_(std::move(group_store)),
        secrets_(AgentSecrets::Of(options, token)) {}
  std::string data_plane_secret() const override { return secrets_.data_plane; }
  std::string checkpoint_secret() const override { return secrets_.checkpoints; }
  const AgentOptions& options() const override { return options_; }

  void RecordStep(uint64_t, uint64_t, Micros) override {}
  StatusOr<QuorumResult> Quorum(uint64_t, uint64_t, Micros, bool, uint64_t) override {
    return FailedPreconditionError(fmt::format(
        "learner '{}' group rank {}: only group rank 0 joins rounds; the others learn them from it",
        id_, options_.group_rank));
  }
  void Interrupt() override {}
  Status Leave(const std::string&) override { return OkStatus(); }
  void Stop() override {}
  void WithholdHeartbeats(bool) override {}
  const std::string& id() const override { return id_; }
  bool slow() const override { return false; }
  double slow_zscore() const override { return 0; }
  uint64_t latest_round_id() const override { return 0; }
  uint64_t latest_round_step() const override { return 0; }
  bool lighthouse_lost() const override { return false; }
  bool short_of_quorum() const override { return false; }
  uint64_t registrations() const override { return 1; }
  Status fatal_status() const override { return OkStatus(); }
  const Clock& clock() const override { return clock_; }
  LighthouseClient& client() override { return *client_; }
  StatusOr<std::unique_ptr<RendezvousStore>> OpenGroupStore() override {
    return OpenGroupOrLighthouseStore(group_store_, *client_, clock_);
  }

 private:
  const std::string id_;
  const AgentOptions options_;
  const Clock& clock_;
  std::unique_ptr<LighthouseClient> client_;
  const GroupStoreOpener group_store_;
  const AgentSecrets secrets_;
};

}  // namespace

StatusOr<std::vector<std::string>> ShareWithGroupRanks(
    RendezvousStore& store, RendezvousStore* told, const Clock& clock, const AgentOptions& options,
    const std::string& learner_id, const std::string& prefix, const std::string& mine,
    bool only_rank0_waits, std::string_view missing) {
  const Micros deadline = clock.NowMicros() + options.quorum_timeout_ms * kMicrosPerMilli;
  const auto give_up = [&](int64_t rank, const Status& why) {
    return Status(
        why.code(),
        fmt::format("learner '{}' group rank {}: group rank {}{} within quorum_timeout_ms = {} "
                    "(each of a learner's group_size = {} ranks must start: mend_init on each): {}",
                    learner_id, options.group_rank, rank, missing, options.quorum_timeout_ms,
                    options.group_size, why.message()));
  };
  const int64_t since = UnixMillis();
  std::function<std::optional<Status>()> rank0_failed;
  if (told != nullptr && options.group_rank != 0) {
    rank0_failed = [&]() { return CouldNotStartAsTold(*told, options, learner_id, 0, since); };
  }
  bool rank0_told = false;
  Status set = SetWhenStoreIsUp(store, clock, fmt::format("{}{}", prefix, options.group_rank), mine,
                                deadline, rank0_failed, &rank0_told);
  if (!set.ok()) return rank0_told ? set : give_up(options.group_rank, set);
  if (only_rank0_waits && options.group_rank != 0) return std::vector<std::string>{};
  std::vector<std::string> values;
  for (int64_t r = 0; r < options.group_size; ++r) {
    if (r == options.group_rank) {
      values.push_back(mine);
      continue;
    }
    bool told_failure = false;
    StatusOr<std::string> value =
        GetByDeadline(store, told, clock, options, learner_id, r, fmt::format("{}{}", prefix, r),
                      deadline, &told_failure);
    if (!value.ok()) {
      const Status& why = value.status();
      if (told_failure) return why;
      return give_up(
          r, why.code() == StatusCode::kNotFound ? DeadlineExceededError(why.message()) : why);
    }
    values.push_back(*std::move(value));
  }
  return values;
}

int64_t UnixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool StoreNotUpOrGone(const Status& status) {
  return status.code() == StatusCode::kUnavailable || status.code() == StatusCode::kCancelled;
}

Status TellGroupRanks(const AgentOptions& options, const std::string& token,
                      const std::string& learner_id, Status why) {
  if (options.group_size <= 1 || why.ok()) return why;
  StatusOr<std::unique_ptr<LighthouseClient>> client =
      LighthouseClient::Connect(LighthouseClientOptionsFor(options, token));
  const Status told = client.ok()
                          ? (*client)->StoreSet(FailedKey(options, learner_id, options.group_rank),
                                                FailureValue(why))
                          : client.status();
  if (!told.ok()) {
    spdlog::warn(
        "learner '{}' group rank {}: could not tell the group's other ranks why it did "
        "not start ({}); they wait up to quorum_timeout_ms",
        learner_id, options.group_rank, told);
  }
  return why;
}

std::optional<Status> ToldFailure(RendezvousStore& told, const AgentOptions& options,
                                  const std::string& learner_id, int64_t rank,
                                  int64_t since_unix_ms) {
  StatusOr<std::string> value = told.Get(FailedKey(options, learner_id, rank), 1);
  if (!value.ok()) return std::nullopt;
  // "<code> <unix ms> <message>"
  const size_t first = value->find(' ');
  const size_t second = first == std::string::npos ? first : value->find(' ', first + 1);
  if (second == std::string::npos) return std::nullopt;
  int code = std::atoi(value->substr(0, first).c_str());
  const int64_t at = std::atoll(value->substr(first + 1, second - first - 1).c_str());
  if (at < since_unix_ms - options.quorum_timeout_ms) return std::nullopt;  // an earlier start's
  if (code <= 0 || code > static_cast<int>(StatusCode::kUnauthenticated)) {
    code = static_cast<int>(StatusCode::kUnknown);
  }
  return Status(static_cast<StatusCode>(code), value->substr(second + 1));
}

std::optional<Status> CouldNotStartAsTold(RendezvousStore& told, const AgentOptions& options,
                                          const std::string& learner_id, int64_t rank,
                                          int64_t since_unix_ms) {
  std::optional<Status> failed = ToldFailure(told, options, learner_id, rank, since_unix_ms);
  if (!failed) return std::nullopt;
  return Status(failed->code(),
                fmt::format("learner '{}' group rank {}: group rank {} could not start: {}",
                            learner_id, options.group_rank, rank, failed->message()));
}

void ForgetToldFailure(RendezvousStore& told, const AgentOptions& options,
                       const std::string& learner_id) {
  (void)told.Delete(FailedKey(options, learner_id, options.group_rank), /*prefix=*/false);
}

StatusOr<std::unique_ptr<RendezvousStore>> OpenGroupOrLighthouseStore(
    const GroupStoreOpener& group_store, LighthouseClient& client, const Clock& clock) {
  if (group_store) return group_store();
  return std::unique_ptr<RendezvousStore>(
      std::make_unique<LighthouseRendezvousStore>(client, clock));
}

std::unique_ptr<LearnerAgent> NewGroupRankAgent(std::string id, const AgentOptions& options,
                                                const std::string& token, const Clock& clock,
                                                std::unique_ptr<LighthouseClient> client,
                                                GroupStoreOpener group_store) {
  return std::make_unique<GroupRankAgent>(std::move(id), options, token, clock, std::move(client),
                                          std::move(group_store));
}

}  // namespace mend
