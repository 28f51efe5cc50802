#include "reducer/learner_group.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/buffer_pool.h"
#include "core/status_format.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "learner/group_ranks.h"
#include "learner/lighthouse_rendezvous.h"
#include "mend/checkpoint.h"
#include "nlohmann/json.hpp"
#include "reducer/group_round_services.h"
#include "spdlog/spdlog.h"

namespace mend::reducer {
namespace {

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
  std::span<float> Values(size_t i) override {
    const Piece& piece = pieces_[i];
    std::span<float> all = full_.Values(piece.parameter);
    return all.empty() ? all : all.subspan(piece.offset, piece.values);
  }
  void Wrote(size_t i) override { full_.Wrote(pieces_[i].parameter); }

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
  void Adjust(Which which, std::span<const float> target, std::span<const float> snapshot,
              float weight) override {
    scratch_.resize(whole_.size());
    if (!whole_.Read(which, scratch_)) return;
    AdjustMoment(which, std::span(scratch_).subspan(range_.begin, range_.size()), target, snapshot,
                 weight);
    whole_.Replace(which, scratch_);
  }
  void Replace(Which which, std::span<const float> target) override {
    scratch_.resize(whole_.size());
    if (!whole_.Read(which, scratch_)) std::fill(scratch_.begin(), scratch_.end(), 0.0f);
    std::copy(target.begin(), target.end(), scratch_.begin() + static_cast<long>(range_.begin));
    whole_.Replace(which, scratch_);
  }
  double beta(Which which) const override { return whole_.beta(which); }
  uint64_t step() const override { return whole_.step(); }
  void set_step(uint64_t step) override { whole_.set_step(step); }

 private:
  FlatMoments& whole_;
  const SliceRange range_;
  mutable std::vector<float> scratch_;
};

}  // namespace

Status AwaitGroupRanks(RendezvousStore& store, RendezvousStore* told, const Clock& clock,
                       const Config& config, const std::string& learner_id,
                       const std::string& prefix) {
  return ShareWithGroupRanks(store, told, clock, config, learner_id, prefix + "here/", "1",
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
      decisions_(std::move(decisions)),
      decision_margin_(config.collective_timeout_ms * kMicrosPerMilli),
      store_(std::move(store)) {
  for (size_t i = 0; i < full.count(); ++i) total_ += full.numel(i);
  for (int r = 0; r < size_; ++r) slices_.push_back(SliceOf(total_, size_, r));
}

LearnerGroup::~LearnerGroup() = default;

std::unique_ptr<RoundServices> LearnerGroup::RoundServicesOver(std::unique_ptr<RoundServices> own) {
  return GroupRoundServices(std::move(own), std::move(decisions_), base_, rank_, decision_margin_,
                            inner_.id());
}

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
  LighthouseRendezvousStore told(agent.client(), agent.clock());
  MEND_RETURN_IF_ERROR(
      AwaitGroupRanks(*group->store_, &told, agent.clock(), config, agent.id(), options.prefix));
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
