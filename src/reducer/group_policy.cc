#include "reducer/group_policy.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/status_format.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "reducer/fragment_checkpoint.h"
#include "spdlog/spdlog.h"

namespace mend::reducer {
namespace {

class SingleRank final : public RoundPolicy {
 public:
  bool group() const override { return false; }
  bool SnapshotsAtMerge() const override { return true; }
  bool JoinWaitsForItsHeal() const override { return true; }
  bool DecidesAlone() const override { return true; }
  bool AppliedOnArrival() const override { return true; }
  std::vector<uint8_t> TouchedFragments(std::vector<uint8_t> own) const override { return own; }
  Status broken() const override { return OkStatus(); }
  std::unique_ptr<RoundServices> Services(std::unique_ptr<RoundServices> own) override {
    return own;
  }
  uint64_t LearnerTokens(uint64_t tokens) const override { return tokens; }
  Micros ReportedStepTime(Micros step_time) override { return step_time; }
  StatusOr<uint64_t> AgreeTau(uint64_t tau) override { return tau; }
  StatusOr<bool> AgreeLaunch(bool blocked) override { return blocked; }
  StatusOr<Verdict> AgreeVerdict(const std::function<std::optional<Verdict>()>& decide) override {
    while (true) {
      if (std::optional<Verdict> verdict = decide()) return *verdict;
    }
  }
  StatusOr<std::pair<bool, bool>> AllArrived(bool arrived, bool formed) override {
    return std::pair{arrived, formed};
  }
  Status AwaitAllSlices(const std::function<bool()>&) override { return OkStatus(); }
  StatusOr<bool> AllOk(InFlight& flight) override { return flight.outcome.ok(); }
  Status ShareCommitted(bool) override { return OkStatus(); }
  StatusOr<uint64_t> ResumeRound(uint64_t newest) override { return newest; }
  Status AgreeOnRestored(uint64_t, std::string_view, std::string_view) override {
    return OkStatus();
  }
  StatusOr<std::shared_ptr<Checkpoint>> Snapshot(const FragmentBook& book,
                                                 Checkpoint described) override {
    auto checkpoint = std::make_shared<Checkpoint>(std::move(described));
    AddFragmentTensors(book.parameters(), book.fragments(), checkpoint.get());
    return checkpoint;
  }
  size_t OwnCount(const FragmentBook& book) const override { return book.values(); }
  Status OwnValues(std::span<const float> slice, std::span<float> own) override {
    std::copy(slice.begin(), slice.end(), own.begin());
    return OkStatus();
  }
  void SliceValues(std::span<const float> own, std::span<float> slice) const override {
    std::copy(own.begin(), own.end(), slice.begin());
  }
  void AddOwnState(const FragmentBook& book, Checkpoint* checkpoint) const override {
    AddResidualTensors(book.parameters(), book.fragments(), checkpoint);
  }
  std::string SlicePrefix(const std::string& round_prefix) const override { return round_prefix; }
  uint64_t MergeWeight(uint64_t tokens) const override { return tokens; }
  std::string DiagnosticsName(const std::string& id) const override { return id; }
  void AddToRecord(nlohmann::json&) const override {}
  uint64_t GroupBytesSent() const override { return 0; }
  uint64_t GroupStateBytesSent() const override { return 0; }
  void Stop(bool) override {}
  void Forget() override {}
};

class ManyRanks final : public RoundPolicy {
 public:
  ManyRanks(std::unique_ptr<LearnerGroup> group, std::unique_ptr<FlatParameters> whole,
            std::unique_ptr<FlatMoments> whole_moments)
      : whole_(std::move(whole)),
        whole_moments_(std::move(whole_moments)),
        group_(std::move(group)) {}

  bool group() const override { return true; }
  bool SnapshotsAtMerge() const override { return false; }
  bool JoinWaitsForItsHeal() const override { return false; }
  bool DecidesAlone() const override { return false; }
  bool AppliedOnArrival() const override { return false; }
  std::vector<uint8_t> TouchedFragments(std::vector<uint8_t> own) const override {
    return std::vector<uint8_t>(own.size(), 1);
  }
  Status broken() const override { return broken_; }
  std::unique_ptr<RoundServices> Services(std::unique_ptr<RoundServices> own) override {
    return group_->RoundServicesOver(std::move(own));
  }
  // Each rank passes its own tokens; the group trained R times as many
  // (DDP: the same batch size on every rank).
  uint64_t LearnerTokens(uint64_t tokens) const override {
    return tokens * static_cast<uint64_t>(group_->size());
  }
  // The slowest rank's step time, so that a slow rank makes its group
  // fail-slow even where nothing inside the group waits for it.
  Micros ReportedStepTime(Micros step_time) override {
    if (step_time > 0) {
      step_sum_ += step_time;
      steps_++;
    }
    return std::max(step_time, slowest_step_);
  }
  StatusOr<uint64_t> AgreeTau(uint64_t tau) override { return Break(group_->AgreeTau(tau)); }
  StatusOr<bool> AgreeLaunch(bool blocked) override {
    MEND_ASSIGN_OR_RETURN(auto rank0, Break(group_->Compare(blocked ? 1 : 0)));
    return rank0.first != 0;
  }

  // Rank 0's verdict: 0 while undecided, else 1 + the Verdict. The ranks
  // meet every poll interval while rank 0 has not decided, so no group
  // collective waits on a rank that waits for its slice.
  StatusOr<Verdict> AgreeVerdict(const std::function<std::optional<Verdict>()>& decide) override {
    constexpr uint64_t kUndecided = 0;
    while (true) {
      uint64_t verdict = kUndecided;
      if (group_->rank() == 0) {
        if (std::optional<Verdict> decided = decide())
          verdict = 1 + static_cast<uint64_t>(*decided);
      }
      MEND_ASSIGN_OR_RETURN(auto rank0, Break(group_->Compare(verdict)));
      if (rank0.first == kUndecided) continue;
      if (rank0.first - 1 > static_cast<uint64_t>(Verdict::kShortOfQuorum)) {
        return Break(
            InternalError(fmt::format("group: rank 0's round verdict {} is unknown", rank0.first)));
      }
      return static_cast<Verdict>(rank0.first - 1);
    }
  }
  StatusOr<std::pair<bool, bool>> AllArrived(bool arrived, bool formed) override {
    return Break(group_->AllArrived(arrived, formed));
  }
  // The ranks' slices end at different times (a failing rendezvous may take
  // a collective timeout on one rank and none on another).
  Status AwaitAllSlices(const std::function<bool()>& poll_done) override {
    while (true) {
      MEND_ASSIGN_OR_RETURN(auto all, Break(group_->AllArrived(poll_done(), false)));
      if (all.first) return OkStatus();
    }
  }
  StatusOr<bool> AllOk(InFlight& flight) override {
    uint64_t step_us = steps_ == 0 ? 0 : static_cast<uint64_t>(step_sum_) / steps_;
    MEND_ASSIGN_OR_RETURN(bool all_ok,
                          Break(group_->AllOk(flight.outcome.ok(), &flight.formed_step, &step_us)));
    slowest_step_ = static_cast<Micros>(step_us);
    step_sum_ = 0;
    steps_ = 0;
    return all_ok;
  }
  Status ShareCommitted(bool moments_changed) override {
    // Each rank changed its slice of the moments: into every replica.
    if (whole_moments_ && moments_changed)
      MEND_RETURN_IF_ERROR(Break(group_->ShareMoments(*whole_moments_)));
    return Break(group_->ShareParameters());
  }
  StatusOr<uint64_t> ResumeRound(uint64_t newest) override {
    MEND_ASSIGN_OR_RETURN(auto rank0, Break(group_->Compare(newest)));
    return rank0.first;
  }
  Status AgreeOnRestored(uint64_t round_id, std::string_view what, std::string_view rule) override {
    MEND_ASSIGN_OR_RETURN(std::vector<uint64_t> rounds, group_->ValuesByRank(round_id));
    if (std::any_of(rounds.begin(), rounds.end(), [&](uint64_t r) { return r != rounds[0]; })) {
      std::string each;
      for (size_t rank = 0; rank < rounds.size(); ++rank) {
        each += fmt::format(
            "{}rank {}: {}", rank == 0 ? "" : ", ", rank,
            rounds[rank] == 0 ? std::string("none") : fmt::format("round {}", rounds[rank]));
      }
      return FailedPreconditionError(
          fmt::format("learner '{}' group rank {}: the group's ranks {} different states ({}); {}",
                      group_->learner_id(), group_->rank(), what, each, rule));
    }
    return group_->ShareParameters();
  }
  StatusOr<std::shared_ptr<Checkpoint>> Snapshot(const FragmentBook& book,
                                                 Checkpoint described) override {
    return Break(Gather(book, std::move(described)));
  }
  size_t OwnCount(const FragmentBook&) const override { return group_->total(); }
  Status OwnValues(std::span<const float> slice, std::span<float> own) override {
    return Break(group_->GatherOwn(slice, own));
  }
  void SliceValues(std::span<const float> own, std::span<float> slice) const override {
    group_->SliceOwn(own, slice);
  }
  void AddOwnState(const FragmentBook&, Checkpoint*) const override {}
  std::string SlicePrefix(const std::string& round_prefix) const override {
    return group_->SlicePrefix(round_prefix);
  }
  uint64_t MergeWeight(uint64_t tokens) const override {
    return tokens / static_cast<uint64_t>(group_->size());
  }
  std::string DiagnosticsName(const std::string& id) const override {
    return fmt::format("{}.rank{}", id, group_->rank());
  }
  // The whole replica's digest: the same on every rank of the group.
  void AddToRecord(nlohmann::json& record) const override {
    record["group_rank"] = group_->rank();
    record["parameters_sha256"] = ParametersDigest(*whole_);
  }
  uint64_t GroupBytesSent() const override { return group_->bytes_sent(); }
  uint64_t GroupStateBytesSent() const override { return group_->state_bytes_sent(); }
  void Stop(bool done) override { group_->StopPulse(done); }
  void Forget() override { group_->Forget(); }

 private:
  StatusOr<std::shared_ptr<Checkpoint>> Gather(const FragmentBook& book, Checkpoint described);
  // A group collective's result: its failure breaks the group (the first one said).
  template <typename T>
  T Break(T result) {
    const Status status = StatusOf(result);
    if (!status.ok() && broken_.ok()) {
      spdlog::error("{}; this rank stops (the group is restarted as a whole)", status);
      broken_ = status;
    }
    return result;
  }
  static Status StatusOf(const Status& status) { return status; }
  template <typename T>
  static Status StatusOf(const StatusOr<T>& result) {
    return result.status();
  }

  Status broken_ = OkStatus();
  // The whole model and the group go last: the slices refer to them.
  const std::unique_ptr<FlatParameters> whole_;
  const std::unique_ptr<FlatMoments> whole_moments_;
  const std::unique_ptr<LearnerGroup> group_;
  // This rank's step times since the last round, and the slowest rank's
  // mean step as of it (what rank 0's heartbeats carry).
  Micros step_sum_ = 0;
  uint64_t steps_ = 0;
  Micros slowest_step_ = 0;
};

// Each rank puts its fragments' pieces back in slice order, the slices are
// gathered, and rank 0 gets the whole model as one fragment of its
// parameters, by parameter name. Never for a sharded model (no rank holds
// it whole): its outer state is each rank's own (OuterState::ExportOwn).
StatusOr<std::shared_ptr<Checkpoint>> ManyRanks::Gather(const FragmentBook& book,
                                                        Checkpoint described) {
  if (group_->sharded()) {
    return FailedPreconditionError(fmt::format(
        "learner '{}' group rank {}: the whole model is never gathered from a sharded group "
        "(checkpoint it with torch.distributed.checkpoint: runtime.state_dict() holds each "
        "rank's own outer state)",
        group_->learner_id(), group_->rank()));
  }
  std::vector<float> slice_global(book.values()), slice_momentum(book.values());
  book.CopyStateOut(slice_global, slice_momentum);
  std::vector<float> global(group_->total()), momentum(group_->total());
  MEND_RETURN_IF_ERROR(group_->GatherOwn(slice_global, global));
  MEND_RETURN_IF_ERROR(group_->GatherOwn(slice_momentum, momentum));
  if (group_->rank() != 0) return std::shared_ptr<Checkpoint>();
  std::vector<Fragment> whole_model(1);
  for (size_t i = 0; i < whole_->count(); ++i) whole_model[0].parameters.push_back(i);
  whole_model[0].state = std::make_unique<FragmentState>(global);
  whole_model[0].state->Assign(global, momentum);
  auto checkpoint = std::make_shared<Checkpoint>(std::move(described));
  AddFragmentTensors(*whole_, whole_model, checkpoint.get());
  return checkpoint;
}

}  // namespace

std::unique_ptr<RoundPolicy> SingleRankPolicy() { return std::make_unique<SingleRank>(); }

std::unique_ptr<RoundPolicy> GroupPolicy(std::unique_ptr<LearnerGroup> group,
                                         std::unique_ptr<FlatParameters> whole,
                                         std::unique_ptr<FlatMoments> whole_moments) {
  return std::make_unique<ManyRanks>(std::move(group), std::move(whole), std::move(whole_moments));
}

}  // namespace mend::reducer
