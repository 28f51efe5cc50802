// The Gloo communicator's gathers: a sparse codec's (WeightedAllGatherDecode,
// MergeAllGatherDecode) and bytes' (AllGather).
#include <algorithm>
#include <array>

#include "dataplane/gloo_communicator.h"
#include "dataplane/left_out.h"
#include "fmt/format.h"

namespace mend::dataplane {

Status GlooCommunicator::WeightedAllGatherDecodeImpl(std::span<const std::byte> payload,
                                                     double weight, const Codec& codec,
                                                     std::span<float> out, GatherMerge* merge) {
  Op op;
  MEND_RETURN_IF_ERROR(Begin("all-gather-decode", &op));
  if (payload.size() != codec.EncodedBytes(out.size())) {
    return InvalidArgumentError(
        fmt::format("round {}: all-gather-decode: payload of {} bytes; {} values of {} take {}",
                    options_.round_id, payload.size(), out.size(), CodecName(codec.kind()),
                    codec.EncodedBytes(out.size())));
  }
  // Each member's weight, sum of squares and payload size beside the
  // payloads (one protocol whether or not its members leave anyone out),
  // whose slots carry a salt of the size (see MakeSlot).
  op.salt = SizeSalt(payload.size());
  const std::array<double, 3> mine{weight, merge != nullptr ? merge->squares : 0.0,
                                   static_cast<double>(payload.size())};
  std::vector<double> gathered(mine.size() * static_cast<size_t>(options_.world_size));
  std::vector<Transfer> weighing, transfers;
  PostGather(op, kWeights, std::as_bytes(std::span(mine)),
             std::as_writable_bytes(std::span(gathered)), weighing);
  Reserve(recv_scratch_, payload.size() * options_.world_size);
  PostGather(op, kAllGather, payload, recv_scratch_, transfers);
  Status weighed = WaitAll(op, weighing);
  if (!weighed.ok()) return End(op, weighed);
  MEND_RETURN_IF_ERROR(SameSizes(op, gathered, mine.size(), payload.size(), "bytes of payload"));
  Status gathered_all = WaitAll(op, transfers);
  if (!gathered_all.ok()) return End(op, gathered_all);
  std::vector<double> all_weights = Column(gathered, mine.size(), 0);
  const std::vector<double> all_squares = Column(gathered, mine.size(), 1);
  std::vector<char> left(all_weights.size(), 0);
  std::vector<std::byte> zeros;  // the codec's encoding of zeros
  if (merge != nullptr) {
    merge->left_out = LeftOut(merge->leave_out, all_squares, all_weights);
    for (int r : merge->left_out) {
      left[static_cast<size_t>(r)] = 1;
      all_weights[static_cast<size_t>(r)] = 0;
    }
    if (!merge->left_out.empty()) {
      zeros.resize(payload.size());
      codec.Encode(std::vector<float>(out.size(), 0.0f), zeros);
    }
  }
  auto weights = NormalizeWeights(op, all_weights);
  if (!weights.ok()) return End(op, weights.status());
  std::fill(out.begin(), out.end(), 0.0f);
  for (int r = 0; r < options_.world_size; ++r) {
    const std::byte* piece = left[static_cast<size_t>(r)] != 0
                                 ? zeros.data()
                                 : recv_scratch_.data() + r * payload.size();
    codec.DecodeAccumulate(std::span(piece, payload.size()), (*weights)[r], out);
  }
  return End(op, OkStatus());
}

Status GlooCommunicator::AllGatherImpl(std::span<const std::byte> mine, std::span<std::byte> out) {
  Op op;
  MEND_RETURN_IF_ERROR(Begin("all-gather", &op));
  // (Members of other sizes never meet: their collective times out.)
  op.salt = SizeSalt(mine.size());
  if (out.size() != mine.size() * options_.world_size) {
    return InvalidArgumentError(fmt::format("round {}: all-gather: output of {} bytes for {} x {}",
                                            options_.round_id, out.size(), options_.world_size,
                                            mine.size()));
  }
  return End(op, GatherBytes(op, kAllGather, mine, out));
}

}  // namespace mend::dataplane
