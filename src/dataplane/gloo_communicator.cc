// Communicator on Gloo's TCP transport (see include/mend/communicator.h).
//
// Every message is one Gloo unbound-buffer send matched by (peer, slot); the
// slot names the operation (a counter every member advances the same way),
// the phase and the segment, so messages of different operations never meet.
// Each pending receive and send has its own buffer object, so a failure is
// always attributable to one peer.
#include <signal.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <thread>

#include "core/buffer_pool.h"
#include "core/mutex.h"
#include "core/phase_timer.h"
#include "core/status_format.h"
#include "dataplane/gloo_store.h"
#include "dataplane/hierarchy.h"
#include "dataplane/left_out.h"
#include "dataplane/slicing.h"
#include "dataplane/weighted_sum.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "mend/communicator.h"
#include "spdlog/spdlog.h"

namespace mend {
namespace {

using dataplane::EncodedLayout;
using dataplane::Slicing;
using gloo::transport::UnboundBuffer;
using Clock = std::chrono::steady_clock;

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
uint64_t MakeSlot(uint64_t op, Phase phase, size_t segment, uint64_t salt = 0) {
  if (salt != 0) op = (op & 0xFFFFFF) | (salt << 24);
  return (op << 24) | (static_cast<uint64_t>(phase) << 20) | (segment & 0xFFFFF);
}

// A salt of `values` for MakeSlot: 16 bits, never 0.
uint64_t SizeSalt(size_t values) {
  uint64_t z = static_cast<uint64_t>(values) + 0x9E3779B97F4A7C15ull;  // SplitMix64's finalizer
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return ((z ^ (z >> 31)) & 0x7FFF) | 0x8000;
}

// Deletes a posted buffer. Out of line: TSan shows each of mend's frames at
// the call it made, and none of libgloo's own, so an access inside Gloo's
// destructor is shown in the function that called this one.
[[gnu::noinline]] void DeleteBuffer(UnboundBuffer* buffer) { delete buffer; }

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
[[gnu::noinline]] void DeleteInFlightBuffer(UnboundBuffer* buffer) {
  buffer->abortWaitSend();
  buffer->abortWaitRecv();
  DeleteBuffer(buffer);
}
struct InFlightRelease {
  void operator()(UnboundBuffer* buffer) const { DeleteInFlightBuffer(buffer); }
};

// One posted send or receive with its peer. Gloo throws from send() and
// recv() when the pair already failed; that error is kept here and reported
// by the wait, so it is attributed to the peer like any other.
struct Transfer {
  int peer = 0;
  std::unique_ptr<UnboundBuffer, InFlightRelease> buffer;
  bool is_send = false;
  std::string post_error;
};

// The fp32 sum's groups: the members by rack (MembersByRack); one group of
// every rank without racks.
std::vector<std::vector<int>> SumGroups(const std::vector<std::string>& racks, int world_size) {
  if (racks.size() == static_cast<size_t>(world_size)) return MembersByRack(racks);
  std::vector<int> all(static_cast<size_t>(world_size));
  std::iota(all.begin(), all.end(), 0);
  return {all};
}

}  // namespace

std::vector<int> LeftOut(const Communicator::LeaveOut* leave_out, std::span<const double> squares,
                         std::span<const double> weights) {
  std::vector<int> left;
  if (leave_out != nullptr) {
    left = (*leave_out)(squares, weights);
  } else {
    for (size_t r = 0; r < squares.size(); ++r)
      if (!std::isfinite(squares[r])) left.push_back(static_cast<int>(r));
  }
  std::sort(left.begin(), left.end());
  left.erase(std::unique(left.begin(), left.end()), left.end());
  return left;
}

namespace {

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

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }
  bool broken() const override { return broken_; }
  CommunicatorStats stats() const override { return stats_; }

 private:
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
  // Waits for one transfer until the operation's deadline.
  Status Wait(Op& op, Transfer& transfer);
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
  const std::byte* Mine(Reduction& run, int slice, size_t segment) const;
  std::byte* Contribution(Reduction& run, int peer, size_t segment) const;
  void PostScatter(Op& op, Reduction& run);
  // Segment s's pieces of the other slices sent (encoded first for a codec).
  void PostPieces(Op& op, Reduction& run, size_t s);
  // Made values: every segment before `segments` made and its pieces sent;
  // after the last, this member's verdict (its sum of squares) to everyone.
  void MakeThrough(Op& op, Reduction& run, size_t segments);
  // Given values: keeps segment s of every slice in run.kept.
  static void Keep(Reduction& run, size_t s);
  // The others' pieces of segment `s` of our slice (none past the last).
  void PostContributions(Op& op, Reduction& run, size_t s);
  Status ReduceSegment(Op& op, Reduction& run, const std::vector<float>& weights, size_t segment);
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

Status GlooCommunicator::Begin(const char* name, Op* op) {
  if (broken_) {
    return FailedPreconditionError(fmt::format(
        "round {}: {}: this communicator failed earlier; build a new one for the next round",
        options_.round_id, name));
  }
  op->name = name;
  op->id = next_op_++;
  op->start = Clock::now();
  op->deadline = op->start + std::chrono::microseconds(options_.timeout);
  return OkStatus();
}

Status GlooCommunicator::End(Op& op, Status status) {
  if (!status.ok()) {
    broken_ = true;
    return status;
  }
  stats_.operations++;
  stats_.bytes_sent += op.sent;
  const LinkEmulation& link = options_.link;
  if (link.enabled()) {
    double seconds = static_cast<double>(link.latency) / kMicrosPerSecond;
    if (link.bytes_per_s > 0) seconds += static_cast<double>(op.sent) / link.bytes_per_s;
    std::this_thread::sleep_until(op.start + std::chrono::duration_cast<Clock::duration>(
                                                 std::chrono::duration<double>(seconds)));
  }
  return OkStatus();
}

Transfer GlooCommunicator::Post(Op& op, bool send, int peer, Phase phase, size_t segment, void* ptr,
                                size_t bytes) {
  Transfer transfer{peer,
                    std::unique_ptr<UnboundBuffer, InFlightRelease>(
                        context_->createUnboundBuffer(ptr, bytes).release()),
                    send,
                    {}};
  const uint64_t slot = MakeSlot(op.id, phase, segment, phase == kWeights ? 0 : op.salt);
  try {
    if (send) {
      transfer.buffer->send(peer, slot, 0, bytes);
    } else {
      transfer.buffer->recv(peer, slot, 0, bytes);
    }
  } catch (const std::exception& error) {
    transfer.post_error = error.what();
  }
  (send ? op.sent : stats_.bytes_received) += bytes;
  if (send) {
    if (stats_.bytes_sent_to.size() <= static_cast<size_t>(peer))
      stats_.bytes_sent_to.resize(static_cast<size_t>(peer) + 1);
    stats_.bytes_sent_to[static_cast<size_t>(peer)] += bytes;
  }
  return transfer;
}

Status GlooCommunicator::Wait(Op& op, Transfer& transfer) {
  if (!transfer.buffer) return OkStatus();
  const PhaseTimer timer(&stats_.wait_seconds);
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(op.deadline - Clock::now());
  left = std::max(left, std::chrono::milliseconds(1));
  const char* what = transfer.is_send ? "sending to" : "receiving from";
  if (!transfer.post_error.empty()) {
    return AbortedError(fmt::format("round {}: {}: {} {}: connection lost ({})", options_.round_id,
                                    op.name, what, PeerName(transfer.peer), transfer.post_error));
  }
  {
    MutexLock lock(abort_mu_);
    if (!abort_reason_.empty()) {
      return AbortedError(
          fmt::format("round {}: {}: called off: {}", options_.round_id, op.name, abort_reason_));
    }
    waiting_ = &transfer;
  }
  // On every way out: the transfer leaves Abort's reach (Abort may be
  // aborting this very wait from another thread); a completed one's buffer
  // is taken out under the same lock and deleted after it.
  struct NotWaiting {
    GlooCommunicator* self;
    Transfer& transfer;
    bool completed = false;
    ~NotWaiting() {
      UnboundBuffer* done = nullptr;
      {
        MutexLock lock(self->abort_mu_);
        self->waiting_ = nullptr;
        if (completed) done = transfer.buffer.release();
      }
      if (done != nullptr) DeleteBuffer(done);
    }
  } not_waiting{this, transfer};
  try {
    bool done =
        transfer.is_send ? transfer.buffer->waitSend(left) : transfer.buffer->waitRecv(left);
    if (!done) {
      MutexLock lock(abort_mu_);
      return AbortedError(fmt::format("round {}: {}: {} {}: called off: {}", options_.round_id,
                                      op.name, what, PeerName(transfer.peer),
                                      abort_reason_.empty() ? "aborted" : abort_reason_));
    }
  } catch (const gloo::IoException& error) {
    std::string message = error.what();
    bool timed_out = message.find("imed out") != std::string::npos;
    if (timed_out) {
      return DeadlineExceededError(
          fmt::format("round {}: {}: {} {}: nothing within the {} ms deadline", options_.round_id,
                      op.name, what, PeerName(transfer.peer), options_.timeout / kMicrosPerMilli));
    }
    return AbortedError(fmt::format("round {}: {}: {} {}: connection lost ({})", options_.round_id,
                                    op.name, what, PeerName(transfer.peer), message));
  } catch (const std::exception& error) {
    return AbortedError(fmt::format("round {}: {}: {} {}: {}", options_.round_id, op.name, what,
                                    PeerName(transfer.peer), error.what()));
  }
  not_waiting.completed = true;
  return OkStatus();
}

Status GlooCommunicator::WaitAll(Op& op, std::vector<Transfer>& transfers) {
  for (Transfer& transfer : transfers) MEND_RETURN_IF_ERROR(Wait(op, transfer));
  transfers.clear();
  return OkStatus();
}

void GlooCommunicator::PostGather(Op& op, Phase phase, std::span<const std::byte> mine,
                                  std::span<std::byte> out, std::vector<Transfer>& transfers) {
  const size_t n = mine.size();
  if (n > 0) std::memcpy(out.data() + options_.rank * n, mine.data(), n);
  for (int peer = 0; peer < options_.world_size; ++peer) {
    if (peer == options_.rank) continue;
    transfers.push_back(PostRecv(op, peer, phase, 0, out.data() + peer * n, n));
    transfers.push_back(PostSend(op, peer, phase, 0, mine.data(), n));
  }
}

Status GlooCommunicator::GatherBytes(Op& op, Phase phase, std::span<const std::byte> mine,
                                     std::span<std::byte> out) {
  std::vector<Transfer> transfers;
  PostGather(op, phase, mine, out, transfers);
  return WaitAll(op, transfers);
}

// Every member's size as gathered beside the weights (the last of each
// member's `stride` values) is this member's `size`: else every member
// fails alike. No piece of another size moved (their slots differ), and
// none will: this member's stay posted, unread, until the communicator goes.
Status GlooCommunicator::SameSizes(Op& op, const std::vector<double>& gathered, size_t stride,
                                   size_t size, const char* what) {
  for (int r = 0; r < options_.world_size; ++r) {
    const double theirs = gathered[stride * static_cast<size_t>(r) + stride - 1];
    if (theirs == static_cast<double>(size)) continue;
    return End(op, FailedPreconditionError(fmt::format(
                       "round {}: {}: {} has {} {}, this member {}: the members exchange different "
                       "fragments or models (a bug in mend: please report it)",
                       options_.round_id, op.name, PeerName(r), static_cast<uint64_t>(theirs), what,
                       size)));
  }
  return OkStatus();
}

StatusOr<std::vector<float>> GlooCommunicator::NormalizeWeights(
    Op& op, const std::vector<double>& weights) const {
  double total = 0;
  for (int r = 0; r < options_.world_size; ++r) {
    if (!std::isfinite(weights[r]) || weights[r] < 0) {
      return InvalidArgumentError(fmt::format("round {}: {}: {} passed weight {}: must be >= 0",
                                              options_.round_id, op.name, PeerName(r), weights[r]));
    }
    total += weights[r];
  }
  if (!(total > 0)) {
    return InvalidArgumentError(
        fmt::format("round {}: {}: the members' weights sum to 0 (those left out of a merge count "
                    "0); nothing to average",
                    options_.round_id, op.name));
  }
  std::vector<float> normalized(options_.world_size);
  for (int r = 0; r < options_.world_size; ++r) {
    normalized[r] = static_cast<float>(weights[r] / total);
  }
  return normalized;
}

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
        contributions_in(slicing.segments()) {}

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
  std::vector<std::vector<Transfer>> scatter;           // by segment
  std::vector<std::vector<Transfer>> contributions_in;  // by segment
  std::vector<Transfer> gather;
  std::vector<Transfer> results_in;
  float scale = 1.0f;                  // fp32: the sum's factor (1 / total weight)
  std::byte* encoded = nullptr;        // our pieces of every slice (codecs)
  std::byte* contributions = nullptr;  // the others' pieces of our slice
  std::byte* results = nullptr;        // every slice's reduced piece (codecs)
  // Made values (MergeAllReduce): segments before `made` are made and sent;
  // the sum of their squares; this member's verdict (its sum of squares)
  // and every member's, gathered after its last segment (when any member
  // makes its values: `any_made`; a member whose values are given sends
  // its verdict at once, and keeps segment s of its values in `kept`
  // before the reduction writes it).
  const MakeValues* make = nullptr;
  size_t made = 0;
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
  if (!codec->dense()) {
    return InvalidArgumentError(
        fmt::format("round {}: all-reduce: codec {} is sparse; use WeightedAllGatherDecode",
                    options_.round_id, CodecName(codec->kind())));
  }
  if (sum != Fp32Sum::kWeightedMean && codec->kind() != CodecKind::kFp32) {
    return InvalidArgumentError(fmt::format(
        "round {}: all-reduce: a weighted sum without the mean is fp32 only", options_.round_id));
  }
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
  // Segments of at most segment_bytes, but at least four per slice (of at
  // least 256 KiB, or segment_bytes if less) so that a small buffer still
  // pipelines.
  const size_t slice_values = data.size() / options_.world_size + 1;
  const size_t segment_values =
      std::min(std::max<size_t>(slice_values / 4, size_t{64} << 10),
               std::max<size_t>(options_.segment_bytes / sizeof(float), 1));
  Reduction run(data, *codec, options_.world_size, segment_values);
  if (make != nullptr && !run.raw) {
    return InvalidArgumentError(
        fmt::format("round {}: all-reduce: made values are fp32 only", options_.round_id));
  }
  run.make = make;
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
  PostScatter(op, run);
  Status weighed = WaitAll(op, weight_transfers);
  if (!weighed.ok()) return End(op, weighed);
  MEND_RETURN_IF_ERROR(SameSizes(op, gathered, mine.size(), data.size(), "values"));
  std::vector<double> all_weights(options_.world_size), all_squares(options_.world_size);
  for (size_t r = 0; r < all_weights.size(); ++r) {
    all_weights[r] = gathered[mine.size() * r];
    run.any_made = run.any_made || gathered[mine.size() * r + 1] != 0;
    all_squares[r] = gathered[mine.size() * r + 2];
  }
  if (run.any_made && (made == nullptr || !run.raw)) {
    // Every member of a reduction runs one protocol; a maker's is fp32's mean.
    return End(op, InvalidArgumentError(fmt::format(
                       "round {}: all-reduce: a member made its fp32 values while this one {}",
                       options_.round_id,
                       run.raw ? "sums them without the mean"
                               : fmt::format("encodes with {}", CodecName(codec->kind())))));
  }
  if (run.any_made && make == nullptr) {
    // Given values: kept (segment by segment, before the reduction writes
    // each) in case every member reduces again, unless they weigh 0 (a
    // member taking part with zeros, such as a fresh join: it reduces
    // again with zeros, whatever its values); the verdict at once.
    if (weight > 0) {
      made->kept = TakeFloats(data.size());
      run.kept = &made->kept;
      stats_.kept_bytes = std::max<uint64_t>(stats_.kept_bytes, data.size_bytes());
    }
    run.verdict = made->in.squares;
    run.verdicts.assign(static_cast<size_t>(options_.world_size), 0.0);
    PostGather(op, kVerdict, std::as_bytes(std::span(&run.verdict, 1)),
               std::as_writable_bytes(std::span(run.verdicts)), run.verdicts_in);
  }
  if (made != nullptr && !run.any_made) {
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
  auto weights = NormalizeWeights(op, all_weights);
  if (!weights.ok()) {
    // Every member refuses the same weights. The pieces already posted are
    // let through first (every member posted all of its own), so that none
    // is in flight, reading or writing the caller's buffer, once this
    // returns; only the codecs' result receives stay posted, which no member
    // will ever send to.
    // (The others' pieces first, each window slot posted again as it
    // frees: every member's sends then complete.)
    // (Made values: every member makes and sends the rest as it drains.)
    Status drained = OkStatus();
    for (size_t s = 0; s < run.slicing.segments() && drained.ok(); ++s) {
      MakeThrough(op, run, s + run.window + 1);
      drained = WaitAll(op, run.contributions_in[s]);
      if (drained.ok() && run.raw) PostContributions(op, run, s + run.window);
    }
    for (size_t s = 0; s < run.slicing.segments() && drained.ok(); ++s)
      drained = WaitAll(op, run.scatter[s]);
    if (drained.ok()) drained = WaitAll(op, run.verdicts_in);
    return End(op, drained.ok() ? weights.status() : drained);
  }
  if (run.raw && (sum != Fp32Sum::kWeightedMean || sum_groups_.size() > 1)) {
    // fp32 across racks: (sum_r w_r x_r) * (1 / sum_r w_r), summed by rack
    // (WeightedSum), which the rack-aware merge can split at the racks.
    // Within one rack the weights are normalized first (sum_r (w_r / sum) x_r:
    // equal weights of a power-of-two count are then exact).
    double total = 0;
    for (double w : all_weights) total += w;
    run.scale = sum == Fp32Sum::kWeightedSum ? 1.0f : static_cast<float>(1.0 / total);
    for (int r = 0; r < options_.world_size; ++r) {
      (*weights)[static_cast<size_t>(r)] =
          sum == Fp32Sum::kPreWeighted ? 1.0f
                                       : static_cast<float>(all_weights[static_cast<size_t>(r)]);
    }
  }
  for (size_t s = 0; s < run.slicing.segments(); ++s) {
    // Made values: the segments `window` ahead made and sent (the others
    // post their receives for them as this one's slots free).
    MakeThrough(op, run, s + run.window + 1);
    if (run.kept != nullptr) Keep(run, s);
    Status status = ReduceSegment(op, run, *weights, s);
    if (!status.ok()) return End(op, status);
  }
  Status finished = FinishGather(op, run);
  if (finished.ok() && run.any_made) {
    // (The last segment's sum made them all, and posted the verdicts.)
    finished = WaitAll(op, run.verdicts_in);
    made->squares = make != nullptr ? run.squares : made->in.squares;
    made->left_out = LeftOut(made->in.leave_out, run.verdicts, all_weights);
    made->again = !made->left_out.empty();
  }
  return End(op, finished);
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
  if (run.make != nullptr) {
    // The first window's made and sent, and their pieces of our slice
    // awaited; the rest as the reduction reaches them.
    MakeThrough(op, run, run.window);
    for (size_t s = 0; s < run.window; ++s) PostContributions(op, run, s);
    return;
  }
  for (size_t s = 0; s < run.slicing.segments(); ++s) {
    PostPieces(op, run, s);
    // fp32: the first window's; the rest as slots free (ReduceSegment).
    if (!run.raw || s < run.window) PostContributions(op, run, s);
  }
}

void GlooCommunicator::MakeThrough(Op& op, Reduction& run, size_t segments) {
  if (run.make == nullptr || run.made == run.slicing.segments()) return;
  for (const size_t last = std::min(segments, run.slicing.segments()); run.made < last;
       ++run.made) {
    for (int slice = 0; slice < options_.world_size; ++slice) {
      auto [begin, end] = run.slicing.Piece(slice, run.made);
      if (begin != end) run.squares += (*run.make)(begin, end);
    }
    PostPieces(op, run, run.made);
  }
  if (run.made == run.slicing.segments()) {
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
        run.results_in.push_back(
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
      if (peer != me) run.gather.push_back(PostSend(op, peer, kGather, s, result, bytes));
    }
  }
  if (run.raw) {
    // fp32 results land in place, so segment s of the other slices may be
    // received only once our own piece of it has left.
    MEND_RETURN_IF_ERROR(WaitAll(op, run.scatter[s]));
    for (int peer = 0; peer < size; ++peer) {
      auto [peer_begin, peer_end] = run.slicing.Piece(peer, s);
      if (peer == me || peer_begin == peer_end) continue;
      run.results_in.push_back(PostRecv(op, peer, kGather, s, run.data.data() + peer_begin,
                                        run.layout.piece_bytes(peer, s)));
    }
  }
  return OkStatus();
}

Status GlooCommunicator::FinishGather(Op& op, Reduction& run) {
  for (auto& sends : run.scatter) MEND_RETURN_IF_ERROR(WaitAll(op, sends));
  MEND_RETURN_IF_ERROR(WaitAll(op, run.results_in));
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
  return WaitAll(op, run.gather);
}

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
  std::vector<double> all_weights(options_.world_size), all_squares(options_.world_size);
  for (size_t r = 0; r < all_weights.size(); ++r) {
    all_weights[r] = gathered[mine.size() * r];
    all_squares[r] = gathered[mine.size() * r + 1];
  }
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

Status GlooCommunicator::BroadcastImpl(std::span<std::byte> data, int root) {
  Op op;
  MEND_RETURN_IF_ERROR(Begin("broadcast", &op));
  op.salt = SizeSalt(data.size());  // (as AllGatherImpl's)
  if (root < 0 || root >= options_.world_size) {
    return InvalidArgumentError(fmt::format("round {}: broadcast: root {} not in [0, {})",
                                            options_.round_id, root, options_.world_size));
  }
  std::vector<Transfer> transfers;
  const size_t segment = std::max<size_t>(options_.segment_bytes, 1);
  for (size_t start = 0, s = 0; start < data.size(); start += segment, ++s) {
    size_t bytes = std::min(segment, data.size() - start);
    if (options_.rank == root) {
      for (int peer = 0; peer < options_.world_size; ++peer) {
        if (peer != root)
          transfers.push_back(PostSend(op, peer, kBroadcast, s, data.data() + start, bytes));
      }
    } else {
      transfers.push_back(PostRecv(op, root, kBroadcast, s, data.data() + start, bytes));
    }
  }
  return End(op, WaitAll(op, transfers));
}

// Gloo writes to its sockets without MSG_NOSIGNAL: a write to a peer that
// just died would raise SIGPIPE and kill this process silently. A peer's
// death must be an error, so SIGPIPE is ignored (when it still has its
// default action; a handler the application installed is left alone).
void IgnoreBrokenPipes() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
}

}  // namespace

CommunicatorOptions CommunicatorOptionsFrom(const Config& config) {
  CommunicatorOptions options;
  options.timeout = config.collective_timeout_ms * kMicrosPerMilli;
  options.connect_timeout = config.connect_timeout_ms * kMicrosPerMilli;
  options.bind_host = config.dataplane_host;
  options.link.latency = config.link_latency_ms * kMicrosPerMilli;
  options.link.bytes_per_s = config.link_rate_mbit * 1e6 / 8;
  return options;
}

namespace {

// Every member's sum of squares and weight (one small collective): the
// members `leave_out` names (LeftOut), alike on every member.
StatusOr<std::vector<int>> GatherLeftOut(Communicator& comm, double squares, double weight,
                                         const Communicator::LeaveOut* leave_out) {
  const std::array<double, 2> mine{squares, weight};
  std::vector<double> gathered(mine.size() * static_cast<size_t>(comm.world_size()));
  if (comm.world_size() > 1) {
    MEND_RETURN_IF_ERROR(comm.AllGather(std::as_bytes(std::span(mine)),
                                        std::as_writable_bytes(std::span(gathered))));
  } else {
    std::copy(mine.begin(), mine.end(), gathered.begin());
  }
  std::vector<double> all_squares(static_cast<size_t>(comm.world_size())),
      all_weights(all_squares.size());
  for (size_t r = 0; r < all_squares.size(); ++r) {
    all_squares[r] = gathered[2 * r];
    all_weights[r] = gathered[2 * r + 1];
  }
  return LeftOut(leave_out, all_squares, all_weights);
}

}  // namespace

// Made first, then every member's sum of squares and weight (one small
// collective), then the merge, those left out with zeros and weight 0.
StatusOr<Communicator::Merged> Communicator::MergeAllReduce(std::span<float> data, double weight,
                                                            const MergeValues& values) {
  if (values.make != nullptr && values.codec != nullptr &&
      values.codec->kind() != CodecKind::kFp32) {
    return InvalidArgumentError("all-reduce: made values are fp32 only");
  }
  Merged merged;
  merged.squares = values.make != nullptr ? (*values.make)(0, data.size()) : values.squares;
  MEND_ASSIGN_OR_RETURN(merged.left_out,
                        GatherLeftOut(*this, merged.squares, weight, values.leave_out));
  if (std::binary_search(merged.left_out.begin(), merged.left_out.end(), rank())) {
    std::fill(data.begin(), data.end(), 0.0f);
    weight = 0;
  }
  MEND_RETURN_IF_ERROR(WeightedAllReduce(data, weight, values.codec));
  return merged;
}

// Every member's sum of squares and weight (one small collective), then the
// gather, those left out sending the codec's zeros with weight 0.
StatusOr<std::vector<int>> Communicator::MergeAllGatherDecode(std::span<const std::byte> payload,
                                                              double weight, double squares,
                                                              const LeaveOut* leave_out,
                                                              const Codec& codec,
                                                              std::span<float> out) {
  MEND_ASSIGN_OR_RETURN(std::vector<int> left_out,
                        GatherLeftOut(*this, squares, weight, leave_out));
  if (std::binary_search(left_out.begin(), left_out.end(), rank())) {
    std::vector<std::byte> zeros(payload.size());
    codec.Encode(std::vector<float>(out.size(), 0.0f), zeros);
    MEND_RETURN_IF_ERROR(WeightedAllGatherDecode(zeros, 0, codec, out));
  } else {
    MEND_RETURN_IF_ERROR(WeightedAllGatherDecode(payload, weight, codec, out));
  }
  return left_out;
}

StatusOr<double> Communicator::MadeAllReduce(std::span<float> data, double weight,
                                             const MakeValues& make) {
  MergeValues values;
  values.make = &make;
  MEND_ASSIGN_OR_RETURN(Merged merged, MergeAllReduce(data, weight, values));
  return merged.squares;
}

Status Communicator::Fp32AllReduce(std::span<float> data, double weight, Fp32Sum sum) {
  if (sum == Fp32Sum::kWeightedMean) return WeightedAllReduce(data, weight, nullptr);
  return FailedPreconditionError(
      "Fp32AllReduce: this communicator has no fp32 weighted sum but the mean");
}

Status CheckDataPlaneHost(const std::string& host) {
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = host;
    (void)gloo::transport::tcp::CreateDevice(attr);  // binds a listening socket there
  } catch (const std::exception& error) {
    return InvalidArgumentError(fmt::format(
        "dataplane_host = \"{}\": the data plane cannot listen there ({}); give an address or "
        "name of this host that the other learners reach",
        host, error.what()));
  }
  return OkStatus();
}

StatusOr<std::unique_ptr<Communicator>> Communicator::Connect(RendezvousStore& store,
                                                              const CommunicatorOptions& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return InvalidArgumentError(fmt::format("communicator: rank {} not in [0, world_size = {})",
                                            options.rank, options.world_size));
  }
  if (options.timeout <= 0 || options.connect_timeout <= 0) {
    return InvalidArgumentError(
        fmt::format("communicator: timeout = {} us, connect timeout = {} us: must be positive",
                    options.timeout, options.connect_timeout));
  }
  IgnoreBrokenPipes();
  auto timeout = std::chrono::milliseconds(std::max<Micros>(options.timeout / kMicrosPerMilli, 1));
  dataplane::GlooStore gloo_store(store, options.prefix + "gloo/", timeout);
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.bind_host;
    device = gloo::transport::tcp::CreateDevice(attr);
    context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.world_size);
    // Gloo waits five times the context's timeout for a pair's initial
    // connection (and uses the context's timeout nowhere else here: every
    // wait of ours passes its own), so connect_timeout bounds that wait. A
    // member that was stopped while it connected and resumes after the
    // others gave up would otherwise hang there for 5 x the timeout.
    const auto connect =
        std::chrono::milliseconds(std::max<Micros>(options.connect_timeout / kMicrosPerMilli, 5));
    context->setTimeout(connect / 5);
    context->connectFullMesh(gloo_store, device);
  } catch (const dataplane::StoreTimeout& error) {
    std::vector<std::string> missing;
    for (const std::string& key : error.keys) {
      int rank = std::atoi(key.substr(key.rfind('/') + 1).c_str());
      missing.push_back(rank >= 0 && static_cast<size_t>(rank) < options.member_ids.size()
                            ? fmt::format("{} ('{}')", rank, options.member_ids[rank])
                            : std::to_string(rank));
    }
    return DeadlineExceededError(
        fmt::format("round {}: rendezvous: member(s) {} did not show up within {} ms",
                    options.round_id, fmt::join(missing, ", "), timeout.count()));
  } catch (const dataplane::StoreFailure& error) {
    return Annotate(error.status, fmt::format("round {}: rendezvous", options.round_id));
  } catch (const std::exception& error) {
    std::string message = error.what();
    if (message.find("imed out") != std::string::npos) {
      return DeadlineExceededError(
          fmt::format("round {}: connecting to the members: {}", options.round_id, message));
    }
    return UnavailableError(
        fmt::format("round {}: connecting to the members: {}", options.round_id, message));
  }
  return std::unique_ptr<Communicator>(
      new GlooCommunicator(options, std::move(device), std::move(context)));
}

}  // namespace mend
