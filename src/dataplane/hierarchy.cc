#include "dataplane/hierarchy.h"

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>

#include "core/status_format.h"
#include "dataplane/left_out.h"
#include "fmt/format.h"

namespace mend {
namespace {

class RackAwareCommunicator final : public Communicator {
 public:
  // `rack` is null for a member alone in its rack, `reps` null for a member
  // that is not its rack's representative; `rack_ranks` / `rep_ranks` map
  // their ranks to the flat ranks.
  // `layout` lists every rack's members (flat ranks, rank order), racks in
  // the representatives' order.
  // With `column` >= 0 every rack has the same size and `reps` is this
  // member's column: the members at its place in every rack (column 0 is
  // the representatives); the cross-rack merge is then split by pieces
  // between the columns, so that every host's link carries a share.
  RackAwareCommunicator(std::unique_ptr<Communicator> flat, std::unique_ptr<Communicator> rack,
                        std::unique_ptr<Communicator> reps, std::vector<int> rack_ranks,
                        std::vector<int> rep_ranks, std::vector<std::vector<int>> layout,
                        int column)
      : flat_(std::move(flat)),
        rack_(std::move(rack)),
        reps_(std::move(reps)),
        rack_ranks_(std::move(rack_ranks)),
        rep_ranks_(std::move(rep_ranks)),
        layout_(std::move(layout)),
        column_(column) {
    for (const auto& members : layout_) widest_rack_ = std::max(widest_rack_, members.size());
  }

  Status WeightedAllReduce(std::span<float> data, double weight, const Codec* codec) override {
    // fp32: the flat merge's arithmetic, split (Fp32AllReduce): each rack's
    // weighted sum, then the racks' sums added and divided by the total
    // weight. The flat communicator sums by rack (member_racks) the same
    // way, so both give the same bits.
    const bool fp32 = codec == nullptr || codec->kind() == CodecKind::kFp32;
    double rack_weight = weight;
    if (rack_) {
      // 1. The rack's total weight, and its weighted sum (fp32) or weighted
      //    mean (a codec's).
      std::vector<double> weights(static_cast<size_t>(rack_->world_size()));
      MEND_RETURN_IF_ERROR(rack_->AllGather(std::as_bytes(std::span(&weight, 1)),
                                            std::as_writable_bytes(std::span(weights))));
      rack_weight = std::accumulate(weights.begin(), weights.end(), 0.0);
      if (rack_weight > 0) {
        MEND_RETURN_IF_ERROR(fp32 ? rack_->Fp32AllReduce(data, weight, Fp32Sum::kWeightedSum)
                                  : rack_->WeightedAllReduce(data, weight, nullptr));
      } else {
        std::fill(data.begin(), data.end(), 0.0f);
      }
    } else if (fp32) {
      // Alone in its rack: its weighted sum is w * x, as the flat sum has it.
      const float w = static_cast<float>(weight);
      for (float& v : data) v = w * v;
    }
    // Across racks: the racks' sums (fp32) or means (a codec's), weighted
    // by the racks' total weights.
    auto across = [&](std::span<float> part) {
      return fp32 ? reps_->Fp32AllReduce(part, rack_weight, Fp32Sum::kPreWeighted)
                  : reps_->WeightedAllReduce(part, rack_weight, codec);
    };
    if (column_ >= 0) {
      // 2. Across racks, column by column: piece j of the racks' means.
      const size_t parts = static_cast<size_t>(rack_->world_size());
      auto piece = [&](size_t j) {
        return std::pair{data.size() * j / parts, data.size() * (j + 1) / parts};
      };
      const auto [begin, end] = piece(static_cast<size_t>(column_));
      MEND_RETURN_IF_ERROR(across(data.subspan(begin, end - begin)));
      // 3. Every piece to the whole rack.
      const size_t widest = data.size() / parts + 1;
      std::vector<float> mine(widest, 0.0f);
      std::copy(data.begin() + static_cast<long>(begin), data.begin() + static_cast<long>(end),
                mine.begin());
      std::vector<float> all(widest * parts);
      MEND_RETURN_IF_ERROR(rack_->AllGather(std::as_bytes(std::span<const float>(mine)),
                                            std::as_writable_bytes(std::span(all))));
      for (size_t j = 0; j < parts; ++j) {
        const auto [from, to] = piece(j);
        std::copy_n(all.begin() + static_cast<long>(j * widest), to - from,
                    data.begin() + static_cast<long>(from));
      }
      return OkStatus();
    }
    // 2. Across racks, the representatives: the racks' means by their weights.
    if (reps_) MEND_RETURN_IF_ERROR(across(data));
    // 3. The representative's bits to the rest of its rack.
    if (rack_) MEND_RETURN_IF_ERROR(rack_->Broadcast(std::as_writable_bytes(data), 0));
    return OkStatus();
  }

  Status WeightedAllGatherDecode(std::span<const std::byte> payload, double weight,
                                 const Codec& codec, std::span<float> out) override {
    return flat_->WeightedAllGatherDecode(payload, weight, codec, out);
  }
  // A round's merge (Communicator::MergeAllReduce) through the racks, with
  // every member's sum of squares, weight and whether it makes its values
  // gathered directly between all the members on the flat communicator:
  // one cross-rack collective, which for members that make their values
  // (fp32) runs on a thread of its own beside the reduction rather than
  // before it. The reduction counts every member in; when the rule then
  // leaves one out, every member reduces again, those left out with zeros
  // and weight 0 (the makers make again, a member that gave its values
  // reduced zeros the first time, knowing then that a second reduction
  // follows). When every member gives its values the gather comes first and
  // those left out are left out of the one reduction. The bits are the base
  // class's, whose gather and reduction both run through the racks, one
  // after the other.
  StatusOr<Merged> MergeAllReduce(std::span<float> data, double weight,
                                  const MergeValues& values) override {
    const bool fp32 = values.codec == nullptr || values.codec->kind() == CodecKind::kFp32;
    if (values.make != nullptr && !fp32)
      return InvalidArgumentError("all-reduce: made values are fp32 only");
    const bool makes = values.make != nullptr;
    Merged merged;
    merged.squares = makes ? (*values.make)(0, data.size()) : values.squares;
    MemberNorms norms(merged.squares, weight, flat_->world_size(), makes);
    if (makes) {
      MEND_RETURN_IF_ERROR(ReduceBesideGather(data, weight, values.codec, norms));
      merged.left_out = norms.LeftOut(values.leave_out);
      if (merged.left_out.empty()) return merged;
      if (!LeaveMeOut(merged.left_out, data, weight)) (*values.make)(0, data.size());
      MEND_RETURN_IF_ERROR(WeightedAllReduce(data, weight, values.codec));
      return merged;
    }
    MEND_RETURN_IF_ERROR(norms.Gather(*flat_));
    merged.left_out = norms.LeftOut(values.leave_out);
    if (norms.AnyMade() && !fp32) {
      // Every member of a reduction runs one protocol; a maker's is fp32's.
      return InvalidArgumentError(
          fmt::format("all-reduce: a member made its fp32 values while this one encodes with {}",
                      CodecName(values.codec->kind())));
    }
    if (norms.AnyMade() && !merged.left_out.empty()) {
      // The makers' first reduction counts everyone in and is done again:
      // this member's part in it is zeros, its values kept for the second.
      std::vector<float> zeros(data.size(), 0.0f);
      MEND_RETURN_IF_ERROR(WeightedAllReduce(zeros, weight, values.codec));
    }
    (void)LeaveMeOut(merged.left_out, data, weight);
    MEND_RETURN_IF_ERROR(WeightedAllReduce(data, weight, values.codec));
    return merged;
  }
  StatusOr<std::vector<int>> MergeAllGatherDecode(std::span<const std::byte> payload, double weight,
                                                  double squares, const LeaveOut* leave_out,
                                                  const Codec& codec,
                                                  std::span<float> out) override {
    return flat_->MergeAllGatherDecode(payload, weight, squares, leave_out, codec, out);
  }
  // The same three steps: the rack's pieces, the racks' blocks (padded to
  // the widest rack) between the representatives, all of it in the rack;
  // then into flat rank order.
  Status AllGather(std::span<const std::byte> mine, std::span<std::byte> out) override {
    const size_t m = mine.size();
    std::vector<std::byte> block(widest_rack_ * m);
    if (rack_) {
      MEND_RETURN_IF_ERROR(rack_->AllGather(
          mine, std::span(block).first(static_cast<size_t>(rack_->world_size()) * m)));
    } else {
      std::copy(mine.begin(), mine.end(), block.begin());
    }
    std::vector<std::byte> all(layout_.size() * block.size());
    if (reps_ && column_ <= 0)
      MEND_RETURN_IF_ERROR(reps_->AllGather(block, all));  // the representatives
    if (rack_) MEND_RETURN_IF_ERROR(rack_->Broadcast(all, 0));
    for (size_t k = 0; k < layout_.size(); ++k) {
      for (size_t j = 0; j < layout_[k].size(); ++j) {
        const std::byte* from = all.data() + (k * widest_rack_ + j) * m;
        std::copy(from, from + m, out.data() + static_cast<size_t>(layout_[k][j]) * m);
      }
    }
    return OkStatus();
  }
  Status Broadcast(std::span<std::byte> data, int root) override {
    return flat_->Broadcast(data, root);
  }
  void Abort(const std::string& reason) override {
    flat_->Abort(reason);
    if (rack_) rack_->Abort(reason);
    if (reps_) reps_->Abort(reason);
  }
  int rank() const override { return flat_->rank(); }
  int world_size() const override { return flat_->world_size(); }
  bool broken() const override {
    return flat_->broken() || (rack_ && rack_->broken()) || (reps_ && reps_->broken());
  }
  // All three together; bytes_sent_to by the flat ranks.
  CommunicatorStats stats() const override {
    CommunicatorStats total = flat_->stats();
    total.bytes_sent_to.resize(static_cast<size_t>(flat_->world_size()), 0);
    auto add = [&total](const Communicator* comm, const std::vector<int>& ranks) {
      if (!comm) return;
      const CommunicatorStats part = comm->stats();
      total.bytes_sent += part.bytes_sent;
      total.bytes_received += part.bytes_received;
      total.operations += part.operations;
      for (size_t p = 0; p < part.bytes_sent_to.size() && p < ranks.size(); ++p) {
        total.bytes_sent_to[static_cast<size_t>(ranks[p])] += part.bytes_sent_to[p];
      }
    };
    add(rack_.get(), rack_ranks_);
    add(reps_.get(), rep_ranks_);
    return total;
  }

 private:
  // The reduction of a member that makes its values, with the members'
  // norms gathered beside it on a thread of its own; the first to fail ends
  // the other, and its status is the merge's.
  Status ReduceBesideGather(std::span<float> data, double weight, const Codec* codec,
                            MemberNorms& norms) {
    std::mutex failed_mu;
    Status failed = OkStatus();
    auto fail = [&](const Status& status, const std::vector<Communicator*>& others) {
      {
        std::lock_guard lock(failed_mu);
        if (!failed.ok()) return;
        failed = status;
      }
      for (Communicator* other : others)
        if (other != nullptr) other->Abort(std::string(status.message()));
    };
    std::thread gather([&]() {
      if (Status status = norms.Gather(*flat_); !status.ok())
        fail(status, {rack_.get(), reps_.get()});
    });
    if (Status status = WeightedAllReduce(data, weight, codec); !status.ok())
      fail(status, {flat_.get()});
    gather.join();
    return failed;
  }
  // Zeros with weight 0 when the rule left this member out (true then).
  bool LeaveMeOut(const std::vector<int>& left_out, std::span<float> data, double& weight) const {
    if (!std::binary_search(left_out.begin(), left_out.end(), rank())) return false;
    std::fill(data.begin(), data.end(), 0.0f);
    weight = 0;
    return true;
  }

  std::unique_ptr<Communicator> flat_;
  std::unique_ptr<Communicator> rack_;
  std::unique_ptr<Communicator> reps_;
  std::vector<int> rack_ranks_;
  std::vector<int> rep_ranks_;
  std::vector<std::vector<int>> layout_;
  const int column_;  // -1: representatives only
  size_t widest_rack_ = 1;
};

}  // namespace

std::vector<std::vector<int>> MembersByRack(const std::vector<std::string>& racks) {
  std::map<std::string, std::vector<int>> by_rack;
  for (size_t r = 0; r < racks.size(); ++r) by_rack[racks[r]].push_back(static_cast<int>(r));
  std::vector<std::vector<int>> layout;
  for (auto& [name, members] : by_rack) layout.push_back(std::move(members));
  return layout;
}

namespace {

// The options of a communicator among `ranks` of the flat one's members
// (this member at `rank` of them), under `prefix`: in rank order (one rack,
// or one member per rack), the members named as in the flat one.
CommunicatorOptions SubsetOptions(const CommunicatorOptions& options, std::string prefix, int rank,
                                  const std::vector<int>& ranks) {
  CommunicatorOptions o = options;
  o.member_racks.clear();
  o.prefix = std::move(prefix);
  o.rank = rank;
  o.world_size = static_cast<int>(ranks.size());
  o.member_ids.clear();
  for (int r : ranks) {
    o.member_ids.push_back(static_cast<size_t>(r) < options.member_ids.size()
                               ? options.member_ids[static_cast<size_t>(r)]
                               : fmt::format("member {}", r));
  }
  return o;
}

}  // namespace

StatusOr<std::unique_ptr<Communicator>> ConnectRackAware(RendezvousStore& store,
                                                         const CommunicatorOptions& options,
                                                         std::unique_ptr<Communicator> flat,
                                                         const std::vector<std::string>& racks) {
  if (racks.size() != static_cast<size_t>(flat->world_size())) return flat;
  std::vector<std::vector<int>> layout = MembersByRack(racks);
  const bool shared = std::any_of(layout.begin(), layout.end(),
                                  [](const auto& members) { return members.size() > 1; });
  if (layout.size() < 2 || !shared) return flat;
  const int me = flat->rank();
  std::vector<int> reps;
  size_t my_index = 0;
  for (const auto& members : layout) {
    if (std::find(members.begin(), members.end(), me) != members.end()) my_index = reps.size();
    reps.push_back(members.front());
  }
  std::unique_ptr<Communicator> rack;
  const std::vector<int>& mates = layout[my_index];
  if (mates.size() > 1) {
    CommunicatorOptions o = SubsetOptions(
        options, fmt::format("{}rack/{}/", options.prefix, my_index),
        static_cast<int>(std::find(mates.begin(), mates.end(), me) - mates.begin()), mates);
    o.link = {};  // inside the rack
    MEND_ASSIGN_OR_RETURN(rack, Communicator::Connect(store, o));
  }
  // Racks of one size share the cross-rack merge by columns (the members at
  // the same place in every rack); otherwise the representatives carry it.
  const bool even = std::all_of(layout.begin(), layout.end(), [&](const std::vector<int>& members) {
    return members.size() == mates.size();
  });
  const int column =
      even ? static_cast<int>(std::find(mates.begin(), mates.end(), me) - mates.begin()) : -1;
  std::vector<int> crossing;  // the flat ranks of this member's cross-rack communicator
  if (even) {
    for (const auto& members : layout) crossing.push_back(members[static_cast<size_t>(column)]);
  } else if (mates.front() == me) {
    crossing = reps;
  }
  std::unique_ptr<Communicator> representatives;
  if (!crossing.empty()) {
    const std::string prefix =
        even ? fmt::format("{}col/{}/", options.prefix, column) : options.prefix + "reps/";
    MEND_ASSIGN_OR_RETURN(
        representatives,
        Communicator::Connect(
            store, SubsetOptions(options, prefix, static_cast<int>(my_index), crossing)));
  }
  return std::unique_ptr<Communicator>(std::make_unique<RackAwareCommunicator>(
      std::move(flat), std::move(rack), std::move(representatives), mates, crossing,
      std::move(layout), column));
}

}  // namespace mend
