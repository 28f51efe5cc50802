#include "reducer/learner_group.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "coordinator/group_ranks.h"
#include "core/buffer_pool.h"
#include "core/status_format.h"
#include "dataplane/lighthouse_rendezvous.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "mend/checkpoint.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace mend::reducer {
namespace {

// How often a rank waiting for rank 0's decision looks whether it was
// interrupted.
constexpr Micros kDecisionPoll = 250 * kMicrosPerMilli;

nlohmann::json MemberJson(const RoundMember& m) {
  return {{"id", m.id},
          {"step", m.step},
          {"tokens", m.tokens_since_last_round},
          {"last_round", m.last_round_id},
          {"heal_from", m.heal_from},
          {"rack", m.rack},
          {"address", m.address}};
}

RoundMember MemberFrom(const nlohmann::json& j) {
  RoundMember m;
  m.id = j.at("id").get<std::string>();
  m.step = j.at("step").get<uint64_t>();
  m.tokens_since_last_round = j.at("tokens").get<uint64_t>();
  m.last_round_id = j.at("last_round").get<uint64_t>();
  m.heal_from = j.at("heal_from").get<std::string>();
  m.rack = j.at("rack").get<std::string>();
  m.address = j.at("address").get<std::string>();
  return m;
}

// A round decision (or the error rank 0's join ended with) as the group's
// store carries it.
std::string EncodeDecision(const StatusOr<QuorumResult>& result) {
  if (!result.ok()) {
    return nlohmann::json{{"code", static_cast<int>(result.status().code())},
                          {"message", std::string(result.status().message())}}
        .dump();
  }
  const QuorumResult& r = *result;
  nlohmann::json j = {{"code", 0},
                      {"round_id", r.round_id},
                      {"rank", r.rank},
                      {"world_size", r.world_size},
                      {"total_tokens", r.total_tokens},
                      {"prefix", r.rendezvous_prefix},
                      {"closed_by", r.closed_by},
                      {"waited_ms", r.waited_ms},
                      {"heal_round_id", r.heal_round_id},
                      {"step", r.step},
                      {"heal_to", r.heal_to},
                      {"members", nlohmann::json::array()}};
  if (r.heal_from) j["heal_from"] = MemberJson(*r.heal_from);
  for (const RoundMember& m : r.members) j["members"].push_back(MemberJson(m));
  return j.dump();
}

StatusOr<QuorumResult> DecodeDecision(const std::string& text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    const int code = j.at("code").get<int>();
    if (code != 0) {
      return Status(static_cast<StatusCode>(code), j.at("message").get<std::string>());
    }
    QuorumResult r;
    r.round_id = j.at("round_id").get<uint64_t>();
    r.rank = j.at("rank").get<uint32_t>();
    r.world_size = j.at("world_size").get<uint32_t>();
    r.total_tokens = j.at("total_tokens").get<uint64_t>();
    r.rendezvous_prefix = j.at("prefix").get<std::string>();
    r.closed_by = j.at("closed_by").get<std::string>();
    r.waited_ms = j.at("waited_ms").get<uint32_t>();
    r.heal_round_id = j.at("heal_round_id").get<uint64_t>();
    r.step = j.at("step").get<uint64_t>();
    r.heal_to = j.at("heal_to").get<std::vector<std::string>>();
    if (j.contains("heal_from")) r.heal_from = MemberFrom(j.at("heal_from"));
    for (const nlohmann::json& m : j.at("members")) r.members.push_back(MemberFrom(m));
    return r;
  } catch (const nlohmann::json::exception& error) {
    return InternalError(
        fmt::format("group: a round decision in the store does not parse: {}", error.what()));
  }
}

// The control plane as a rank of the group sees it (see learner_group.h).
class GroupAgent final : public LearnerAgent {
 public:
  // `store` (the group's, see LearnerAgent::OpenGroupStore) carries the
  // decisions; this agent's calls come from one thread (the round's).
  GroupAgent(LearnerAgent& inner, std::unique_ptr<RendezvousStore> store, std::string base,
             int rank, Micros margin)
      : inner_(inner),
        store_(std::move(store)),
        base_(std::move(base)),
        rank_(rank),
        margin_(margin) {}

  void RecordStep(uint64_t step, uint64_t tokens, Micros step_time) override {
    inner_.RecordStep(step, tokens, step_time);
  }

  // The n-th call on every rank is the same round: rank 0 joins it and
  // publishes what came of it; the others wait for that.
  StatusOr<QuorumResult> Quorum(uint64_t last_round_id, uint64_t tokens_since_last_round,
                                Micros timeout, bool include_members,
                                uint64_t boundary_step) override {
    const uint64_t seq = ++seq_;
    const std::string key = fmt::format("{}decision/{}", base_, seq);
    if (rank_ == 0) {
      StatusOr<QuorumResult> result = inner_.Quorum(last_round_id, tokens_since_last_round, timeout,
                                                    include_members, boundary_step);
      MEND_RETURN_IF_ERROR(store_->Set(key, EncodeDecision(result)));
      if (seq > 2) (void)store_->Delete(fmt::format("{}decision/{}", base_, seq - 2), false);
      return result;
    }
    const Micros deadline = RealClock()->NowMicros() + timeout + margin_;
    while (true) {
      if (interrupted_.load())
        return AbortedError("group: interrupted while waiting for rank 0's round decision");
      const Micros left = deadline - RealClock()->NowMicros();
      if (left <= 0) {
        return DeadlineExceededError(fmt::format(
            "group rank {}: rank 0 of learner '{}' published no round decision ({}) in time", rank_,
            inner_.id(), key));
      }
      StatusOr<std::string> value = store_->Get(key, std::min(left, kDecisionPoll));
      if (value.ok()) return DecodeDecision(*value);
      if (value.status().code() == StatusCode::kUnavailable) {
        // The store is unreachable (it fails at once): look again in a while.
        std::this_thread::sleep_for(std::chrono::microseconds(std::min(left, kDecisionPoll)));
      } else if (value.status().code() != StatusCode::kDeadlineExceeded) {
        return value.status();
      }
    }
  }
  void Interrupt() override {
    interrupted_ = true;
    inner_.Interrupt();
  }
  Status Leave(const std::string& reason) override { return inner_.Leave(reason); }
  void Stop() override { inner_.Stop(); }
  void WithholdHeartbeats(bool withhold) override { inner_.WithholdHeartbeats(withhold); }
  const std::string& id() const override { return inner_.id(); }
  bool slow() const override { return inner_.slow(); }
  double slow_zscore() const override { return inner_.slow_zscore(); }
  uint64_t latest_round_id() const override { return inner_.latest_round_id(); }
  uint64_t latest_round_step() const override { return inner_.latest_round_step(); }
  bool lighthouse_lost() const override { return inner_.lighthouse_lost(); }
  bool short_of_quorum() const override { return inner_.short_of_quorum(); }
  uint64_t registrations() const override { return inner_.registrations(); }
  Status fatal_status() const override { return inner_.fatal_status(); }
  LighthouseClient& client() override { return inner_.client(); }
  StatusOr<std::unique_ptr<RendezvousStore>> OpenGroupStore() override {
    return inner_.OpenGroupStore();
  }

 private:
  LearnerAgent& inner_;
  const std::unique_ptr<RendezvousStore> store_;
  const std::string base_;
  const int rank_;
  const Micros margin_;  // what a rank waits beyond rank 0's own timeout
  std::atomic<uint64_t> seq_{0};
  std::atomic<bool> interrupted_{false};
};

// Slice `range` of a whole model: one piece per parameter it overlaps, each
// a flat run of values.
class SlicedParameters final : public FlatParameters {
 public:
  SlicedParameters(FlatParameters& full, SliceRange range) : full_(full) {
    size_t offset = 0;
    for (size_t i = 0; i < full.count(); ++i) {
      const size_t n = full.numel(i);
      const size_t lo = std::max(offset, range.begin);
      const size_t hi = std::min(offset + n, range.end);
      if (lo < hi) {
        pieces_.push_back({i, lo - offset, hi - lo,
                           fmt::format("{}[{}:{}]", full.name(i), lo - offset, hi - offset)});
      }
      offset += n;
    }
  }
  size_t count() const override { return pieces_.size(); }
  const std::string& name(size_t i) const override { return pieces_[i].name; }
  std::vector<int64_t> shape(size_t i) const override {
    return {static_cast<int64_t>(pieces_[i].values)};
  }
  size_t numel(size_t i) const override { return pieces_[i].values; }
  size_t layer(size_t i) const override { return full_.layer(pieces_[i].parameter); }
  void CopyOut(size_t i, std::span<float> out) const override {
    const Piece& piece = pieces_[i];
    if (Whole(piece)) return full_.CopyOut(piece.parameter, out);
    scratch_.resize(full_.numel(piece.parameter));
    full_.CopyOut(piece.parameter, scratch_);
    std::memcpy(out.data(), scratch_.data() + piece.offset, piece.values * sizeof(float));
  }
  void CopyIn(size_t i, std::span<const float> in) override {
    const Piece& piece = pieces_[i];
    if (Whole(piece)) return full_.CopyIn(piece.parameter, in);
    scratch_.resize(full_.numel(piece.parameter));
    full_.CopyOut(piece.parameter, scratch_);
    std::memcpy(scratch_.data() + piece.offset, in.data(), piece.values * sizeof(float));
    full_.CopyIn(piece.parameter, scratch_);
  }

 private:
  struct Piece {
    size_t parameter;
    size_t offset;  // into the parameter
    size_t values;
    std::string name;
  };
  bool Whole(const Piece& piece) const {
    return piece.offset == 0 && piece.values == full_.numel(piece.parameter);
  }

  FlatParameters& full_;
  std::vector<Piece> pieces_;
  mutable std::vector<float> scratch_;
};

// Slice `range` of a whole model's moments.
class SlicedMoments final : public FlatMoments {
 public:
  SlicedMoments(FlatMoments& whole, SliceRange range) : whole_(whole), range_(range) {}
  size_t size() const override { return range_.size(); }
  bool Read(Which which, std::span<float> out) const override {
    scratch_.resize(whole_.size());
    if (!whole_.Read(which, scratch_)) return false;
    std::copy_n(scratch_.begin() + static_cast<long>(range_.begin), range_.size(), out.begin());
    return true;
  }
  void Adjust(Which which, std::span<const float> average,
              std::span<const float> snapshot) override {
    scratch_.resize(whole_.size());
    if (!whole_.Read(which, scratch_)) return;
    for (size_t i = 0; i < range_.size(); ++i)
      scratch_[range_.begin + i] += average[i] - snapshot[i];
    whole_.Replace(which, scratch_);
  }
  void Replace(Which which, std::span<const float> average) override {
    scratch_.resize(whole_.size());
    if (!whole_.Read(which, scratch_)) std::fill(scratch_.begin(), scratch_.end(), 0.0f);
    std::copy(average.begin(), average.end(), scratch_.begin() + static_cast<long>(range_.begin));
    whole_.Replace(which, scratch_);
  }

 private:
  FlatMoments& whole_;
  const SliceRange range_;
  mutable std::vector<float> scratch_;
};

}  // namespace

Status AwaitGroupRanks(RendezvousStore& store, const Config& config, const std::string& learner_id,
                       const std::string& prefix) {
  return ShareWithGroupRanks(store, config, learner_id, prefix + "here/", "1",
                             /*only_rank0_waits=*/false, " did not start")
      .status();
}

SliceRange SliceOf(size_t total, int size, int rank) {
  // total * r fits in 64 bits for any model (r < size <= 16, or a few hundred).
  const auto cut = [&](int r) {
    return static_cast<size_t>(static_cast<uint64_t>(total) * static_cast<uint64_t>(r) /
                               static_cast<uint64_t>(size));
  };
  return {cut(rank), cut(rank + 1)};
}

LearnerGroup::LearnerGroup(const Config& config, LearnerAgent& agent, FlatParameters& full,
                           std::string base, std::unique_ptr<RendezvousStore> store,
                           std::unique_ptr<RendezvousStore> decisions)
    : size_(static_cast<int>(config.group_size)),
      rank_(static_cast<int>(config.group_rank)),
      base_(std::move(base)),
      inner_(agent),
      full_(full),
      store_(std::move(store)) {
  for (size_t i = 0; i < full.count(); ++i) total_ += full.numel(i);
  for (int r = 0; r < size_; ++r) slices_.push_back(SliceOf(total_, size_, r));
  agent_ = std::make_unique<GroupAgent>(agent, std::move(decisions), base_, rank_,
                                        config.collective_timeout_ms * kMicrosPerMilli);
}

LearnerGroup::~LearnerGroup() = default;

StatusOr<std::unique_ptr<LearnerGroup>> LearnerGroup::Join(const Config& config,
                                                           LearnerAgent& agent,
                                                           FlatParameters& full) {
  std::string base = GroupStorePrefix(config, agent.id());
  MEND_ASSIGN_OR_RETURN(std::unique_ptr<RendezvousStore> decisions, agent.OpenGroupStore());
  MEND_ASSIGN_OR_RETURN(std::unique_ptr<RendezvousStore> store, agent.OpenGroupStore());
  std::unique_ptr<LearnerGroup> group(
      new LearnerGroup(config, agent, full, base, std::move(store), std::move(decisions)));
  CommunicatorOptions options = CommunicatorOptionsFrom(config);
  options.link = {};  // inside the rack: the emulated cross-rack link is not on this path
  options.prefix = base + "ctx/";
  options.rank = group->rank_;
  options.world_size = group->size_;
  for (int r = 0; r < group->size_; ++r)
    options.member_ids.push_back(fmt::format("{} rank {}", agent.id(), r));
  MEND_RETURN_IF_ERROR(AwaitGroupRanks(*group->store_, config, agent.id(), options.prefix));
  auto comm = Communicator::Connect(*group->store_, options);
  if (!comm.ok()) {
    return Status(comm.status().code(),
                  fmt::format("learner '{}' group rank {} of {}: the group's own communicator: {}",
                              agent.id(), group->rank_, group->size_, comm.status().message()));
  }
  group->comm_ = std::move(*comm);
  MEND_RETURN_IF_ERROR(group->CheckSameModel());
  MEND_ASSIGN_OR_RETURN(std::unique_ptr<RendezvousStore> pulse_store, agent.OpenGroupStore());
  group->pulse_ = std::make_unique<GroupPulse>(
      std::move(pulse_store), group->base_, group->rank_, group->size_, agent,
      config.heartbeat_ms * kMicrosPerMilli, config.heartbeat_timeout_ms * kMicrosPerMilli);
  spdlog::info("learner '{}': group rank {} of {}, slice [{}, {}) of the model's values",
               agent.id(), group->rank_, group->size_,
               group->slices_[static_cast<size_t>(group->rank_)].begin,
               group->slices_[static_cast<size_t>(group->rank_)].end);
  return group;
}

Status LearnerGroup::CheckSameModel() {
  std::string layout;
  for (size_t i = 0; i < full_.count(); ++i)
    layout += fmt::format("{}{}\n", full_.name(i), fmt::join(full_.shape(i), "x"));
  const std::array<unsigned char, 32> mine = Sha256Digest(layout.data(), layout.size());
  MEND_ASSIGN_OR_RETURN(auto all, Gather(std::as_bytes(std::span(mine))));
  for (int q = 0; q < size_; ++q) {
    if (std::memcmp(all.data() + static_cast<size_t>(q) * mine.size(), mine.data(), mine.size()) !=
        0) {
      return InvalidArgumentError(
          fmt::format("learner '{}': group rank {}'s parameters (names and shapes) differ from "
                      "group rank {}'s ({} parameters, "
                      "{} values); every rank of a learner must hold the same model",
                      inner_.id(), q, rank_, full_.count(), total_));
    }
  }
  return OkStatus();
}

std::unique_ptr<FlatParameters> LearnerGroup::Slice() {
  return std::make_unique<SlicedParameters>(full_, slices_[static_cast<size_t>(rank_)]);
}

std::unique_ptr<FlatMoments> LearnerGroup::Slice(FlatMoments& whole) {
  return std::make_unique<SlicedMoments>(whole, slices_[static_cast<size_t>(rank_)]);
}

Status LearnerGroup::ShareMoments(FlatMoments& whole) {
  std::vector<float> values(whole.size());
  const SliceRange own = slices_[static_cast<size_t>(rank_)];
  for (auto which : {FlatMoments::kFirst, FlatMoments::kSecond}) {
    if (!whole.Read(which, values)) continue;  // no optimizer state yet: the same on every replica
    MEND_RETURN_IF_ERROR(
        GatherWhole(std::span<const float>(values).subspan(own.begin, own.size()), values));
    whole.Replace(which, values);
  }
  return OkStatus();
}

std::string LearnerGroup::SlicePrefix(const std::string& round_prefix) const {
  return fmt::format("{}slice{}/", round_prefix, rank_);
}

StatusOr<std::vector<std::byte>> LearnerGroup::Gather(std::span<const std::byte> mine) {
  std::vector<std::byte> all = TakeBytes(mine.size() * static_cast<size_t>(size_));
  Status status = comm_->AllGather(mine, all);
  if (!status.ok()) {
    return Status(status.code(),
                  fmt::format("learner '{}' group rank {}: a rank of this group is gone: {}",
                              inner_.id(), rank_, status.message()));
  }
  return all;
}

StatusOr<uint64_t> LearnerGroup::AgreeTau(uint64_t tau) {
  MEND_ASSIGN_OR_RETURN(auto rank0, Compare(tau));
  return rank0.first;
}

StatusOr<bool> LearnerGroup::AllOk(bool ok, uint64_t* formed_step, uint64_t* step_us) {
  MEND_ASSIGN_OR_RETURN(auto values, GatherValues({ok ? 1u : 0u, *formed_step, *step_us}));
  *formed_step = values[1];
  bool every = true;
  for (int q = 0; q < size_; ++q) {
    every = every && values[3 * q] == 1;
    *step_us = std::max(*step_us, values[3 * q + 2]);
  }
  return every;
}

StatusOr<std::pair<bool, bool>> LearnerGroup::AllArrived(bool arrived, bool formed) {
  MEND_ASSIGN_OR_RETURN(auto values, GatherValues({arrived ? 1u : 0u, formed ? 1u : 0u}));
  bool every = true;
  for (int q = 0; q < size_; ++q) every = every && values[2 * q] == 1;
  return std::pair{every, values[1] == 1};
}

Status LearnerGroup::ShareParameters() {
  // This rank's slice out of its replica, every slice back in (but its own).
  auto for_each_piece = [&](int q, auto&& copy) {
    SlicedParameters slice(full_, slices_[static_cast<size_t>(q)]);
    size_t at = slices_[static_cast<size_t>(q)].begin;
    for (size_t p = 0; p < slice.count(); ++p) {
      copy(slice, p, at);
      at += slice.numel(p);
    }
  };
  std::vector<float> whole = TakeFloats(total_);
  for_each_piece(rank_, [&](SlicedParameters& slice, size_t p, size_t at) {
    slice.CopyOut(p, std::span(whole).subspan(at, slice.numel(p)));
  });
  const SliceRange own = slices_[static_cast<size_t>(rank_)];
  Status gathered =
      GatherWhole(std::span<const float>(whole).subspan(own.begin, own.size()), whole);
  if (gathered.ok()) {
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      for_each_piece(q, [&](SlicedParameters& slice, size_t p, size_t at) {
        slice.CopyIn(p, std::span<const float>(whole).subspan(at, slice.numel(p)));
      });
    }
  }
  GiveBack(std::move(whole));
  return gathered;
}

Status LearnerGroup::GatherWhole(std::span<const float> slice, std::span<float> whole) {
  size_t widest = 0;
  for (const SliceRange& range : slices_) widest = std::max(widest, range.size());
  std::vector<float> mine = TakeFloats(widest);
  std::fill(std::copy(slice.begin(), slice.end(), mine.begin()), mine.end(), 0.0f);
  StatusOr<std::vector<std::byte>> all = Gather(std::as_bytes(std::span<const float>(mine)));
  GiveBack(std::move(mine));
  MEND_RETURN_IF_ERROR(all.status());
  const float* gathered = reinterpret_cast<const float*>(all->data());
  for (int q = 0; q < size_; ++q) {
    const SliceRange range = slices_[static_cast<size_t>(q)];
    std::copy_n(gathered + static_cast<size_t>(q) * widest, range.size(),
                whole.begin() + static_cast<long>(range.begin));
  }
  GiveBack(std::move(*all));
  return OkStatus();
}

StatusOr<std::pair<uint64_t, bool>> LearnerGroup::Compare(uint64_t value) {
  MEND_ASSIGN_OR_RETURN(auto values, GatherValues({value}));
  return std::pair{values[0], std::all_of(values.begin(), values.end(),
                                          [&](uint64_t v) { return v == values[0]; })};
}

StatusOr<std::vector<uint64_t>> LearnerGroup::GatherValues(std::initializer_list<uint64_t> mine) {
  const std::vector<uint64_t> values(mine);
  MEND_ASSIGN_OR_RETURN(auto all, Gather(std::as_bytes(std::span(values))));
  std::vector<uint64_t> gathered(values.size() * static_cast<size_t>(size_));
  std::memcpy(gathered.data(), all.data(), gathered.size() * sizeof(uint64_t));
  return gathered;
}

void LearnerGroup::StopPulse(bool done) {
  if (pulse_) pulse_->Stop(done);
}

void LearnerGroup::Forget() {
  if (rank_ == 0) (void)store_->Delete(base_, /*prefix=*/true);
}

}  // namespace mend::reducer
