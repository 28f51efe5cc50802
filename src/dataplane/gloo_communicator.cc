// The Communicator on Gloo's TCP transport: its transfers, waits and
// gathers of bytes, and the connect (see gloo_communicator.h).
#include "dataplane/gloo_communicator.h"

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>
#include <thread>

#include "core/phase_timer.h"
#include "core/status_format.h"
#include "dataplane/gloo_store.h"
#include "dataplane/hierarchy.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "gloo/common/error.h"
#include "gloo/transport/tcp/device.h"
#include "spdlog/spdlog.h"

namespace mend::dataplane {

// Out of line, so that TSan shows the frame (see the header).
[[gnu::noinline]] void DeleteBuffer(UnboundBuffer* buffer) { delete buffer; }

[[gnu::noinline]] void DeleteInFlightBuffer(UnboundBuffer* buffer) {
  buffer->abortWaitSend();
  buffer->abortWaitRecv();
  DeleteBuffer(buffer);
}

std::vector<std::vector<int>> SumGroups(const std::vector<std::string>& racks, int world_size) {
  if (racks.size() == static_cast<size_t>(world_size)) return MembersByRack(racks);
  std::vector<int> all(static_cast<size_t>(world_size));
  std::iota(all.begin(), all.end(), 0);
  return {all};
}

namespace {

constexpr size_t kMaxCachedWireBytes = size_t{32} << 20;

struct WireCache {
  Mutex mu;
  std::vector<std::pair<size_t, std::byte*>> free ABSL_GUARDED_BY(mu);  // (capacity, bytes)
  size_t bytes ABSL_GUARDED_BY(mu) = 0;
};

WireCache& Wires() {
  static WireCache* cache = new WireCache();  // never destroyed: used until exit
  return *cache;
}

}  // namespace

WireBuffer TakeWire(size_t bytes) {
  WireCache& cache = Wires();
  {
    MutexLock lock(cache.mu);
    // The smallest that holds `bytes`, unless it is more than twice as large.
    auto best = cache.free.end();
    for (auto it = cache.free.begin(); it != cache.free.end(); ++it) {
      if (it->first >= bytes && it->first <= 2 * bytes + 4096 &&
          (best == cache.free.end() || it->first < best->first))
        best = it;
    }
    if (best != cache.free.end()) {
      const auto [capacity, kept] = *best;
      cache.free.erase(best);
      cache.bytes -= capacity;
      return WireBuffer(kept, WireRelease{capacity});
    }
  }
  return WireBuffer(new std::byte[bytes], WireRelease{bytes});
}

void WireRelease::operator()(std::byte* bytes) const {
  if (bytes == nullptr) return;
  WireCache& cache = Wires();
  {
    MutexLock lock(cache.mu);
    if (cache.bytes + capacity <= kMaxCachedWireBytes) {
      cache.free.emplace_back(capacity, bytes);
      cache.bytes += capacity;
      return;
    }
  }
  delete[] bytes;
}

void IgnoreBrokenPipes() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
}

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
  sealed_places_.clear();
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
  Transfer transfer;
  transfer.peer = peer;
  transfer.is_send = send;
  void* on_wire = ptr;
  if (sealer_) {
    // Sealed: the piece's place is its nonce, which must never repeat
    // under this key (a place posted twice is a bug, and fails the send).
    const int me = options_.rank;
    transfer.place = {op.id, static_cast<uint32_t>(phase), segment,
                      static_cast<uint32_t>(send ? me : peer),
                      static_cast<uint32_t>(send ? peer : me)};
    transfer.wire = TakeWire(SealedBytes(bytes));
    on_wire = transfer.wire.get();
    const std::span<std::byte> wire(transfer.wire.get(), SealedBytes(bytes));
    if (send) {
      const PhaseTimer timer(&stats_.seal_seconds);
      Status sealed =
          sealed_places_.insert((uint64_t{phase} << 36) | (uint64_t{segment} << 16) | peer).second
              ? sealer_->Seal(transfer.place, {static_cast<const std::byte*>(ptr), bytes}, wire)
              : InternalError(
                    "data plane: a piece's place was sealed twice (a bug in mend: "
                    "please report it)");
      if (!sealed.ok()) transfer.post_error = std::string(sealed.message());
    } else {
      transfer.plain = {static_cast<std::byte*>(ptr), bytes};
    }
    bytes = SealedBytes(bytes);
  }
  transfer.buffer = std::unique_ptr<UnboundBuffer, InFlightRelease>(
      context_->createUnboundBuffer(on_wire, bytes).release());
  const uint64_t slot = MakeSlot(op.id, phase, segment, phase == kWeights ? 0 : op.salt);
  try {
    if (!transfer.post_error.empty()) {
      // (not sent)
    } else if (send) {
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
  std::optional<PhaseTimer> waiting(&stats_.wait_seconds);
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
    return WaitFailed(op, transfer, error.what());
  } catch (const std::exception& error) {
    return AbortedError(fmt::format("round {}: {}: {} {}: {}", options_.round_id, op.name, what,
                                    PeerName(transfer.peer), error.what()));
  }
  not_waiting.completed = true;
  waiting.reset();
  return transfer.wire && !transfer.is_send ? Open(op, transfer) : OkStatus();
}

Status GlooCommunicator::Open(const Op& op, Transfer& transfer) {
  const PhaseTimer opening(&stats_.seal_seconds);
  const std::span<std::byte> wire(transfer.wire.get(), SealedBytes(transfer.plain.size()));
  if (sealer_->Open(transfer.place, wire, transfer.plain)) return OkStatus();
  return DataLossError(fmt::format(
      "round {}: {}: {} failed authentication: its piece does not open under this round's key (a "
      "member without the job token, a piece replayed or moved, or bytes changed on the way); "
      "rejected, none of its bytes used",
      options_.round_id, op.name, PeerName(transfer.peer)));
}

Status GlooCommunicator::Secure() {
  // Each member's random bytes, in the clear: changed on the way, they make
  // the members' keys differ, and every proof below fails.
  // (Part of the connect: its waits have connect_timeout.)
  const auto connect = std::chrono::microseconds(options_.connect_timeout);
  Op op;
  MEND_RETURN_IF_ERROR(Begin("handshake", &op));
  op.deadline = op.start + connect;
  std::array<std::byte, kMemberRandomBytes> mine{};
  MEND_RETURN_IF_ERROR(RandomBytes(mine));
  std::vector<std::byte> randoms(kMemberRandomBytes * static_cast<size_t>(options_.world_size));
  MEND_RETURN_IF_ERROR(End(op, GatherBytes(op, kWeights, mine, randoms)));
  const TranscriptDigest digest = Transcript(options_.prefix, options_.round_id,
                                             options_.world_size, options_.member_ids, randoms);
  MEND_ASSIGN_OR_RETURN(SealKey key, DeriveKey(options_.secret, digest));
  MEND_ASSIGN_OR_RETURN(sealer_, Sealer::Make(key, options_.seal_threads));
  // Every member's sealed digest: each that opens proves its sender holds
  // the key (and so the secret) and saw the same transcript.
  Op proof;
  MEND_RETURN_IF_ERROR(Begin("handshake", &proof));
  proof.deadline = proof.start + connect;
  std::vector<std::byte> proofs(digest.size() * static_cast<size_t>(options_.world_size));
  std::vector<Transfer> transfers;
  PostGather(proof, kWeights, digest, proofs, transfers);
  std::vector<std::string> failed;
  for (Transfer& transfer : transfers) {
    Status waited = Wait(proof, transfer);
    if (waited.code() == absl::StatusCode::kDataLoss) {
      failed.push_back(PeerName(transfer.peer));
    } else if (!waited.ok()) {
      return End(proof, waited);
    }
  }
  for (int r = 0; r < options_.world_size && failed.empty(); ++r) {
    if (std::memcmp(proofs.data() + r * digest.size(), digest.data(), digest.size()) != 0)
      failed.push_back(PeerName(r));
  }
  if (!failed.empty()) {
    std::string names;
    for (const std::string& name : failed)
      names += fmt::format("{}{} failed authentication", names.empty() ? "" : "; ", name);
    return End(proof, UnauthenticatedError(fmt::format(
                          "round {}: connecting to the members: {}: its proof does not open under "
                          "this round's key (it holds another job token, or bytes changed on the "
                          "way); the data plane refuses it",
                          options_.round_id, names)));
  }
  return End(proof, OkStatus());
}

Status GlooCommunicator::WaitFailed(const Op& op, const Transfer& transfer,
                                    const std::string& message) const {
  const char* what = transfer.is_send ? "sending to" : "receiving from";
  if (message.find("imed out") != std::string::npos) {
    return DeadlineExceededError(
        fmt::format("round {}: {}: {} {}: nothing within the {} ms deadline", options_.round_id,
                    op.name, what, PeerName(transfer.peer), options_.timeout / kMicrosPerMilli));
  }
  return AbortedError(fmt::format("round {}: {}: {} {}: connection lost ({})", options_.round_id,
                                  op.name, what, PeerName(transfer.peer), message));
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

}  // namespace mend::dataplane

namespace mend {

using dataplane::GlooCommunicator;
using dataplane::IgnoreBrokenPipes;

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
  auto comm = std::make_unique<GlooCommunicator>(options, std::move(device), std::move(context));
  if (!options.secret.empty()) MEND_RETURN_IF_ERROR(comm->Secure());
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace mend
