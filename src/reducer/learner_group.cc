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

// A piece's values out of, or into, its parameter of `full`; `scratch`
// holds the whole parameter when the piece is only part of it.
void CopyPieceOut(const FlatParameters& full, const ParameterPiece& piece, std::span<float> out,
                  std::vector<float>& scratch) {
  if (piece.offset == 0 && piece.values == full.numel(piece.parameter))
    return full.CopyOut(piece.parameter, out);
  scratch.resize(full.numel(piece.parameter));
  full.CopyOut(piece.parameter, scratch);
  std::memcpy(out.data(), scratch.data() + piece.offset, piece.values * sizeof(float));
}

void CopyPieceIn(FlatParameters& full, const ParameterPiece& piece, std::span<const float> in,
                 std::vector<float>& scratch) {
  if (piece.offset == 0 && piece.values == full.numel(piece.parameter))
    return full.CopyIn(piece.parameter, in);
  scratch.resize(full.numel(piece.parameter));
  full.CopyOut(piece.parameter, scratch);
  std::memcpy(scratch.data() + piece.offset, in.data(), piece.values * sizeof(float));
  full.CopyIn(piece.parameter, scratch);
}

// The pieces of a model's parameters that a rank exchanges, each a flat
// run of values (GroupLayout::own).
class SlicedParameters final : public FlatParameters {
 public:
  SlicedParameters(FlatParameters& full, const std::vector<ParameterPiece>& pieces) : full_(full) {
    for (const ParameterPiece& piece : pieces) {
      pieces_.push_back({piece, fmt::format("{}[{}:{}]", full.name(piece.parameter), piece.offset,
                                            piece.offset + piece.values)});
    }
  }
  size_t count() const override { return pieces_.size(); }
  const std::string& name(size_t i) const override { return pieces_[i].name; }
  std::vector<int64_t> shape(size_t i) const override {
    return {static_cast<int64_t>(pieces_[i].piece.values)};
  }
  size_t numel(size_t i) const override { return pieces_[i].piece.values; }
  size_t layer(size_t i) const override { return full_.layer(pieces_[i].piece.parameter); }
  void CopyOut(size_t i, std::span<float> out) const override {
    CopyPieceOut(full_, pieces_[i].piece, out, scratch_);
  }
  void CopyIn(size_t i, std::span<const float> in) override {
    CopyPieceIn(full_, pieces_[i].piece, in, scratch_);
  }
  std::span<float> Values(size_t i) override {
    const ParameterPiece& piece = pieces_[i].piece;
    std::span<float> all = full_.Values(piece.parameter);
    return all.empty() ? all : all.subspan(piece.offset, piece.values);
  }
  void Wrote(size_t i) override { full_.Wrote(pieces_[i].piece.parameter); }

 private:
  struct Named {
    ParameterPiece piece;
    std::string name;
  };
  FlatParameters& full_;
  std::vector<Named> pieces_;
  mutable std::vector<float> scratch_;
};

// The same pieces of a whole model's moments: `ranges` of its flat values.
class SlicedMoments final : public FlatMoments {
 public:
  SlicedMoments(FlatMoments& whole, std::vector<SliceRange> ranges)
      : whole_(whole), ranges_(std::move(ranges)) {
    for (const SliceRange& range : ranges_) size_ += range.size();
  }
  size_t size() const override { return size_; }
  bool Read(Which which, std::span<float> out) const override {
    scratch_.resize(whole_.size());
    if (!whole_.Read(which, scratch_)) return false;
    size_t at = 0;
    for (const SliceRange& range : ranges_) {
      std::copy_n(scratch_.begin() + static_cast<long>(range.begin), range.size(),
                  out.begin() + static_cast<long>(at));
      at += range.size();
    }
    return true;
  }
  void Adjust(Which which, std::span<const float> target, std::span<const float> snapshot,
              float weight) override {
    scratch_.resize(whole_.size());
    if (!whole_.Read(which, scratch_)) return;
    size_t at = 0;
    for (const SliceRange& range : ranges_) {
      AdjustMoment(which, std::span(scratch_).subspan(range.begin, range.size()),
                   target.subspan(at, range.size()), snapshot.subspan(at, range.size()), weight);
      at += range.size();
    }
    whole_.Replace(which, scratch_);
  }
  void Replace(Which which, std::span<const float> target) override {
    scratch_.resize(whole_.size());
    if (!whole_.Read(which, scratch_)) std::fill(scratch_.begin(), scratch_.end(), 0.0f);
    size_t at = 0;
    for (const SliceRange& range : ranges_) {
      std::copy_n(target.begin() + static_cast<long>(at), range.size(),
                  scratch_.begin() + static_cast<long>(range.begin));
      at += range.size();
    }
    whole_.Replace(which, scratch_);
  }
  double beta(Which which) const override { return whole_.beta(which); }
  uint64_t step() const override { return whole_.step(); }
  void set_step(uint64_t step) override { whole_.set_step(step); }

 private:
  FlatMoments& whole_;
  const std::vector<SliceRange> ranges_;
  size_t size_ = 0;
  mutable std::vector<float> scratch_;
};

}  // namespace

Status AwaitGroupRanks(RendezvousStore& store, RendezvousStore* told, const LearnerAgent& agent,
                       const std::string& prefix) {
  return ShareWithGroupRanks(store, told, agent.clock(), agent.options(), agent.id(),
                             prefix + "here/", "1",
                             /*only_rank0_waits=*/false, " did not start")
      .status();
}

LearnerGroup::LearnerGroup(const RoundOptions& rounds, LearnerAgent& agent, FlatParameters& full,
                           std::string base, std::unique_ptr<RendezvousStore> store,
                           std::unique_ptr<RendezvousStore> decisions)
    : size_(static_cast<int>(agent.options().group_size)),
      rank_(static_cast<int>(agent.options().group_rank)),
      base_(std::move(base)),
      inner_(agent),
      full_(full),
      decisions_(std::move(decisions)),
      decision_margin_(rounds.communicator.timeout),
      store_(std::move(store)) {
  prefix_.push_back(0);
  for (size_t i = 0; i < full.count(); ++i) prefix_.push_back(prefix_.back() + full.numel(i));
}

LearnerGroup::~LearnerGroup() = default;

std::unique_ptr<RoundServices> LearnerGroup::RoundServicesOver(std::unique_ptr<RoundServices> own) {
  return GroupRoundServices(std::move(own), std::move(decisions_), base_, rank_, decision_margin_,
                            inner_.id());
}

StatusOr<std::unique_ptr<LearnerGroup>> LearnerGroup::Join(const RoundOptions& rounds,
                                                           LearnerAgent& agent,
                                                           FlatParameters& full) {
  std::string base = GroupStorePrefix(agent.options(), agent.id());
  MEND_ASSIGN_OR_RETURN(std::unique_ptr<RendezvousStore> decisions, agent.OpenGroupStore());
  MEND_ASSIGN_OR_RETURN(std::unique_ptr<RendezvousStore> store, agent.OpenGroupStore());
  std::unique_ptr<LearnerGroup> group(
      new LearnerGroup(rounds, agent, full, base, std::move(store), std::move(decisions)));
  CommunicatorOptions options = rounds.communicator;
  options.link = {};  // inside the rack: the emulated cross-rack link is not on this path
  options.prefix = base + "ctx/";
  options.secret = agent.data_plane_secret();
  options.rank = group->rank_;
  options.world_size = group->size_;
  for (int r = 0; r < group->size_; ++r)
    options.member_ids.push_back(fmt::format("{} rank {}", agent.id(), r));
  LighthouseRendezvousStore told(agent.client(), agent.clock());
  MEND_RETURN_IF_ERROR(AwaitGroupRanks(*group->store_, &told, agent, options.prefix));
  auto comm = Communicator::Connect(*group->store_, options);
  if (!comm.ok()) {
    return Status(comm.status().code(),
                  fmt::format("learner '{}' group rank {} of {}: the group's own communicator: {}",
                              agent.id(), group->rank_, group->size_, comm.status().message()));
  }
  group->comm_ = std::move(*comm);
  MEND_RETURN_IF_ERROR(group->CheckSameModel());
  MEND_RETURN_IF_ERROR(group->GatherLayout());
  MEND_RETURN_IF_ERROR(group->ConnectSets(options));
  if (group->layout_.sharded() && !rounds.checkpoints.dir.empty()) {
    return FailedPreconditionError(fmt::format(
        "learner '{}': checkpoint_dir with a model sharded over the group's ranks: its files hold "
        "a whole model, which no rank holds here; save the model, the optimizer and "
        "runtime.state_dict() with torch.distributed.checkpoint instead (each rank its own "
        "shards, resharded on a load with another rank count)",
        agent.id()));
  }
  MEND_ASSIGN_OR_RETURN(std::unique_ptr<RendezvousStore> pulse_store, agent.OpenGroupStore());
  group->pulse_ =
      std::make_unique<GroupPulse>(std::move(pulse_store), group->base_, group->rank_, group->size_,
                                   agent, agent.options().heartbeat_ms * kMicrosPerMilli,
                                   agent.options().heartbeat_timeout_ms * kMicrosPerMilli);
  spdlog::info(
      "learner '{}': group rank {} of {}, exchanges {} of its {} values ({}; {} shared with "
      "other ranks after a round)",
      agent.id(), group->rank_, group->size_, group->layout_.own_values(), group->prefix_.back(),
      group->layout_.sharded() ? "a model sharded over the group" : "a replica of the model",
      group->layout_.contributions(group->rank_).empty()
          ? 0
          : group->layout_.contributions(group->rank_).back().at +
                group->layout_.contributions(group->rank_).back().slice.size());
  return group;
}

Status LearnerGroup::CheckSameModel() {
  // Names on every rank; shapes where every rank holds the whole parameter
  // (a shard's shape is its own: GatherLayout checks who holds what).
  std::string layout;
  for (size_t i = 0; i < full_.count(); ++i) {
    layout += full_.name(i);
    if (full_.replica_key(i) == 0) layout += fmt::format(" {}", fmt::join(full_.shape(i), "x"));
    layout += "\n";
  }
  const std::array<unsigned char, 32> mine = Sha256Digest(layout.data(), layout.size());
  MEND_ASSIGN_OR_RETURN(auto all, Gather(std::as_bytes(std::span(mine))));
  for (int q = 0; q < size_; ++q) {
    if (std::memcmp(all.data() + static_cast<size_t>(q) * mine.size(), mine.data(), mine.size()) !=
        0) {
      return InvalidArgumentError(
          fmt::format("learner '{}': group rank {}'s parameters (names and shapes) differ from "
                      "group rank {}'s ({} parameters, "
                      "{} values); every rank of a learner must hold the same model",
                      inner_.id(), q, rank_, full_.count(), prefix_.back()));
    }
  }
  return OkStatus();
}

Status LearnerGroup::GatherLayout() {
  const size_t count = full_.count();
  std::vector<uint64_t> mine(2 * count);
  for (size_t i = 0; i < count; ++i) {
    mine[i] = full_.replica_key(i);
    mine[count + i] = full_.numel(i);
  }
  MEND_ASSIGN_OR_RETURN(auto all, Gather(std::as_bytes(std::span<const uint64_t>(mine))));
  std::vector<std::vector<uint64_t>> keys(static_cast<size_t>(size_)), numels(keys.size());
  for (size_t q = 0; q < keys.size(); ++q) {
    const auto* values = reinterpret_cast<const uint64_t*>(all.data()) + q * 2 * count;
    keys[q].assign(values, values + count);
    numels[q].assign(values + count, values + 2 * count);
  }
  GiveBack(std::move(all));
  auto layout = GroupLayout::Make(rank_, keys, numels);
  if (!layout.ok()) {
    return InvalidArgumentError(fmt::format("learner '{}' group rank {}: {}", inner_.id(), rank_,
                                            layout.status().message()));
  }
  layout_ = std::move(*layout);
  return OkStatus();
}

std::unique_ptr<FlatParameters> LearnerGroup::Slice() {
  return std::make_unique<SlicedParameters>(full_, layout_.own());
}

std::unique_ptr<FlatMoments> LearnerGroup::Slice(FlatMoments& whole) {
  std::vector<SliceRange> ranges;
  for (const ParameterPiece& piece : layout_.own()) {
    const size_t at = prefix_[piece.parameter] + piece.offset;
    ranges.push_back({at, at + piece.values});
  }
  return std::make_unique<SlicedMoments>(whole, std::move(ranges));
}

Status LearnerGroup::ShareMoments(FlatMoments& whole) {
  if (layout_.widest_contribution() == 0) return OkStatus();  // (no rank holds another's values)
  std::vector<float> values(whole.size());
  for (auto which : {FlatMoments::kFirst, FlatMoments::kSecond}) {
    if (!whole.Read(which, values)) continue;  // no optimizer state yet: the same on every replica
    MEND_RETURN_IF_ERROR(ShareSlices(
        [&](const ParameterPiece& piece, std::span<float> out) {
          std::copy_n(values.begin() + static_cast<long>(prefix_[piece.parameter] + piece.offset),
                      piece.values, out.begin());
        },
        [&](const ParameterPiece& piece, std::span<const float> in) {
          std::copy(in.begin(), in.end(),
                    values.begin() + static_cast<long>(prefix_[piece.parameter] + piece.offset));
        }));
    whole.Replace(which, values);
  }
  return OkStatus();
}

std::string LearnerGroup::SlicePrefix(const std::string& round_prefix) const {
  return fmt::format("{}slice{}/", round_prefix, rank_);
}

StatusOr<std::vector<std::byte>> LearnerGroup::Gather(std::span<const std::byte> mine,
                                                      Communicator* among) {
  Communicator& comm = among != nullptr ? *among : *comm_;
  std::vector<std::byte> all = TakeBytes(mine.size() * static_cast<size_t>(comm.world_size()));
  Status status = comm.AllGather(mine, all);
  if (!status.ok()) {
    return Status(status.code(),
                  fmt::format("learner '{}' group rank {}: a rank of this group is gone: {}",
                              inner_.id(), rank_, status.message()));
  }
  return all;
}

uint64_t LearnerGroup::bytes_sent() const {
  uint64_t sent = comm_ ? comm_->stats().bytes_sent : 0;
  for (const auto& comm : set_comms_) sent += comm ? comm->stats().bytes_sent : 0;
  return sent;
}

Status LearnerGroup::ConnectSets(const CommunicatorOptions& group) {
  // (Every member connects its sets in set order, so that no two wait on
  // each other.)
  set_comms_.resize(layout_.sets().size());
  for (size_t s = 0; s < layout_.sets().size(); ++s) {
    const std::vector<int>& members = layout_.sets()[s].members;
    const auto member = std::find(members.begin(), members.end(), rank_);
    if (members.size() < 2 || members.size() == static_cast<size_t>(size_) ||
        member == members.end()) {
      continue;  // (none to share with, or every rank: the group's communicator)
    }
    CommunicatorOptions options = group;
    options.prefix = fmt::format("{}set{}/", base_, s);
    options.rank = static_cast<int>(member - members.begin());
    options.world_size = static_cast<int>(members.size());
    options.member_ids.clear();
    for (int q : members) options.member_ids.push_back(group.member_ids[static_cast<size_t>(q)]);
    auto comm = Communicator::Connect(*store_, options);
    if (!comm.ok()) {
      return Status(
          comm.status().code(),
          fmt::format("learner '{}' group rank {}: the communicator of group ranks {} "
                      "(who hold the same pieces of the model): {}",
                      inner_.id(), rank_, fmt::join(members, ", "), comm.status().message()));
    }
    set_comms_[s] = std::move(*comm);
  }
  return OkStatus();
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
  if (layout_.widest_contribution() == 0) return OkStatus();  // (no rank holds another's values)
  std::vector<float> scratch;
  return ShareSlices([&](const ParameterPiece& piece,
                         std::span<float> out) { CopyPieceOut(full_, piece, out, scratch); },
                     [&](const ParameterPiece& piece, std::span<const float> in) {
                       CopyPieceIn(full_, piece, in, scratch);
                     });
}

Status LearnerGroup::ShareSlices(
    const std::function<void(const ParameterPiece&, std::span<float>)>& read,
    const std::function<void(const ParameterPiece&, std::span<const float>)>& write) {
  // Each set of more than one member that this rank is in, in set order
  // (the same on every rank): its members' slices of it gathered among
  // them only, and into this rank the others'.
  const uint64_t sent_before = bytes_sent();
  Status status = OkStatus();
  for (size_t s = 0; s < layout_.sets().size() && status.ok(); ++s) {
    const std::vector<int>& members = layout_.sets()[s].members;
    if (members.size() > 1 && std::find(members.begin(), members.end(), rank_) != members.end())
      status = ShareSet(s, read, write);
  }
  state_bytes_sent_ += bytes_sent() - sent_before;
  return status;
}

Status LearnerGroup::ShareSet(
    size_t set, const std::function<void(const ParameterPiece&, std::span<float>)>& read,
    const std::function<void(const ParameterPiece&, std::span<const float>)>& write) {
  const ReplicaSet& replicas = layout_.sets()[set];
  const int members = static_cast<int>(replicas.members.size());
  // (The slices differ by one value at most: each is sent as long as the longest.)
  size_t widest = 0;
  for (int j = 0; j < members; ++j)
    widest = std::max(widest, SliceOf(replicas.total, members, j).size());
  std::vector<float> mine = TakeFloats(widest);
  std::fill(mine.begin(), mine.end(), 0.0f);
  size_t at = 0;
  for (const ParameterPiece& piece : layout_.SlicePieces(set, rank_)) {
    read(piece, std::span(mine).subspan(at, piece.values));
    at += piece.values;
  }
  StatusOr<std::vector<std::byte>> all =
      Gather(std::as_bytes(std::span<const float>(mine)), set_comms_[set].get());
  GiveBack(std::move(mine));
  MEND_RETURN_IF_ERROR(all.status());
  const auto* gathered = reinterpret_cast<const float*>(all->data());
  for (int j = 0; j < members; ++j) {
    const int q = replicas.members[static_cast<size_t>(j)];
    if (q == rank_) continue;
    at = static_cast<size_t>(j) * widest;
    for (const ParameterPiece& piece : layout_.SlicePieces(set, q)) {
      write(piece, std::span<const float>(gathered + at, piece.values));
      at += piece.values;
    }
  }
  GiveBack(std::move(*all));
  return OkStatus();
}

Status LearnerGroup::GatherOwn(std::span<const float> slice, std::span<float> own) {
  auto at = [&](const ParameterPiece& piece) {
    return own.subspan(prefix_[piece.parameter] + piece.offset, piece.values);
  };
  size_t from = 0;
  for (const ParameterPiece& piece : layout_.own()) {
    std::copy_n(slice.begin() + static_cast<long>(from), piece.values, at(piece).begin());
    from += piece.values;
  }
  if (layout_.widest_contribution() == 0) return OkStatus();  // (no rank holds another's values)
  return ShareSlices(
      [&](const ParameterPiece& piece, std::span<float> out) {
        std::span<const float> values = at(piece);
        std::copy(values.begin(), values.end(), out.begin());
      },
      [&](const ParameterPiece& piece, std::span<const float> in) {
        std::copy(in.begin(), in.end(), at(piece).begin());
      });
}

void LearnerGroup::SliceOwn(std::span<const float> own, std::span<float> slice) const {
  size_t to = 0;
  for (const ParameterPiece& piece : layout_.own()) {
    std::copy_n(own.begin() + static_cast<long>(prefix_[piece.parameter] + piece.offset),
                piece.values, slice.begin() + static_cast<long>(to));
    to += piece.values;
  }
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
