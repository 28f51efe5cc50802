// The data plane (docs/architecture.md, "Data plane"): collectives among the members of one
// quorum round, on Gloo's TCP transport.
//
// A Communicator is built for one round: the members rendezvous through a
// key-value store (the lighthouse's) under the round's prefix, rank = index
// in the round's sorted member list, and every pair of members gets a TCP
// connection. Every operation has a deadline. When a peer dies or hangs, the
// operation returns DEADLINE_EXCEEDED (nothing arrived in time) or ABORTED
// (a connection broke), naming the round and the peer; the communicator is
// then broken (every later call returns FAILED_PRECONDITION) and is meant to
// be discarded: the next round builds a fresh one with the survivors.
// Destroying a communicator closes its sockets and joins its threads, also
// after an error. Connect sets SIGPIPE to "ignore" if it still has its
// default action (Gloo's socket writes would otherwise let a dying peer kill
// this process).
//
// The reductions are all-to-all reduce-scatter + all-gather: member r owns
// the r-th slice of the buffer, receives every member's (encoded) piece of
// it, accumulates them in fp32 in rank order, encodes the result once and
// sends it to everyone; every member, the owner included, decodes those same
// bytes. So all members end with bit-identical buffers, for every codec.
//
// Thread-safety: one thread at a time per communicator (operations are
// collective: every member calls the same sequence); Abort() from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mend/clock.h"
#include "mend/codec.h"
#include "mend/rendezvous_store.h"
#include "mend/status.h"

namespace mend {

// A slower, farther link, emulated inside the data plane: every operation
// takes at least `latency` plus (bytes this member sent) / `bytes_per_s`.
// Both zero (the default) turns it off. Benchmarks and demos say when it is on.
struct LinkEmulation {
  Micros latency = 0;
  double bytes_per_s = 0;
  bool enabled() const { return latency > 0 || bytes_per_s > 0; }
};

struct CommunicatorOptions {
  std::string prefix;     // the round's rendezvous prefix, e.g. "job/round/<instance>/7/"
  uint64_t round_id = 0;  // for error messages
  int rank = 0;
  int world_size = 1;
  std::vector<std::string> member_ids;     // by rank, for error messages (optional)
  std::string bind_host = "127.0.0.1";     // address the other members reach this one at
  Micros timeout = 30 * kMicrosPerSecond;  // the rendezvous, and every operation
  // The members' connections once all have shown up at the rendezvous: a
  // member that resumes after the others gave up on the round (it was
  // stopped, or the lighthouse called the round off) fails this fast. The
  // secure data plane's handshake (secret) has as long for each exchange.
  Micros connect_timeout = 5 * kMicrosPerSecond;
  LinkEmulation link;
  size_t segment_bytes = 1 << 20;  // pipelining granularity of the reductions
  // The members' racks, by rank (optional). The fp32 weighted sum adds up
  // each rack's members first (members in rank order), then the racks (in
  // name order), which is how the rack-aware merge (dataplane/hierarchy.h)
  // associates it: so the two give the same bits.
  std::vector<std::string> member_racks;
  // The job's secret (its job token), or empty. When set, the data plane is
  // secure: every piece is sealed (AES-256-GCM) under a key derived from it
  // for this communicator alone (see src/dataplane/sealing.h), and a member
  // whose pieces do not open is named in the error and none of its bytes
  // are used (UNAUTHENTICATED at the connect, DATA_LOSS in an operation).
  std::string secret;
  // Threads that seal and open each piece's lanes side by side, with a
  // secret (the round's threads: round_threads).
  int seal_threads = 1;
};

// Bytes this member put on and took off the wire, for the benchmarks and the
// bytes-per-token accounting.
struct CommunicatorStats {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t operations = 0;
  // Bytes sent to each member, by rank (what crossed which link: with the
  // members' racks, the cross-rack share).
  std::vector<uint64_t> bytes_sent_to;
  // Seconds spent encoding, waiting for transfers, and summing or decoding
  // the members' pieces (the round's phases, RoundPhases).
  double encode_seconds = 0;
  double wait_seconds = 0;
  double reduce_seconds = 0;
  // Seconds sealing and opening pieces (a secure data plane's; 0 otherwise).
  double seal_seconds = 0;
  // The most scratch memory the reductions held at once: a few segments
  // for fp32 (never a copy of the buffer), the encoded pieces for a codec.
  uint64_t scratch_bytes = 0;
  // The most bytes of its own values a member kept to reduce them again: a
  // member whose fp32 values were given in a reduction where another member
  // made its own (MergeAllReduce); 0 otherwise.
  uint64_t kept_bytes = 0;
};

// INVALID_ARGUMENT naming dataplane_host when the data plane cannot listen
// at `host` (not an address or name of this host): checked at a learner's
// start, before it registers, since such a learner could connect in no round
// and would hold every round it is a member of.
[[nodiscard]] Status CheckDataPlaneHost(const std::string& host);

class Communicator {
 public:
  // Rendezvous and full-mesh connect; DEADLINE_EXCEEDED naming the members
  // that did not show up within options.timeout. `store` is used during the
  // call only.
  [[nodiscard]] static StatusOr<std::unique_ptr<Communicator>> Connect(
      RendezvousStore& store, const CommunicatorOptions& options);
  virtual ~Communicator() = default;

  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // data <- sum_r w_r * data_r / sum_r w_r over the members r, each member
  // passing its own weight w (>= 0; the sum must be > 0): the token-weighted
  // merge (w = tokens), or the mean (w = 1). `codec` must be dense; nullptr
  // means fp32: sum_r (w_r / sum_r w_r) * data_r, or, with members in
  // several racks (options.member_racks), (sum_r w_r * data_r) * (1 /
  // sum_r w_r) summed by rack first. A weight below 0 or not finite, or
  // weights summing to 0: INVALID_ARGUMENT on every member, `data` as it
  // was, no transfer left in flight; the communicator is then broken, as
  // after any failure.
  // In fp32 it is MergeAllReduce of values given, nobody left out for
  // them: one protocol, so that members of one reduction may call either.
  [[nodiscard]] virtual Status WeightedAllReduce(std::span<float> data, double weight,
                                                 const Codec* codec = nullptr) = 0;

  // The fp32 reduction split in two, for the rack-aware merge: kWeightedSum
  // is data <- sum_r w_r * data_r (no division); kPreWeighted takes each
  // member's data as a weighted sum already: data <- (sum_r data_r) *
  // (1 / sum_r w_r). kWeightedMean is WeightedAllReduce(data, weight). The
  // two steps, rack then racks, give WeightedAllReduce's bits over all the
  // members. Only kWeightedMean unless the implementation says otherwise.
  enum class Fp32Sum { kWeightedMean, kWeightedSum, kPreWeighted };
  [[nodiscard]] virtual Status Fp32AllReduce(std::span<float> data, double weight, Fp32Sum sum);

  // A round's merge: WeightedAllReduce(data, weight, values.codec), leaving out
  // (with zeros and weight 0, the bits a caller of WeightedAllReduce gets
  // by passing those) the members `leave_out` names from what each member
  // said of its values, alike on every member. The values are given in
  // `data` with their sum of squares, or made as the reduction reaches them
  // (a round's pseudo-gradient, computed while the pieces before it
  // travel): make(begin, end) writes data[begin, end) and returns the sum
  // of their squares (not finite when a value is not); it is called on
  // this thread, for ranges that cover `data` once, each before anything
  // reads it.
  //
  // When every member's values are given, each member's sum of squares
  // travels beside its weight and the first pieces, and the members left
  // out are left out of the sums as they are made. When a member makes its
  // values, the sums of squares travel beside the last pieces; when then a
  // member is left out, every member reduces again (the makers make again:
  // `make` must write the same values each time; the others reduce the copy
  // of their values they kept: kept_bytes).
  using MakeValues = std::function<double(size_t begin, size_t end)>;
  // The members to leave out (ascending ranks), from every member's sum of
  // squares and weight.
  using LeaveOut = std::function<std::vector<int>(std::span<const double> squares,
                                                  std::span<const double> weights)>;
  struct MergeValues {
    const MakeValues* make = nullptr;  // nullptr: given in `data`, ...
    double squares = 0;                // ... with this sum of squares
    // nullptr: the members whose sum of squares is not finite.
    const LeaveOut* leave_out = nullptr;
    // A dense codec to merge through (WeightedAllReduce's); nullptr: fp32.
    // With a codec every member's values are given (make is fp32 only).
    const Codec* codec = nullptr;
  };
  struct Merged {
    double squares = 0;         // this member's (made or given)
    std::vector<int> left_out;  // every member's view alike
  };
  [[nodiscard]] virtual StatusOr<Merged> MergeAllReduce(std::span<float> data, double weight,
                                                        const MergeValues& values);
  // MergeAllReduce of values made by `make`, the members not finite left
  // out; returns this member's sum of squares.
  [[nodiscard]] StatusOr<double> MadeAllReduce(std::span<float> data, double weight,
                                               const MakeValues& make);

  // The same for a sparse codec (top-k): every member's `payload` (of
  // codec.EncodedBytes(out.size()) bytes, e.g. from ErrorFeedback) is
  // all-gathered and out <- sum_r w_r * Decode(payload_r) / sum_r w_r.
  [[nodiscard]] virtual Status WeightedAllGatherDecode(std::span<const std::byte> payload,
                                                       double weight, const Codec& codec,
                                                       std::span<float> out) = 0;
  // A sparse codec's round merge: WeightedAllGatherDecode with every
  // member's sum of squares (of the values it encoded) beside its weight;
  // the members `leave_out` names (nullptr: those whose sum is not finite),
  // alike on every member, are decoded as the codec's encoding of zeros
  // with weight 0 (the bits of a member that sent those). Returns them
  // (ascending). Every member of one gather calls this, or every member
  // WeightedAllGatherDecode. Here: the sums of squares and weights in a
  // collective of their own first; implementations send them beside the
  // payloads.
  [[nodiscard]] virtual StatusOr<std::vector<int>> MergeAllGatherDecode(
      std::span<const std::byte> payload, double weight, double squares, const LeaveOut* leave_out,
      const Codec& codec, std::span<float> out);

  // out[r * mine.size() ...] <- member r's `mine` (all the same size).
  [[nodiscard]] virtual Status AllGather(std::span<const std::byte> mine,
                                         std::span<std::byte> out) = 0;

  // data <- root's data on every member.
  [[nodiscard]] virtual Status Broadcast(std::span<std::byte> data, int root) = 0;

  // Calls the round off from any thread: the operation waiting now, and
  // every later one, fails with ABORTED naming `reason` (e.g. the
  // lighthouse declared a member dead while it held a collective). Safe to
  // call more than once and concurrently with an operation.
  virtual void Abort(const std::string& reason) = 0;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // True after an operation failed; every later call fails at once.
  virtual bool broken() const = 0;
  virtual CommunicatorStats stats() const = 0;

 protected:
  Communicator() = default;
};

}  // namespace mend
