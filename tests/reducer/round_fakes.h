// Fakes for the round's parts (round_runner.h, round_driver.h): a model of
// one parameter, a communicator of one member, and round services with a
// scripted quorum that a test may hold until it lets the round form.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dataplane/dataplane_fixture.h"
#include "mend/clock.h"
#include "reducer/flat_state.h"
#include "reducer/round_services.h"

namespace mend::reducer::fakes {

// One parameter "w" of `n` values.
class Values final : public FlatParameters {
 public:
  explicit Values(float start, size_t n = 4) : values_(n, start) {}
  size_t count() const override { return 1; }
  const std::string& name(size_t) const override { return name_; }
  std::vector<int64_t> shape(size_t) const override {
    return {static_cast<int64_t>(values_.size())};
  }
  size_t numel(size_t) const override { return values_.size(); }
  void CopyOut(size_t, std::span<float> out) const override {
    std::memcpy(out.data(), values_.data(), out.size_bytes());
  }
  void CopyIn(size_t, std::span<const float> in) override {
    std::memcpy(values_.data(), in.data(), in.size_bytes());
  }
  std::vector<float>& values() { return values_; }

 private:
  std::vector<float> values_;
  std::string name_ = "w";
};

// A round of one member: every reduction leaves the data as it is. A
// `gate`, when given, is called before each weighted reduction (the merge)
// and may hold it; its error is the reduction's.
// A connection to a store that keeps it alive (the test may read it after
// the round let its connection go).
class StoreOf final : public RendezvousStore {
 public:
  explicit StoreOf(std::shared_ptr<RendezvousStore> store) : store_(std::move(store)) {}
  Status Set(const std::string& key, const std::string& value) override {
    return store_->Set(key, value);
  }
  StatusOr<std::string> Get(const std::string& key, Micros timeout) override {
    return store_->Get(key, timeout);
  }

 private:
  const std::shared_ptr<RendezvousStore> store_;
};

class AloneCommunicator final : public Communicator {
 public:
  AloneCommunicator() = default;
  explicit AloneCommunicator(std::function<Status()> gate) : gate_(std::move(gate)) {}
  Status WeightedAllReduce(std::span<float>, double, const Codec*) override {
    if (gate_) MEND_RETURN_IF_ERROR(gate_());
    stats_.operations++;
    return OkStatus();
  }
  Status WeightedAllGatherDecode(std::span<const std::byte> payload, double, const Codec& codec,
                                 std::span<float> out) override {
    if (gate_) MEND_RETURN_IF_ERROR(gate_());
    codec.Decode(payload, out);
    return OkStatus();
  }
  Status AllGather(std::span<const std::byte> mine, std::span<std::byte> out) override {
    std::memcpy(out.data(), mine.data(), mine.size());
    return OkStatus();
  }
  Status Broadcast(std::span<std::byte>, int) override { return OkStatus(); }
  void Abort(const std::string&) override {}
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  bool broken() const override { return false; }
  CommunicatorStats stats() const override { return stats_; }

 private:
  std::function<Status()> gate_;
  CommunicatorStats stats_;
};

// What a round asked of the quorum.
struct QuorumAsk {
  uint64_t last_round_id = 0;
  uint64_t tokens = 0;
  Micros timeout = 0;
  uint64_t boundary_step = 0;
};

// The round of one member that the fake quorum answers by default.
inline QuorumResult RoundOfOne(uint64_t round_id, uint64_t step) {
  QuorumResult round;
  round.set_round_id(round_id);
  round.set_rank(0);
  round.set_world_size(1);
  round.set_step(step);
  round.set_rendezvous_prefix("job/round/x/" + std::to_string(round_id) + "/");
  round.add_members();
  return round;
}

// Round services on `clock`. The quorum answers `quorum` (or, when it is
// not set, a round of one member numbered 1, 2, ... at the asked boundary);
// while held (Hold), a quorum call waits until Release() or Interrupt().
// The learner's side is `agent`'s (a fake one; null: a learner the
// lighthouse says nothing of).
// Safe from any thread: the round's, and the test's.
class FakeServices final : public RoundServices {
 public:
  explicit FakeServices(const Clock& clock, LearnerAgent* agent = nullptr)
      : clock_(clock), agent_(agent) {}

  const Clock& clock() const override { return clock_; }
  StatusOr<QuorumResult> Quorum(uint64_t last_round_id, uint64_t tokens, Micros timeout,
                                uint64_t boundary_step) override {
    std::unique_lock lock(mu_);
    asks_.push_back({last_round_id, tokens, timeout, boundary_step});
    changed_.notify_all();
    changed_.wait(lock, [&]() { return !held_ || interrupted_; });
    if (interrupted_) return AbortedError("fake services: the round was interrupted");
    if (quorum_) return *quorum_;
    // As the lighthouse: the newest state its one member reported.
    QuorumResult round = RoundOfOne(++rounds_formed_, boundary_step);
    round.set_heal_round_id(last_round_id);
    return round;
  }
  std::unique_ptr<RendezvousStore> OpenRendezvous(const QuorumResult&) override {
    std::lock_guard lock(mu_);
    opened_++;
    rendezvous_ = std::make_shared<testing_util::InProcessStore>();  // a fresh one per round
    return std::make_unique<StoreOf>(rendezvous_);
  }
  // The newest round's rendezvous store (null before the first).
  std::shared_ptr<RendezvousStore> rendezvous() {
    std::lock_guard lock(mu_);
    return rendezvous_;
  }
  StatusOr<std::unique_ptr<Communicator>> Connect(RendezvousStore&,
                                                  const CommunicatorOptions& options,
                                                  bool) override {
    std::unique_lock lock(mu_);
    connected_prefix_ = options.prefix;
    const size_t n = ++connects_;
    changed_.notify_all();
    changed_.wait(lock, [&]() { return n < hold_from_ || interrupted_; });
    if (connect_through_) {
      const ConnectThrough through = connect_through_;
      lock.unlock();
      StatusOr<std::unique_ptr<Communicator>> comm = through(options);
      lock.lock();
      connects_returned_++;
      changed_.notify_all();
      return comm;
    }
    connects_returned_++;
    changed_.notify_all();
    if (interrupted_) return AbortedError("fake services: the round was interrupted");
    if (!connect_.ok()) return connect_;
    // The round's merge waits, from the n-th round on (HoldMergesFrom), after
    // its members compared their states or healed.
    return std::unique_ptr<Communicator>(std::make_unique<AloneCommunicator>([this, n]() {
      std::unique_lock merge_lock(mu_);
      merges_++;
      changed_.notify_all();
      changed_.wait(merge_lock, [&]() { return n < hold_merges_from_ || interrupted_; });
      if (interrupted_) return AbortedError("fake services: the round was interrupted");
      return OkStatus();
    }));
  }
  // One watch at a time (one round in flight): its abort is CallOffRound's.
  void WatchAbort(const QuorumResult&, const void* owner,
                  std::function<void(const std::string&)> abort) override {
    std::lock_guard lock(mu_);
    watched_++;
    watching_ = owner;
    abort_ = std::move(abort);
    changed_.notify_all();
  }
  void Unwatch(const void* owner) override {
    std::lock_guard lock(mu_);
    if (watching_ != owner) return;
    watching_ = nullptr;
    abort_ = nullptr;
  }
  // As the lighthouse setting the round's abort key: the watch in place (if
  // any) is called, once; whether there was one.
  bool CallOffRound(const std::string& why) {
    std::lock_guard lock(mu_);
    if (!abort_) return false;
    abort_(why);
    abort_ = nullptr;
    return true;
  }
  void Interrupt() override {
    std::lock_guard lock(mu_);
    interrupted_ = true;
    changed_.notify_all();
  }
  void RecordStep(uint64_t step, uint64_t tokens, Micros step_time) override {
    if (agent_) agent_->RecordStep(step, tokens, step_time);
  }
  LighthouseNews News() const override {
    if (!agent_) return {};
    return {agent_->latest_round_id(), agent_->latest_round_step(), agent_->lighthouse_lost(),
            agent_->short_of_quorum()};
  }
  Status fatal_status() const override { return agent_ ? agent_->fatal_status() : OkStatus(); }
  Status Leave(const std::string& reason) override {
    return agent_ ? agent_->Leave(reason) : OkStatus();
  }
  const std::string& learner_id() const override { return agent_ ? agent_->id() : id_; }

  // Scripting.
  void SetQuorum(StatusOr<QuorumResult> answer) {
    std::lock_guard lock(mu_);
    quorum_ = std::move(answer);
  }
  void SetConnect(Status status) {
    std::lock_guard lock(mu_);
    connect_ = std::move(status);
  }
  // Connects through `through` (a real communicator) instead.
  using ConnectThrough =
      std::function<StatusOr<std::unique_ptr<Communicator>>(const CommunicatorOptions&)>;
  void SetConnectThrough(ConnectThrough through) {
    std::lock_guard lock(mu_);
    connect_through_ = std::move(through);
  }
  void Hold() {
    std::lock_guard lock(mu_);
    held_ = true;
  }
  void Release() {
    std::lock_guard lock(mu_);
    held_ = false;
    changed_.notify_all();
  }
  // The n-th round to form, and every later one, waits before its exchange
  // (in Connect) until released; the earlier ones go on.
  void HoldExchangesFrom(size_t n) {
    std::lock_guard lock(mu_);
    hold_from_ = n;
    changed_.notify_all();
  }
  void ReleaseExchanges() { HoldExchangesFrom(SIZE_MAX); }
  // The n-th round to form, and every later one, waits in its merge (past
  // its heal or agreement) until released.
  void HoldMergesFrom(size_t n) {
    std::lock_guard lock(mu_);
    hold_merges_from_ = n;
    changed_.notify_all();
  }
  void ReleaseMerges() { HoldMergesFrom(SIZE_MAX); }
  // Waits (real time, up to `timeout`) until `n` merges began.
  bool AwaitMerges(size_t n, Micros timeout = 60 * kMicrosPerSecond) {
    std::unique_lock lock(mu_);
    return changed_.wait_for(lock, std::chrono::microseconds(timeout),
                             [&]() { return merges_ >= n; });
  }
  // Waits (real time, up to `timeout`) until `n` rounds came to connect.
  bool AwaitConnects(size_t n, Micros timeout = 60 * kMicrosPerSecond) {
    std::unique_lock lock(mu_);
    return changed_.wait_for(lock, std::chrono::microseconds(timeout),
                             [&]() { return connects_ >= n; });
  }
  // Waits (real time, up to `timeout`) until the quorum was asked `n` times.
  bool AwaitAsks(size_t n, Micros timeout = 60 * kMicrosPerSecond) {
    std::unique_lock lock(mu_);
    return changed_.wait_for(lock, std::chrono::microseconds(timeout),
                             [&]() { return asks_.size() >= n; });
  }

  // What was asked and done.
  std::vector<QuorumAsk> asks() const {
    std::lock_guard lock(mu_);
    return asks_;
  }
  QuorumAsk last_ask() const {
    std::lock_guard lock(mu_);
    return asks_.empty() ? QuorumAsk{} : asks_.back();
  }
  int opened() const {
    std::lock_guard lock(mu_);
    return opened_;
  }
  int watched() const {
    std::lock_guard lock(mu_);
    return watched_;
  }
  bool watching() const {
    std::lock_guard lock(mu_);
    return watching_ != nullptr;
  }
  // Waits (real time, up to `timeout`) until a watch is armed.
  bool AwaitWatching(Micros timeout = 60 * kMicrosPerSecond) {
    std::unique_lock lock(mu_);
    return changed_.wait_for(lock, std::chrono::microseconds(timeout),
                             [&]() { return watching_ != nullptr; });
  }
  // Connects that returned (held ones return once released).
  size_t connects_returned() const {
    std::lock_guard lock(mu_);
    return connects_returned_;
  }
  bool interrupted() const {
    std::lock_guard lock(mu_);
    return interrupted_;
  }
  std::string connected_prefix() const {
    std::lock_guard lock(mu_);
    return connected_prefix_;
  }

 private:
  const Clock& clock_;
  LearnerAgent* const agent_;
  const std::string id_ = "fake-learner";
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::optional<StatusOr<QuorumResult>> quorum_;
  Status connect_ = OkStatus();
  ConnectThrough connect_through_;
  bool held_ = false;
  size_t hold_from_ = SIZE_MAX;
  size_t connects_ = 0;
  size_t hold_merges_from_ = SIZE_MAX;
  size_t merges_ = 0;
  bool interrupted_ = false;
  uint64_t rounds_formed_ = 0;
  std::vector<QuorumAsk> asks_;
  int opened_ = 0, watched_ = 0;
  size_t connects_returned_ = 0;
  const void* watching_ = nullptr;
  std::function<void(const std::string&)> abort_;
  std::string connected_prefix_;
  std::shared_ptr<RendezvousStore> rendezvous_;
};

}  // namespace mend::reducer::fakes
