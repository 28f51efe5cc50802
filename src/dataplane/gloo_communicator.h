// The Communicator on Gloo's TCP transport (see include/mend/communicator.h),
// one collective per file: the class, its transfers and the connect here
// (gloo_communicator.cc), the reduction in all_reduce.cc, the gathers in
// all_gather.cc, the broadcast in broadcast.cc; the merges of any
// communicator in communicator.cc.
//
// Every message is one Gloo unbound-buffer send matched by (peer, slot); the
// slot names the operation (a counter every member advances the same way),
// the phase and the segment, so messages of different operations never meet.
// Each pending receive and send has its own buffer object, so a failure is
// always attributable to one peer.
//
// Thread-safety: a communicator's collectives run on one thread at a time;
// Abort may be called from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/buffer_pool.h"
#include "core/mutex.h"
#include "dataplane/sealing.h"
#include "fmt/format.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "mend/communicator.h"

namespace mend::dataplane {

using gloo::transport::UnboundBuffer;

enum Phase : uint64_t {
  kWeights = 0,
  kScatter = 1,
  kGather = 2,
  kBroadcast = 3,
  kAllGather = 4,
  kVerdict = 5,  // MergeAllReduce: each member's sum of squares, after its made values
};

// Segments of the others' fp32 pieces of our slice received at once (see
// Reduction::window): 4 MiB per peer at the default segment size.
constexpr size_t kReceiveWindow = 4;

// Slot layout: op (40 bits) | phase (4 bits) | segment (20 bits). An
// operation's pieces may carry a salt of its buffer's size in the op's top
// 16 bits (its id's low 24 bits beside it: a communicator's operations run
// one after another, so a slot used again 2^24 operations later meets
// nothing in flight): members whose buffers differ in size then post slots
// that never meet (Gloo would abort the process on a piece longer than the
// buffer posted for it), and learn it from the sizes beside the weights.
inline uint64_t MakeSlot(uint64_t op, Phase phase, size_t segment, uint64_t salt = 0) {
  if (salt != 0) op = (op & 0xFFFFFF) | (salt << 24);
  return (op << 24) | (static_cast<uint64_t>(phase) << 20) | (segment & 0xFFFFF);
}

// A salt of `values` for MakeSlot: 16 bits, never 0.
inline uint64_t SizeSalt(size_t values) {
  uint64_t z = static_cast<uint64_t>(values) + 0x9E3779B97F4A7C15ull;  // SplitMix64's finalizer
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return ((z ^ (z >> 31)) & 0x7FFF) | 0x8000;
}

// Deletes a posted buffer. Out of line: TSan shows each of mend's frames at
// the call it made, and none of libgloo's own, so an access inside Gloo's
// destructor is shown in the function that called this one.
void DeleteBuffer(UnboundBuffer* buffer);

// Deletes a posted buffer whose send or receive may still be in flight: an
// operation that failed, or that stopped after posting (weights summing to
// 0). Gloo's destructor waits until its device thread has let go of the
// buffer, but counts that reference inside libgloo, where TSan cannot see
// it; tests/sanitizers/tsan.supp names this function. A buffer whose
// transfer completed is deleted in Wait instead.
//
// Its transfer may also have completed without a wait to see it (a wait on
// another failed first). The aborts take the buffer's lock, which the device
// thread released when it completed the transfer: what it did to the memory
// before that is then ordered before the caller's next use, for TSan too
// (it sees Gloo's pthread locks). The abort flags are never read again.
void DeleteInFlightBuffer(UnboundBuffer* buffer);
struct InFlightRelease {
  void operator()(UnboundBuffer* buffer) const { DeleteInFlightBuffer(buffer); }
};

// A sealed piece's bytes on the wire, taken from and given back to a cache
// kept across communicators (up to 32 MiB): each round's communicator is
// new, and malloc returns blocks of a segment's size to the kernel, so that
// every round would fault its pieces' pages in again.
struct WireRelease {
  size_t capacity = 0;
  void operator()(std::byte* bytes) const;
};
using WireBuffer = std::unique_ptr<std::byte[], WireRelease>;
WireBuffer TakeWire(size_t bytes);

// One posted send or receive with its peer. Gloo throws from send() and
// recv() when the pair already failed; that error is kept here and reported
// by the wait, so it is attributed to the peer like any other.
//
// On a secure data plane the bytes on the wire are `wire` (the piece sealed,
// then its tag), declared before `buffer` so that it outlives it; a
// receive's piece is opened from it into `plain` when the wait completes.
struct Transfer {
  int peer = 0;
  WireBuffer wire;
  std::unique_ptr<UnboundBuffer, InFlightRelease> buffer;
  bool is_send = false;
  std::string post_error;
  std::span<std::byte> plain;  // a sealed receive's destination
  PiecePlace place;            // a sealed receive's nonce
};

// The fp32 sum's groups: the members by rack (MembersByRack); one group of
// every rank without racks.
std::vector<std::vector<int>> SumGroups(const std::vector<std::string>& racks, int world_size);

// Gloo writes to its sockets without MSG_NOSIGNAL: a write to a peer that
// just died would raise SIGPIPE and kill this process silently. A peer's
// death must be an error, so SIGPIPE is ignored (when it still has its
// default action; a handler the application installed is left alone).
void IgnoreBrokenPipes();

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(CommunicatorOptions options, std::shared_ptr<gloo::transport::Device> device,
                   std::shared_ptr<gloo::rendezvous::Context> context)
      : options_(std::move(options)),
        device_(std::move(device)),
        context_(std::move(context)),
        sum_groups_(SumGroups(options_.member_racks, options_.world_size)) {}

  ~GlooCommunicator() override {
    // Pending buffers first (they refer to the context), then the pairs;
    // then the scratch, no longer referred to, for the next round's.
    context_.reset();
    device_.reset();
    GiveBack(std::move(send_scratch_));
    GiveBack(std::move(recv_scratch_));
  }

  Status WeightedAllReduce(std::span<float> data, double weight, const Codec* codec) override {
    // fp32: one protocol with MergeAllReduce (whose members may make theirs).
    if (options_.world_size > 1 && (codec == nullptr || codec->kind() == CodecKind::kFp32))
      return MergeAllReduce(data, weight, MergeValues{}).status();
    return Guarded("all-reduce", [&]() {
      return WeightedAllReduceImpl(data, weight, codec, Fp32Sum::kWeightedMean);
    });
  }
  Status Fp32AllReduce(std::span<float> data, double weight, Fp32Sum sum) override {
    return Guarded("all-reduce",
                   [&]() { return WeightedAllReduceImpl(data, weight, nullptr, sum); });
  }
  StatusOr<Merged> MergeAllReduce(std::span<float> data, double weight,
                                  const MergeValues& values) override;
  Status WeightedAllGatherDecode(std::span<const std::byte> payload, double weight,
                                 const Codec& codec, std::span<float> out) override {
    return Guarded("all-gather-decode", [&]() {
      return WeightedAllGatherDecodeImpl(payload, weight, codec, out, nullptr);
    });
  }
  StatusOr<std::vector<int>> MergeAllGatherDecode(std::span<const std::byte> payload, double weight,
                                                  double squares, const LeaveOut* leave_out,
                                                  const Codec& codec,
                                                  std::span<float> out) override {
    GatherMerge merge{squares, leave_out, {}};
    MEND_RETURN_IF_ERROR(Guarded("all-gather-decode", [&]() {
      return WeightedAllGatherDecodeImpl(payload, weight, codec, out, &merge);
    }));
    return std::move(merge.left_out);
  }
  Status AllGather(std::span<const std::byte> mine, std::span<std::byte> out) override {
    return Guarded("all-gather", [&]() { return AllGatherImpl(mine, out); });
  }
  Status Broadcast(std::span<std::byte> data, int root) override {
    return Guarded("broadcast", [&]() { return BroadcastImpl(data, root); });
  }

  void Abort(const std::string& reason) override {
    MutexLock lock(abort_mu_);
    if (abort_reason_.empty()) abort_reason_ = reason.empty() ? "aborted" : reason;
    if (waiting_ != nullptr && waiting_->buffer) {
      if (waiting_->is_send) {
        waiting_->buffer->abortWaitSend();
      } else {
        waiting_->buffer->abortWaitRecv();
      }
    }
  }

  // Makes the data plane secure (options.secret): the members exchange
  // their random bytes, derive this communicator's key, and each proves it
  // to every other with a sealed digest of the transcript, each exchange
  // within connect_timeout. UNAUTHENTICATED naming every member whose proof
  // did not open.
  Status Secure();

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }
  bool broken() const override { return broken_; }
  CommunicatorStats stats() const override { return stats_; }

 private:
  // The operations' deadlines (a member's alias: mend::Clock is the
  // injected clock, which a data-plane deadline does not follow).
  using Clock = std::chrono::steady_clock;

  // The context of one operation: its deadline, its slot base, and what it sent.
  struct Op {
    const char* name;
    uint64_t id;
    Clock::time_point start;
    Clock::time_point deadline;
    uint64_t sent = 0;
    uint64_t salt = 0;  // MakeSlot's, of every phase but the weights'
  };

  // A merge (MergeAllReduce): this member's values (made, or given with
  // their sum of squares) and whom to leave out (nullptr: the members not
  // finite); what it found: this member's sum of squares, the members left
  // out, whether every member must reduce again (a member made its values
  // and one was left out), and (when this member's were given) their copy.
  struct Made {
    MergeValues in;
    double squares = 0;
    std::vector<int> left_out;
    bool again = false;
    std::vector<float> kept;
  };
  // `made`: a merge's (fp32 weighted means only); nullptr: a plain
  // reduction (sums, codecs), in which no member may make its values.
  Status WeightedAllReduceImpl(std::span<float> data, double weight, const Codec* codec,
                               Fp32Sum sum, Made* made = nullptr);
  // A sparse codec's merge (MergeAllGatherDecode): this member's sum of
  // squares and whom to leave out; the members left out.
  struct GatherMerge {
    double squares = 0;
    const LeaveOut* leave_out = nullptr;
    std::vector<int> left_out;
  };
  // `merge`: MergeAllGatherDecode's; nullptr: nobody left out.
  Status WeightedAllGatherDecodeImpl(std::span<const std::byte> payload, double weight,
                                     const Codec& codec, std::span<float> out, GatherMerge* merge);
  Status AllGatherImpl(std::span<const std::byte> mine, std::span<std::byte> out);
  Status BroadcastImpl(std::span<std::byte> data, int root);

  // Runs `body`; an exception from Gloo that no wait caught (it should not
  // happen) still becomes an error and breaks the communicator, never a crash.
  template <typename Body>
  Status Guarded(const char* name, Body&& body) {
    try {
      return body();
    } catch (const std::exception& error) {
      broken_ = true;
      return AbortedError(fmt::format("round {}: {}: {}", options_.round_id, name, error.what()));
    }
  }

  Status Begin(const char* name, Op* op);
  // Applies the link emulation, counts the operation.
  Status End(Op& op, Status status);

  Transfer Post(Op& op, bool send, int peer, Phase phase, size_t segment, void* ptr, size_t bytes);
  Transfer PostSend(Op& op, int peer, Phase phase, size_t segment, const void* ptr, size_t bytes) {
    return Post(op, true, peer, phase, segment, const_cast<void*>(ptr), bytes);
  }
  Transfer PostRecv(Op& op, int peer, Phase phase, size_t segment, void* ptr, size_t bytes) {
    return Post(op, false, peer, phase, segment, ptr, bytes);
  }
  // Waits for one transfer until the operation's deadline (and opens a
  // sealed receive's piece: DATA_LOSS naming the peer when it does not).
  Status Wait(Op& op, Transfer& transfer);
  // A sealed receive's piece opened into its destination (Wait's last
  // step): DATA_LOSS naming the peer when it does not open.
  Status Open(const Op& op, Transfer& transfer);
  // The error of a wait for `transfer` that Gloo ended with `message`.
  Status WaitFailed(const Op& op, const Transfer& transfer, const std::string& message) const;
  Status WaitAll(Op& op, std::vector<Transfer>& transfers);

  // out[r * size ...] <- member r's `mine`: posting, and posting + waiting.
  void PostGather(Op& op, Phase phase, std::span<const std::byte> mine, std::span<std::byte> out,
                  std::vector<Transfer>& transfers);
  Status GatherBytes(Op& op, Phase phase, std::span<const std::byte> mine,
                     std::span<std::byte> out);
  // The gathered weights checked (finite, >= 0, positive sum) and divided by
  // their sum: the same floats on every member.
  StatusOr<std::vector<float>> NormalizeWeights(Op& op, const std::vector<double>& weights) const;
  // Fails `op` unless every member's size, gathered beside the weights, is `size`.
  Status SameSizes(Op& op, const std::vector<double>& gathered, size_t stride, size_t size,
                   const char* what);

  // The steps of WeightedAllReduce (see the file comment of communicator.h).
  struct Reduction;
  // INVALID_ARGUMENT for a sparse codec, or a sum without the mean but fp32.
  Status CheckCodec(const Codec& codec, Fp32Sum sum) const;
  // The values a segment of a buffer of `values` holds.
  size_t SegmentValues(size_t values) const;
  // What every member sent beside its weight (`stride` doubles each: the
  // weight, whether it makes its values, its sum of squares, its size):
  // INVALID_ARGUMENT when one makes its values and this member does not
  // merge fp32 (`merging`: a merge's).
  Status ReadGathered(Reduction& run, const std::vector<double>& gathered, size_t stride,
                      bool merging, std::vector<double>& all_weights,
                      std::vector<double>& all_squares) const;
  // Every segment reduced and its results gathered; a merge's verdicts.
  Status ReduceAll(Op& op, Reduction& run, const std::vector<float>& weights, Made* made,
                   const std::vector<double>& all_weights);
  // The scratch `run`'s pieces land in (fp32: a window of slots a peer;
  // codecs: every encoded piece, the others' of our slice and the results).
  void ReserveScratch(Reduction& run);
  // A merge's part once the weights are in: a member makes its values (this
  // one's given values kept, its verdict posted), or none does (whom to
  // leave out, now: their weights 0, their pieces summed as zeros).
  void SetUpMerge(Op& op, Reduction& run, double weight, Made* made,
                  std::vector<double>& all_weights, const std::vector<double>& all_squares);
  // Refused weights: every member's pieces let through before the error.
  Status DrainRefused(Op& op, Reduction& run);
  // fp32 sums, or a weighted mean across racks: the factor and each
  // member's weight (a sum by rack that the rack-aware merge splits).
  void SetSumFactors(Reduction& run, Fp32Sum sum, const std::vector<double>& all_weights,
                     std::vector<float>& weights) const;
  const std::byte* Mine(Reduction& run, int slice, size_t segment) const;
  std::byte* Contribution(Reduction& run, int peer, size_t segment) const;
  void PostScatter(Op& op, Reduction& run);
  // Segment s's pieces of the other slices sent (encoded first for a codec).
  void PostPieces(Op& op, Reduction& run, size_t s);
  // Every segment before `segments` sent (made values: made first; after
  // the last, this member's verdict, its sum of squares, to everyone).
  void SendThrough(Op& op, Reduction& run, size_t segments);
  // Given values: keeps segment s of every slice in run.kept.
  static void Keep(Reduction& run, size_t s);
  // The others' pieces of segment `s` of our slice (none past the last).
  void PostContributions(Op& op, Reduction& run, size_t s);
  Status ReduceSegment(Op& op, Reduction& run, const std::vector<float>& weights, size_t segment);
  // fp32: once our piece of segment s has left, the others' reduced pieces
  // of it, received in place.
  Status PostRawResults(Op& op, Reduction& run, size_t s);
  // Segment s's results sent and received (the others' into place).
  Status WaitResults(Op& op, Reduction& run, size_t s);
  Status FinishGather(Op& op, Reduction& run);

  std::string PeerName(int peer) const {
    if (static_cast<size_t>(peer) < options_.member_ids.size()) {
      return fmt::format("member {} ('{}')", peer, options_.member_ids[peer]);
    }
    return fmt::format("member {}", peer);
  }

  const CommunicatorOptions options_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  const std::vector<std::vector<int>> sum_groups_;  // the fp32 sum's association (SumGroups)
  uint64_t next_op_ = 1;
  // The secure data plane's (null: plain); the places sealed in the current
  // operation, each used once ((phase, segment) << 16 | receiver).
  std::unique_ptr<Sealer> sealer_;
  std::unordered_set<uint64_t> sealed_places_;
  bool broken_ = false;
  CommunicatorStats stats_;
  // Scratch reused across operations.
  std::vector<std::byte> send_scratch_;
  std::vector<std::byte> recv_scratch_;
  // `scratch` with `bytes`, from the pool when it has no room.
  static void Reserve(std::vector<std::byte>& scratch, size_t bytes) {
    if (scratch.capacity() >= bytes) {
      scratch.resize(bytes);
      return;
    }
    GiveBack(std::move(scratch));
    scratch = TakeBytes(bytes);
  }
  std::vector<float> accumulator_;
  // Abort() from another thread: the reason, and the transfer being waited for.
  Mutex abort_mu_;
  std::string abort_reason_ ABSL_GUARDED_BY(abort_mu_);
  Transfer* waiting_ ABSL_GUARDED_BY(abort_mu_) = nullptr;
};

}  // namespace mend::dataplane
