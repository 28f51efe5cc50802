// The Gloo communicator's reduction (WeightedAllReduce, MergeAllReduce;
// the protocol: docs/architecture.md, "Data plane").
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "core/buffer_pool.h"
#include "core/phase_timer.h"
#include "dataplane/gloo_communicator.h"
#include "dataplane/left_out.h"
#include "dataplane/slicing.h"
#include "dataplane/weighted_sum.h"
#include "fmt/format.h"

namespace mend::dataplane {

// The state of one reduction: how the buffer is cut, where each encoded piece
// lives, and the transfers in flight.
struct GlooCommunicator::Reduction {
  Reduction(std::span<float> values, const Codec& c, int members, size_t segment_values)
      : data(values),
        codec(c),
        raw(c.kind() == CodecKind::kFp32),
        slicing(values.size(), members, c.alignment(), segment_values),
        layout(slicing, c),
        scatter(slicing.segments()),
        contributions_in(slicing.segments()),
        gather(slicing.segments()),
        results_in(slicing.segments()),
        ahead(std::min<size_t>(slicing.segments(), kReceiveWindow)) {}

  std::span<float> data;
  const Codec& codec;
  const bool raw;  // fp32: pieces travel straight from and into `data`
  Slicing slicing;
  EncodedLayout layout;
  // fp32: the others' pieces of our slice land in `window` slots per peer
  // of `slot_bytes` each, segment s in slot s % window; segment s +
  // window's receives are posted once segment s was summed. So the scratch
  // is a few segments, not a slice, however large the buffer.
  size_t window = 0;
  size_t slot_bytes = 0;
  // The transfers, by segment. A member's pieces are sent (made first,
  // for made values) at most `ahead` segments ahead of its reduction, and
  // its results' sends and receives are waited for `ahead` segments behind
  // it: so a secure data plane's sealed copies (each piece's, until its
  // transfer is waited for) stay a few segments, not a copy of the buffer.
  std::vector<std::vector<Transfer>> scatter;
  std::vector<std::vector<Transfer>> contributions_in;
  std::vector<std::vector<Transfer>> gather;
  std::vector<std::vector<Transfer>> results_in;
  const size_t ahead;
  float scale = 1.0f;                  // fp32: the sum's factor (1 / total weight)
  std::byte* encoded = nullptr;        // our pieces of every slice (codecs)
  std::byte* contributions = nullptr;  // the others' pieces of our slice
  std::byte* results = nullptr;        // every slice's reduced piece (codecs)
  // Segments before `sent` are sent (made values, MergeAllReduce: made
  // first); the sum of the made ones' squares; this member's verdict (its sum of squares)
  // and every member's, gathered after its last segment (when any member
  // makes its values: `any_made`; a member whose values are given sends
  // its verdict at once, and keeps segment s of its values in `kept`
  // before the reduction writes it).
  const MakeValues* make = nullptr;
  size_t sent = 0;
  double squares = 0;
  double verdict = 0;
  bool any_made = false;
  std::vector<float>* kept = nullptr;
  std::vector<double> verdicts;
  std::vector<Transfer> verdicts_in;
  // Members left out before the sums (every member's values given): their
  // pieces summed as `zeros` (fp32), or as `zeros` encoded (a codec's:
  // `zero_piece`, a segment's).
  std::vector<char> zeroed;
  std::vector<float> zeros;
  std::vector<std::byte> zero_piece;
};

Status GlooCommunicator::WeightedAllReduceImpl(std::span<float> data, double weight,
                                               const Codec* codec, Fp32Sum sum, Made* made) {
  const MakeValues* make = made != nullptr ? made->in.make : nullptr;
  Op op;
  MEND_RETURN_IF_ERROR(Begin("all-reduce", &op));
  std::unique_ptr<Codec> fp32;
  if (codec == nullptr) {
    fp32 = std::move(*MakeCodec(CodecOptions{}));
    codec = fp32.get();
  }
  MEND_RETURN_IF_ERROR(CheckCodec(*codec, sum));
  // The weights travel beside the first pieces rather than a round trip
  // ahead of them, each with whether its member makes its values, the sum
  // of squares of values given, and the buffer's size (whose salt the
  // pieces' slots carry).
  op.salt = SizeSalt(data.size());
  const std::array<double, 4> mine{weight, make != nullptr ? 1.0 : 0.0,
                                   made != nullptr && make == nullptr ? made->in.squares : 0.0,
                                   static_cast<double>(data.size())};
  std::vector<double> gathered(mine.size() * static_cast<size_t>(options_.world_size));
  std::vector<Transfer> weight_transfers;
  PostGather(op, kWeights, std::as_bytes(std::span(mine)),
             std::as_writable_bytes(std::span(gathered)), weight_transfers);
  Reduction run(data, *codec, options_.world_size, SegmentValues(data.size()));
  if (make != nullptr && !run.raw) {
    return InvalidArgumentError(
        fmt::format("round {}: all-reduce: made values are fp32 only", options_.round_id));
  }
  run.make = make;
  ReserveScratch(run);
  PostScatter(op, run);
  Status weighed = WaitAll(op, weight_transfers);
  if (!weighed.ok()) return End(op, weighed);
  MEND_RETURN_IF_ERROR(SameSizes(op, gathered, mine.size(), data.size(), "values"));
  std::vector<double> all_weights(options_.world_size), all_squares(options_.world_size);
  Status read = ReadGathered(run, gathered, mine.size(), made != nullptr, all_weights, all_squares);
  if (!read.ok()) return End(op, read);
  if (made != nullptr) SetUpMerge(op, run, weight, made, all_weights, all_squares);
  auto weights = NormalizeWeights(op, all_weights);
  if (!weights.ok()) {
    const Status drained = DrainRefused(op, run);
    return End(op, drained.ok() ? weights.status() : drained);
  }
  if (run.raw && (sum != Fp32Sum::kWeightedMean || sum_groups_.size() > 1))
    SetSumFactors(run, sum, all_weights, *weights);
  return End(op, ReduceAll(op, run, *weights, made, all_weights));
}

Status GlooCommunicator::CheckCodec(const Codec& codec, Fp32Sum sum) const {
  if (!codec.dense()) {
    return InvalidArgumentError(
        fmt::format("round {}: all-reduce: codec {} is sparse; use WeightedAllGatherDecode",
                    options_.round_id, CodecName(codec.kind())));
  }
  if (sum != Fp32Sum::kWeightedMean && codec.kind() != CodecKind::kFp32) {
    return InvalidArgumentError(fmt::format(
        "round {}: all-reduce: a weighted sum without the mean is fp32 only", options_.round_id));
  }
  return OkStatus();
}

// Segments of at most segment_bytes, but at least four per slice (of at
// least 256 KiB, or segment_bytes if less) so that a small buffer still
// pipelines.
size_t GlooCommunicator::SegmentValues(size_t values) const {
  const size_t slice_values = values / options_.world_size + 1;
  return std::min(std::max<size_t>(slice_values / 4, size_t{64} << 10),
                  std::max<size_t>(options_.segment_bytes / sizeof(float), 1));
}

Status GlooCommunicator::ReadGathered(Reduction& run, const std::vector<double>& gathered,
                                      size_t stride, bool merging, std::vector<double>& all_weights,
                                      std::vector<double>& all_squares) const {
  all_weights = Column(gathered, stride, 0);
  for (double made : Column(gathered, stride, 1)) run.any_made = run.any_made || made != 0;
  all_squares = Column(gathered, stride, 2);
  if (run.any_made && (!merging || !run.raw)) {
    // Every member of a reduction runs one protocol; a maker's is fp32's mean.
    return InvalidArgumentError(fmt::format(
        "round {}: all-reduce: a member made its fp32 values while this one {}", options_.round_id,
        run.raw ? "sums them without the mean"
                : fmt::format("encodes with {}", CodecName(run.codec.kind()))));
  }
  return OkStatus();
}

Status GlooCommunicator::ReduceAll(Op& op, Reduction& run, const std::vector<float>& weights,
                                   Made* made, const std::vector<double>& all_weights) {
  for (size_t s = 0; s < run.slicing.segments(); ++s) {
    // The segments `ahead` made and sent (the others post their receives for
    // them as this one's slots free); ReduceSegment waits for those behind.
    SendThrough(op, run, s + run.ahead + 1);
    if (run.kept != nullptr) Keep(run, s);
    MEND_RETURN_IF_ERROR(ReduceSegment(op, run, weights, s));
  }
  Status finished = FinishGather(op, run);
  if (finished.ok() && run.any_made) {
    // (The last segment's sum made them all, and posted the verdicts.)
    finished = WaitAll(op, run.verdicts_in);
    made->squares = run.make != nullptr ? run.squares : made->in.squares;
    made->left_out = LeftOut(made->in.leave_out, run.verdicts, all_weights);
    made->again = !made->left_out.empty();
  }
  return finished;
}

void GlooCommunicator::ReserveScratch(Reduction& run) {
  const int me = options_.rank;
  const size_t slice_bytes = run.layout.slice_bytes(me);
  if (run.raw) {
    run.window = std::min<size_t>(run.slicing.segments(), kReceiveWindow);
    run.slot_bytes = run.layout.piece_bytes(me, 0);
  }
  Reserve(send_scratch_, run.raw ? 0 : run.layout.total_bytes());
  Reserve(recv_scratch_, run.raw
                             ? run.window * run.slot_bytes * (options_.world_size - 1)
                             : slice_bytes * (options_.world_size - 1) + run.layout.total_bytes());
  stats_.scratch_bytes =
      std::max<uint64_t>(stats_.scratch_bytes, send_scratch_.capacity() + recv_scratch_.capacity());
  run.encoded = send_scratch_.data();
  run.contributions = recv_scratch_.data();
  run.results = run.raw ? nullptr : recv_scratch_.data() + slice_bytes * (options_.world_size - 1);
}

void GlooCommunicator::SetUpMerge(Op& op, Reduction& run, double weight, Made* made,
                                  std::vector<double>& all_weights,
                                  const std::vector<double>& all_squares) {
  if (run.any_made && run.make == nullptr) {
    // Given values: kept (segment by segment, before the reduction writes
    // each) in case every member reduces again, unless they weigh 0 (a
    // member taking part with zeros, such as a fresh join: it reduces
    // again with zeros, whatever its values); the verdict at once.
    if (weight > 0) {
      made->kept = TakeFloats(run.data.size());
      run.kept = &made->kept;
      stats_.kept_bytes = std::max<uint64_t>(stats_.kept_bytes, run.data.size_bytes());
    }
    run.verdict = made->in.squares;
    run.verdicts.assign(static_cast<size_t>(options_.world_size), 0.0);
    PostGather(op, kVerdict, std::as_bytes(std::span(&run.verdict, 1)),
               std::as_writable_bytes(std::span(run.verdicts)), run.verdicts_in);
  }
  if (!run.any_made) {
    // Every member's values given: whom to leave out is known now, and
    // their pieces are summed as zeros with weight 0.
    made->squares = made->in.squares;
    made->left_out = LeftOut(made->in.leave_out, all_squares, all_weights);
    if (!made->left_out.empty()) {
      run.zeroed.assign(static_cast<size_t>(options_.world_size), 0);
      run.zeros.assign(run.raw ? run.slot_bytes / sizeof(float) : 0, 0.0f);
      for (int r : made->left_out) {
        run.zeroed[static_cast<size_t>(r)] = 1;
        all_weights[static_cast<size_t>(r)] = 0;
      }
    }
  }
}

// Every member refuses the same weights. Every member's pieces are let
// through first (each sends, and makes, the rest as it drains), so that
// none is in flight, reading or writing the caller's buffer, once this
// returns; only the codecs' result receives stay posted, which no member
// will ever send to. (The others' pieces first, each window slot posted
// again as it frees: every member's sends then complete.)
Status GlooCommunicator::DrainRefused(Op& op, Reduction& run) {
  Status drained = OkStatus();
  for (size_t s = 0; s < run.slicing.segments() && drained.ok(); ++s) {
    SendThrough(op, run, s + run.ahead + 1);
    drained = WaitAll(op, run.contributions_in[s]);
    if (drained.ok() && run.raw) PostContributions(op, run, s + run.window);
  }
  for (size_t s = 0; s < run.slicing.segments() && drained.ok(); ++s)
    drained = WaitAll(op, run.scatter[s]);
  if (drained.ok()) drained = WaitAll(op, run.verdicts_in);
  return drained;
}

// fp32 across racks: (sum_r w_r x_r) * (1 / sum_r w_r), summed by rack
// (WeightedSum), which the rack-aware merge can split at the racks.
// Within one rack the weights are normalized first (sum_r (w_r / sum) x_r:
// equal weights of a power-of-two count are then exact).
void GlooCommunicator::SetSumFactors(Reduction& run, Fp32Sum sum,
                                     const std::vector<double>& all_weights,
                                     std::vector<float>& weights) const {
  double total = 0;
  for (double w : all_weights) total += w;
  run.scale = sum == Fp32Sum::kWeightedSum ? 1.0f : static_cast<float>(1.0 / total);
  for (int r = 0; r < options_.world_size; ++r) {
    weights[static_cast<size_t>(r)] = sum == Fp32Sum::kPreWeighted
                                          ? 1.0f
                                          : static_cast<float>(all_weights[static_cast<size_t>(r)]);
  }
}

StatusOr<Communicator::Merged> GlooCommunicator::MergeAllReduce(std::span<float> data,
                                                                double weight,
                                                                const MergeValues& values) {
  if (options_.world_size < 2) return Communicator::MergeAllReduce(data, weight, values);
  Made made;
  made.in = values;
  Status status = Guarded("all-reduce", [&]() {
    return WeightedAllReduceImpl(data, weight, values.codec, Fp32Sum::kWeightedMean, &made);
  });
  if (status.ok() && made.again) {
    // A member made its values, and one was left out, so the result is not
    // the merge: every member reduces again, those left out with zeros and
    // weight 0 (the others' values made again, or their kept copy: the
    // result overwrote them), and nobody makes its values or is left out
    // this time.
    if (std::binary_search(made.left_out.begin(), made.left_out.end(), options_.rank) ||
        weight == 0) {
      std::fill(data.begin(), data.end(), 0.0f);
      weight = 0;
    } else if (values.make == nullptr) {
      std::copy(made.kept.begin(), made.kept.end(), data.begin());
    } else {
      (*values.make)(0, data.size());
    }
    // (A plain reduction: every member's values given, nobody left out.)
    status = Guarded("all-reduce", [&]() {
      return WeightedAllReduceImpl(data, weight, nullptr, Fp32Sum::kWeightedMean);
    });
  }
  if (!made.kept.empty()) GiveBack(std::move(made.kept));
  MEND_RETURN_IF_ERROR(status);
  return Merged{made.squares, std::move(made.left_out)};
}

void GlooCommunicator::Keep(Reduction& run, size_t s) {
  for (int slice = 0; slice < run.slicing.members(); ++slice) {
    auto [begin, end] = run.slicing.Piece(slice, s);
    std::copy(run.data.begin() + static_cast<ptrdiff_t>(begin),
              run.data.begin() + static_cast<ptrdiff_t>(end),
              run.kept->begin() + static_cast<ptrdiff_t>(begin));
  }
}

const std::byte* GlooCommunicator::Mine(Reduction& run, int slice, size_t segment) const {
  if (run.raw) {
    return reinterpret_cast<const std::byte*>(run.data.data() +
                                              run.slicing.Piece(slice, segment).first);
  }
  return run.encoded + run.layout.offset(slice, segment);
}

std::byte* GlooCommunicator::Contribution(Reduction& run, int peer, size_t segment) const {
  const int me = options_.rank;
  const size_t index = static_cast<size_t>(peer < me ? peer : peer - 1);
  if (run.raw)
    return run.contributions + (index * run.window + segment % run.window) * run.slot_bytes;
  return run.contributions + index * run.layout.slice_bytes(me) +
         run.layout.offset_in_slice(me, segment);
}

void GlooCommunicator::PostContributions(Op& op, Reduction& run, size_t s) {
  if (s >= run.slicing.segments()) return;
  const int me = options_.rank;
  auto [begin, end] = run.slicing.Piece(me, s);
  if (begin == end) return;
  for (int peer = 0; peer < options_.world_size; ++peer) {
    if (peer == me) continue;
    run.contributions_in[s].push_back(
        PostRecv(op, peer, kScatter, s, Contribution(run, peer, s), run.layout.piece_bytes(me, s)));
  }
}

void GlooCommunicator::PostScatter(Op& op, Reduction& run) {
  // The first segments' pieces made (made values) and sent, and our
  // slice's pieces of them awaited; the rest as the reduction reaches them.
  SendThrough(op, run, run.ahead);
  for (size_t s = 0; s < run.slicing.segments(); ++s) {
    // fp32: the first window's receives; the rest as slots free (ReduceSegment).
    if (!run.raw || s < run.window) PostContributions(op, run, s);
  }
}

void GlooCommunicator::SendThrough(Op& op, Reduction& run, size_t segments) {
  if (run.sent == run.slicing.segments()) return;
  for (const size_t last = std::min(segments, run.slicing.segments()); run.sent < last;
       ++run.sent) {
    for (int slice = 0; run.make != nullptr && slice < options_.world_size; ++slice) {
      auto [begin, end] = run.slicing.Piece(slice, run.sent);
      if (begin != end) run.squares += (*run.make)(begin, end);
    }
    PostPieces(op, run, run.sent);
  }
  if (run.make != nullptr && run.sent == run.slicing.segments()) {
    run.verdict = run.squares;
    run.verdicts.assign(static_cast<size_t>(options_.world_size), 0.0);
    PostGather(op, kVerdict, std::as_bytes(std::span(&run.verdict, 1)),
               std::as_writable_bytes(std::span(run.verdicts)), run.verdicts_in);
  }
}

void GlooCommunicator::PostPieces(Op& op, Reduction& run, size_t s) {
  const int me = options_.rank;
  for (int peer = 0; peer < options_.world_size; ++peer) {
    auto [begin, end] = run.slicing.Piece(peer, s);
    if (begin == end) continue;
    const size_t bytes = run.layout.piece_bytes(peer, s);
    if (!run.raw) {
      const PhaseTimer timer(&stats_.encode_seconds);
      run.codec.Encode(run.data.subspan(begin, end - begin),
                       std::span(run.encoded + run.layout.offset(peer, s), bytes));
      // Codec results land in their own buffer: their receives can wait now.
      if (peer != me) {
        run.results_in[s].push_back(
            PostRecv(op, peer, kGather, s, run.results + run.layout.offset(peer, s), bytes));
      }
    }
    if (peer != me)
      run.scatter[s].push_back(PostSend(op, peer, kScatter, s, Mine(run, peer, s), bytes));
  }
}

Status GlooCommunicator::ReduceSegment(Op& op, Reduction& run, const std::vector<float>& weights,
                                       size_t s) {
  const int me = options_.rank;
  const int size = options_.world_size;
  auto [begin, end] = run.slicing.Piece(me, s);
  if (begin != end) {
    MEND_RETURN_IF_ERROR(WaitAll(op, run.contributions_in[s]));
    const size_t len = end - begin;
    const size_t bytes = run.layout.piece_bytes(me, s);
    const std::byte* result;
    const PhaseTimer timer(&stats_.reduce_seconds);
    if (run.raw) {
      std::vector<const float*> inputs(size);
      for (int r = 0; r < size; ++r) {
        inputs[r] = !run.zeroed.empty() && run.zeroed[static_cast<size_t>(r)] != 0
                        ? run.zeros.data()
                        : reinterpret_cast<const float*>(r == me ? Mine(run, me, s)
                                                                 : Contribution(run, r, s));
      }
      dataplane::WeightedSum(run.data.data() + begin, inputs, weights, sum_groups_, run.scale, len);
      result = reinterpret_cast<const std::byte*>(run.data.data() + begin);
      PostContributions(op, run, s + run.window);  // into the slots just summed
    } else {
      if (!run.zeroed.empty()) {
        // A member left out: its piece is zeros, encoded (what it would have
        // sent with weight 0), here as on every member.
        run.zeros.assign(len, 0.0f);
        run.zero_piece.resize(bytes);
        run.codec.Encode(run.zeros, run.zero_piece);
      }
      accumulator_.assign(len, 0.0f);
      for (int r = 0; r < size; ++r) {
        const bool left_out = !run.zeroed.empty() && run.zeroed[static_cast<size_t>(r)] != 0;
        const std::byte* piece = left_out  ? run.zero_piece.data()
                                 : r == me ? Mine(run, me, s)
                                           : Contribution(run, r, s);
        run.codec.DecodeAccumulate(std::span(piece, bytes), weights[r], accumulator_);
      }
      std::byte* out = run.results + run.layout.offset(me, s);
      run.codec.Encode(accumulator_, std::span(out, bytes));
      // The owner keeps what everyone else decodes, not its fp32 sum.
      run.codec.Decode(std::span(out, bytes), run.data.subspan(begin, len));
      result = out;
    }
    for (int peer = 0; peer < size; ++peer) {
      if (peer != me) run.gather[s].push_back(PostSend(op, peer, kGather, s, result, bytes));
    }
  }
  if (s >= run.ahead) MEND_RETURN_IF_ERROR(WaitResults(op, run, s - run.ahead));
  return run.raw ? PostRawResults(op, run, s) : OkStatus();
}

Status GlooCommunicator::PostRawResults(Op& op, Reduction& run, size_t s) {
  // fp32 results land in place, so segment s of the other slices may be
  // received only once our own piece of it has left.
  MEND_RETURN_IF_ERROR(WaitAll(op, run.scatter[s]));
  for (int peer = 0; peer < options_.world_size; ++peer) {
    auto [peer_begin, peer_end] = run.slicing.Piece(peer, s);
    if (peer == options_.rank || peer_begin == peer_end) continue;
    run.results_in[s].push_back(PostRecv(op, peer, kGather, s, run.data.data() + peer_begin,
                                         run.layout.piece_bytes(peer, s)));
  }
  return OkStatus();
}

Status GlooCommunicator::WaitResults(Op& op, Reduction& run, size_t s) {
  MEND_RETURN_IF_ERROR(WaitAll(op, run.gather[s]));
  return WaitAll(op, run.results_in[s]);
}

Status GlooCommunicator::FinishGather(Op& op, Reduction& run) {
  for (auto& sends : run.scatter) MEND_RETURN_IF_ERROR(WaitAll(op, sends));
  for (auto& receives : run.results_in) MEND_RETURN_IF_ERROR(WaitAll(op, receives));
  if (!run.raw) {
    const PhaseTimer timer(&stats_.reduce_seconds);
    for (int peer = 0; peer < options_.world_size; ++peer) {
      if (peer == options_.rank) continue;
      for (size_t s = 0; s < run.slicing.segments(); ++s) {
        auto [begin, end] = run.slicing.Piece(peer, s);
        if (begin == end) continue;
        run.codec.Decode(
            std::span(run.results + run.layout.offset(peer, s), run.layout.piece_bytes(peer, s)),
            run.data.subspan(begin, end - begin));
      }
    }
  }
  for (auto& sends : run.gather) MEND_RETURN_IF_ERROR(WaitAll(op, sends));
  return OkStatus();
}

}  // namespace mend::dataplane
