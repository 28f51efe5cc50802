// The secure data plane (CommunicatorOptions::secret; src/dataplane/sealing.h):
// the same bits as the plain one, and the attacks it must stop, on loopback:
// a member without the token, and a forwarding proxy in front of a member
// that flips a byte, replays a piece recorded in an earlier round, or puts
// in pieces of an outsider's, and whose capture is searched for the values.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "dataplane/dataplane_fixture.h"
#include "dataplane/sealing.h"
#include "fmt/format.h"
#include "gmock/gmock.h"
#include "mend/codec.h"

namespace mend {
namespace {

using dataplane::DeriveKey;
using dataplane::kMemberRandomBytes;
using dataplane::kSealTagBytes;
using dataplane::PiecePlace;
using dataplane::Sealer;
using dataplane::Transcript;
using ::testing::HasSubstr;
using ::testing::Not;
using testing_util::InProcessStore;
using testing_util::MemberOptions;
using testing_util::NormalValues;

constexpr char kToken[] = "secure-test-token-0123";

std::vector<std::byte> Bytes(const std::vector<float>& values) {
  std::vector<std::byte> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// Whether any aligned 8 bytes of `values` occur in `haystack` at an offset
// that is a multiple of 4 (Gloo's messages and mend's pieces are whole
// floats).
bool AnyWindowIn(std::span<const std::byte> values, std::span<const std::byte> haystack) {
  std::unordered_set<uint64_t> windows(values.size() / 4);
  for (size_t at = 0; at + 8 <= values.size(); at += 8) {
    uint64_t word;
    std::memcpy(&word, values.data() + at, 8);
    windows.insert(word);
  }
  for (size_t at = 0; at + 8 <= haystack.size(); at += 4) {
    uint64_t word;
    std::memcpy(&word, haystack.data() + at, 8);
    if (windows.count(word) > 0) return true;
  }
  return false;
}

std::unique_ptr<Sealer> SealerFor(const std::string& token, uint8_t random_fill) {
  std::vector<std::byte> randoms(2 * kMemberRandomBytes, std::byte{random_fill});
  auto key = DeriveKey(token, Transcript("job/round/7/", 7, 2, {"a", "b"}, randoms));
  EXPECT_TRUE(key.ok()) << key.status();
  auto sealer = Sealer::Make(*key);
  EXPECT_TRUE(sealer.ok()) << sealer.status();
  return std::move(*sealer);
}

TEST(SealingTest, APieceOpensOnlyUnchangedAtItsPlaceUnderItsKey) {
  const std::vector<std::byte> plain = Bytes(NormalValues(1, 4096));
  const PiecePlace place{3, 1, 2, 0, 1};
  std::unique_ptr<Sealer> sealer = SealerFor(kToken, 1);
  std::vector<std::byte> wire(dataplane::SealedBytes(plain.size()));
  ASSERT_TRUE(sealer->Seal(place, plain, wire).ok());
  EXPECT_FALSE(AnyWindowIn(plain, wire));  // nothing of the values in the clear

  // `opener` opens a copy of `sent` at `at` into a buffer that starts as
  // 0x5A: whether it opened, and whether the buffer changed.
  auto open = [&](Sealer& opener, const PiecePlace& at, std::vector<std::byte> sent) {
    std::vector<std::byte> out(plain.size(), std::byte{0x5A});
    const bool opened = opener.Open(at, sent, out);
    const bool untouched =
        std::all_of(out.begin(), out.end(), [](std::byte b) { return b == std::byte{0x5A}; });
    EXPECT_EQ(opened, !untouched);
    if (opened) {
      EXPECT_EQ(out, plain);
    }
    return opened;
  };
  EXPECT_TRUE(open(*sealer, place, wire));
  for (size_t at : {size_t{0}, plain.size() / 2, plain.size(), wire.size() - 1}) {
    std::vector<std::byte> flipped = wire;
    flipped[at] ^= std::byte{0x01};
    EXPECT_FALSE(open(*sealer, place, flipped)) << "byte " << at << " flipped";
  }
  for (PiecePlace other :
       {PiecePlace{4, 1, 2, 0, 1}, PiecePlace{3, 2, 2, 0, 1}, PiecePlace{3, 1, 3, 0, 1},
        PiecePlace{3, 1, 2, 1, 0}, PiecePlace{3, 1, 2, 0, 2}}) {
    EXPECT_FALSE(open(*sealer, other, wire)) << "moved to op " << other.op;
  }
  EXPECT_FALSE(open(*SealerFor("another-token-4567", 1), place, wire));  // another token
  EXPECT_FALSE(open(*SealerFor(kToken, 2), place, wire));  // another connect's randoms
}

TEST(SealingTest, PlacesThatDoNotFitTheNonceAreRefused) {
  EXPECT_TRUE(dataplane::CheckPlace({(uint64_t{1} << 36) - 1, 15, (1u << 20) - 1, 65535, 0}).ok());
  for (PiecePlace bad : {PiecePlace{uint64_t{1} << 36, 0, 0, 0, 0}, PiecePlace{1, 16, 0, 0, 0},
                         PiecePlace{1, 0, 1u << 20, 0, 0}, PiecePlace{1, 0, 0, 1u << 16, 0},
                         PiecePlace{1, 0, 0, 0, 1u << 16}}) {
    EXPECT_EQ(dataplane::CheckPlace(bad).code(), absl::StatusCode::kInternal);
  }
}

// A large piece is sealed in lanes, each with its own tag: the same wire
// bytes with one thread or several, opened by either; a byte flipped in any
// lane or tag, or two lanes swapped, and nothing of it opens.
TEST(SealingTest, ALargePiecesLanesSealTheSameOnAnyThreadsAndOpenOnlyAllTogether) {
  EXPECT_EQ(dataplane::SealLanes(0), 1u);
  EXPECT_EQ(dataplane::SealLanes((512 << 10) - 1), 1u);
  EXPECT_EQ(dataplane::SealLanes(512 << 10), 2u);
  EXPECT_EQ(dataplane::SealLanes(size_t{100} << 20), dataplane::kSealLanes);
  const std::vector<std::byte> plain = Bytes(NormalValues(2, (1 << 18) + 3));  // 1 MiB + 12 bytes
  const size_t lanes = dataplane::SealLanes(plain.size());
  ASSERT_EQ(lanes, 4u);
  ASSERT_EQ(dataplane::SealedBytes(plain.size()), plain.size() + 4 * kSealTagBytes);
  std::vector<uint8_t> randoms(2 * kMemberRandomBytes, 3);
  auto key = DeriveKey(
      kToken, Transcript("job/round/7/", 7, 2, {"a", "b"}, std::as_bytes(std::span(randoms))));
  ASSERT_TRUE(key.ok());
  std::unique_ptr<Sealer> one = std::move(*Sealer::Make(*key, 1));
  std::unique_ptr<Sealer> three = std::move(*Sealer::Make(*key, 3));
  const PiecePlace place{5, 2, 9, 1, 0};
  std::vector<std::byte> wire(dataplane::SealedBytes(plain.size())), again(wire.size());
  ASSERT_TRUE(one->Seal(place, plain, wire).ok());
  ASSERT_TRUE(three->Seal(place, plain, again).ok());
  EXPECT_EQ(wire, again);
  auto opens = [&](Sealer& opener, std::vector<std::byte> sent) {
    std::vector<std::byte> out(plain.size(), std::byte{0x5A});
    const bool opened = opener.Open(place, sent, out);
    if (opened) {
      EXPECT_EQ(out, plain);
    } else {
      EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](std::byte b) {
        return b == std::byte{0x5A};
      })) << "bytes of a piece that did not open reached its destination";
    }
    return opened;
  };
  EXPECT_TRUE(opens(*one, wire));
  EXPECT_TRUE(opens(*three, wire));
  const size_t lane_bytes = (plain.size() + lanes - 1) / lanes;
  for (size_t lane = 0; lane < lanes; ++lane) {
    std::vector<std::byte> flipped = wire;
    flipped[lane * lane_bytes + 7] ^= std::byte{0x10};
    EXPECT_FALSE(opens(*three, flipped)) << "lane " << lane;
    flipped = wire;
    flipped[plain.size() + lane * kSealTagBytes + 3] ^= std::byte{0x01};
    EXPECT_FALSE(opens(*three, flipped)) << "lane " << lane << "'s tag";
  }
  std::vector<std::byte> swapped = wire;
  std::swap_ranges(swapped.begin(), swapped.begin() + lane_bytes, swapped.begin() + lane_bytes);
  std::swap_ranges(swapped.begin() + plain.size(), swapped.begin() + plain.size() + kSealTagBytes,
                   swapped.begin() + plain.size() + kSealTagBytes);
  EXPECT_FALSE(opens(*one, swapped)) << "lanes 0 and 1 swapped, with their tags";
}

// Connects `size` members through `store` (one thread each; `tweak` sets a
// rank's options) and runs `body` on each that connected; each rank's
// connect status.
std::vector<Status> RunThrough(RendezvousStore& store, int size,
                               const std::function<void(int, CommunicatorOptions&)>& tweak,
                               const std::function<void(int, Communicator&)>& body,
                               const std::string& prefix = "job/round/7/") {
  std::vector<Status> connected(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank]() {
      CommunicatorOptions options = MemberOptions(rank, size, prefix);
      options.secret = kToken;
      if (tweak) tweak(rank, options);
      auto comm = Communicator::Connect(store, options);
      connected[static_cast<size_t>(rank)] = comm.status();
      if (comm.ok()) body(rank, **comm);
    });
  }
  for (auto& thread : threads) thread.join();
  return connected;
}

TEST(SecureCommunicatorTest, EveryOperationGivesThePlainDataPlanesBits) {
  constexpr int kMembers = 3;
  struct Results {
    std::vector<std::vector<float>> fp32, int8;
    std::vector<std::vector<std::byte>> gathered, broadcast;
    std::vector<CommunicatorStats> stats;
  };
  // secure: 0 plain, 1 sealed in pieces of one lane, 2 in lanes on 3 threads.
  auto run = [&](int secure) {
    Results results;
    results.fp32.resize(kMembers);
    results.int8.resize(kMembers);
    results.gathered.resize(kMembers);
    results.broadcast.resize(kMembers);
    results.stats.resize(kMembers);
    InProcessStore store;
    std::vector<Status> connected = RunThrough(
        store, kMembers,
        [&](int, CommunicatorOptions& options) {
          if (secure == 0) options.secret.clear();
          options.segment_bytes = 64 << 10;  // many segments, many pieces
          if (secure == 2) {
            options.segment_bytes = 1 << 20;  // pieces of 4 lanes
            options.seal_threads = 3;
          }
        },
        [&](int rank, Communicator& comm) {
          std::vector<float> fp32 = NormalValues(10 + rank, 1500001);
          EXPECT_TRUE(comm.WeightedAllReduce(fp32, rank + 1.0, nullptr).ok());
          auto int8 = MakeCodec({CodecKind::kInt8});
          ASSERT_TRUE(int8.ok());
          std::vector<float> coded = NormalValues(20 + rank, 100000);
          EXPECT_TRUE(comm.WeightedAllReduce(coded, 1.0, int8->get()).ok());
          std::vector<std::byte> mine(1000, std::byte(rank + 1));
          std::vector<std::byte> gathered(1000 * kMembers);
          EXPECT_TRUE(comm.AllGather(mine, gathered).ok());
          std::vector<std::byte> broadcast =
              rank == 1 ? Bytes(NormalValues(30, 50000)) : std::vector<std::byte>(200000);
          EXPECT_TRUE(comm.Broadcast(broadcast, 1).ok());
          results.fp32[rank] = std::move(fp32);
          results.int8[rank] = std::move(coded);
          results.gathered[rank] = std::move(gathered);
          results.broadcast[rank] = std::move(broadcast);
          results.stats[rank] = comm.stats();
        });
    for (const Status& status : connected) EXPECT_TRUE(status.ok()) << status;
    return results;
  };
  const Results plain = run(0);
  for (const Results& secure : {run(1), run(2)}) {
    for (int rank = 0; rank < kMembers; ++rank) {
      EXPECT_EQ(secure.fp32[rank], plain.fp32[rank]) << "rank " << rank;
      EXPECT_EQ(secure.fp32[rank], plain.fp32[0]);  // and the same on every member
      EXPECT_EQ(secure.int8[rank], plain.int8[rank]);
      EXPECT_EQ(secure.gathered[rank], plain.gathered[rank]);
      EXPECT_EQ(secure.broadcast[rank], Bytes(NormalValues(30, 50000)));
      // Each piece carries its tag, and sealing took time; the plain plane seals nothing.
      EXPECT_GT(secure.stats[rank].bytes_sent, plain.stats[rank].bytes_sent);
      EXPECT_GT(secure.stats[rank].seal_seconds, 0);
      EXPECT_EQ(plain.stats[rank].seal_seconds, 0);
    }
  }
}

TEST(SecureCommunicatorTest, AMemberWithAnotherTokenIsRefusedAtTheConnectNamedByTheOthers) {
  InProcessStore store;
  std::atomic<int> operations{0};
  std::vector<Status> connected = RunThrough(
      store, 3,
      [](int rank, CommunicatorOptions& options) {
        if (rank == 2) options.secret = "a-guessed-token-000";
      },
      [&](int, Communicator&) { operations++; });
  EXPECT_EQ(operations.load(), 0);  // nobody got to exchange anything
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(connected[rank].code(), absl::StatusCode::kUnauthenticated) << connected[rank];
    EXPECT_THAT(connected[rank].message(),
                HasSubstr("member 2 ('learner-2') failed authentication"));
    EXPECT_THAT(connected[rank].message(), Not(HasSubstr("('learner-" + std::to_string(1 - rank) +
                                                         "') failed authentication")));
  }
  // The outsider finds that nobody else opens under its key.
  EXPECT_EQ(connected[2].code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(connected[2].message(), HasSubstr("('learner-0') failed authentication"));
  EXPECT_THAT(connected[2].message(), HasSubstr("('learner-1') failed authentication"));
}

// ---------------------------------------------------------------------------
// A forwarding proxy between two members, put in by rewriting the Gloo
// addresses they publish at the rendezvous.

constexpr size_t kAddressBytes = sizeof(sockaddr_storage) + sizeof(ssize_t);  // Gloo's tcp::Address
constexpr size_t kPreambleBytes = 6 * sizeof(size_t);  // Gloo's tcp Op preamble
constexpr size_t kSendUnboundBuffer = 1;               // its opcode
constexpr char kProxyHost[] = "127.0.0.5";
// Member 0 listens on 127.0.0.1, member 1 on 127.0.0.9: Gloo decides which
// side of a pair connects by comparing the addresses, and with the proxies
// between the two at 127.0.0.5 both sides still decide alike.
constexpr char kMemberHosts[2][10] = {"127.0.0.1", "127.0.0.9"};

// What the proxy does to one of Gloo's data messages from member 1: its slot
// and payload, changeable in place.
using Tamper = std::function<void(uint64_t slot, std::span<std::byte> payload)>;

// The operation a slot belongs to (MakeSlot's op, its low 24 bits).
uint64_t SlotOp(uint64_t slot) { return (slot >> 24) & 0xFFFFFF; }

class Proxy {
 public:
  // In front of `target`, a listening socket of member `target_member`.
  Proxy(sockaddr_in target, int target_member, Tamper tamper)
      : target_(target), target_member_(target_member), tamper_(std::move(tamper)) {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    inet_pton(AF_INET, kProxyHost, &address.sin_addr);
    EXPECT_EQ(bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    EXPECT_EQ(listen(listener_, 4), 0);
    socklen_t length = sizeof(address_);
    getsockname(listener_, reinterpret_cast<sockaddr*>(&address_), &length);
    accepter_ = std::thread([this]() { Accept(); });
  }
  ~Proxy() {
    shutdown(listener_, SHUT_RDWR);  // ends the accept
    accepter_.join();
    for (std::thread& relay : relays_) relay.join();
    close(listener_);
    for (int fd : fds_) close(fd);
  }
  const sockaddr_in& address() const { return address_; }
  // Everything that passed, both ways.
  std::vector<std::byte> Capture() const {
    std::lock_guard lock(mu_);
    return capture_;
  }
  // Data messages from member 1 seen, and any framing it could not read.
  int messages() const { return messages_; }
  bool misread() const { return misread_; }

 private:
  void Accept() {
    const int client = accept(listener_, nullptr, nullptr);
    if (client < 0) return;
    const int server = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(server, reinterpret_cast<const sockaddr*>(&target_), sizeof(target_)) != 0) {
      close(client);
      close(server);
      return;
    }
    fds_ = {client, server};
    // Member 1's bytes come from the server when it is the target, else from the client.
    const bool from_server_is_member1 = target_member_ == 1;
    relays_.emplace_back([=, this]() { Relay(server, client, from_server_is_member1); });
    relays_.emplace_back([=, this]() { Relay(client, server, !from_server_is_member1); });
  }
  bool ReadAll(int fd, void* data, size_t n) {
    return n == 0 || recv(fd, data, n, MSG_WAITALL) == static_cast<ssize_t>(n);
  }
  bool WriteAll(int fd, const void* data, size_t n) {
    const char* at = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t written = send(fd, at, n, MSG_NOSIGNAL);
      if (written <= 0) return false;
      at += written;
      n -= static_cast<size_t>(written);
    }
    return true;
  }
  void Record(const void* data, size_t n) {
    std::lock_guard lock(mu_);
    const auto* bytes = static_cast<const std::byte*>(data);
    capture_.insert(capture_.end(), bytes, bytes + n);
  }
  // Copies from `from` to `to` until either closes; member 1's direction
  // message by message (Gloo's preamble, then a data message's payload).
  void Relay(int from, int to, bool member1) {
    std::vector<std::byte> buffer(1 << 16);
    while (true) {
      if (!member1) {
        const ssize_t n = recv(from, buffer.data(), buffer.size(), 0);
        if (n <= 0 || !WriteAll(to, buffer.data(), static_cast<size_t>(n))) break;
        Record(buffer.data(), static_cast<size_t>(n));
        continue;
      }
      size_t preamble[6];
      if (!ReadAll(from, preamble, kPreambleBytes)) break;
      const size_t nbytes = preamble[0], opcode = preamble[1], length = preamble[4];
      if (nbytes < kPreambleBytes || opcode > 3 ||
          (opcode == kSendUnboundBuffer && nbytes != kPreambleBytes + length)) {
        misread_ = true;
        break;
      }
      std::vector<std::byte> payload(nbytes - kPreambleBytes);
      if (!ReadAll(from, payload.data(), payload.size())) break;
      if (opcode == kSendUnboundBuffer) {
        messages_++;
        if (tamper_) tamper_(preamble[2], payload);
      }
      Record(preamble, kPreambleBytes);
      Record(payload.data(), payload.size());
      if (!WriteAll(to, preamble, kPreambleBytes) || !WriteAll(to, payload.data(), payload.size()))
        break;
    }
    shutdown(from, SHUT_RDWR);
    shutdown(to, SHUT_RDWR);
  }

  const sockaddr_in target_;
  const int target_member_;
  const Tamper tamper_;
  int listener_ = -1;
  sockaddr_in address_{};
  std::thread accepter_;
  std::vector<std::thread> relays_;
  std::vector<int> fds_;
  mutable std::mutex mu_;
  std::vector<std::byte> capture_;
  std::atomic<int> messages_{0};
  std::atomic<bool> misread_{false};
};

// A store that puts a proxy in front of every member's Gloo address.
class ProxyingStore final : public RendezvousStore {
 public:
  explicit ProxyingStore(Tamper tamper) : tamper_(std::move(tamper)) {}
  Status Set(const std::string& key, const std::string& value) override {
    std::string rewritten = value;
    const size_t gloo = key.find("gloo/");
    if (gloo != std::string::npos && !value.empty() && value.size() % kAddressBytes == 0) {
      const int member = std::atoi(key.c_str() + gloo + 5);
      for (size_t at = 0; at < rewritten.size(); at += kAddressBytes) {
        sockaddr_in target;
        std::memcpy(&target, rewritten.data() + at, sizeof(target));
        if (target.sin_family != AF_INET) continue;
        std::lock_guard lock(mu_);
        proxies_.push_back(std::make_unique<Proxy>(target, member, tamper_));
        std::memcpy(rewritten.data() + at, &proxies_.back()->address(), sizeof(sockaddr_in));
      }
    }
    return store_.Set(key, rewritten);
  }
  StatusOr<std::string> Get(const std::string& key, Micros timeout) override {
    return store_.Get(key, timeout);
  }
  std::vector<std::byte> Capture() const {
    std::lock_guard lock(mu_);
    std::vector<std::byte> all;
    for (const auto& proxy : proxies_) {
      std::vector<std::byte> one = proxy->Capture();
      all.insert(all.end(), one.begin(), one.end());
    }
    return all;
  }
  int messages() const {
    std::lock_guard lock(mu_);
    int n = 0;
    for (const auto& proxy : proxies_) n += proxy->messages();
    return n;
  }
  bool misread() const {
    std::lock_guard lock(mu_);
    return std::any_of(proxies_.begin(), proxies_.end(),
                       [](const auto& proxy) { return proxy->misread(); });
  }

 private:
  const Tamper tamper_;
  InProcessStore store_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Proxy>> proxies_;
};

// Two members through the proxies, an fp32 all-reduce of 1 Mi values each
// (in pieces of 64 KiB); each member's status and values after it.
struct ProxiedRound {
  std::vector<Status> connected, reduced;
  std::vector<std::vector<float>> before, after;
};
ProxiedRound ReduceThroughProxy(ProxyingStore& store, bool secure, uint64_t round = 7) {
  ProxiedRound out;
  out.reduced.resize(2);
  out.before = {NormalValues(40, 1 << 20), NormalValues(41, 1 << 20)};
  out.after = out.before;
  out.connected = RunThrough(
      store, 2,
      [&](int rank, CommunicatorOptions& options) {
        options.bind_host = kMemberHosts[rank];
        options.round_id = round;
        options.segment_bytes = 64 << 10;
        options.timeout = 20 * kMicrosPerSecond;
        if (!secure) options.secret.clear();
      },
      [&](int rank, Communicator& comm) {
        out.reduced[rank] = comm.WeightedAllReduce(out.after[rank], 1.0, nullptr);
      },
      fmt::format("job/round/{}/", round));
  return out;
}

// The all-reduce's correct result, on a plain data plane without a proxy.
std::vector<float> ReferenceMean() {
  std::vector<float> result;
  InProcessStore store;
  RunThrough(
      store, 2, [](int, CommunicatorOptions& options) { options.secret.clear(); },
      [&](int rank, Communicator& comm) {
        std::vector<float> values = NormalValues(40 + rank, 1 << 20);
        ASSERT_TRUE(comm.WeightedAllReduce(values, 1.0, nullptr).ok());
        if (rank == 0) result = std::move(values);
      });
  return result;
}

TEST(SecureCommunicatorTest, ACaptureOfASecureRoundHoldsNoneOfTheValues) {
  for (bool secure : {false, true}) {
    ProxyingStore store(nullptr);
    ProxiedRound round = ReduceThroughProxy(store, secure);
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(round.connected[rank].ok()) << round.connected[rank];
      ASSERT_TRUE(round.reduced[rank].ok()) << round.reduced[rank];
    }
    EXPECT_FALSE(store.misread());
    const std::vector<std::byte> capture = store.Capture();
    ASSERT_GT(capture.size(), size_t{4} << 20) << "the round did not pass through the proxy";
    // The plain data plane shows the values (so the search finds them); the
    // secure one shows neither member's values nor the result.
    for (const auto& values : {round.before[0], round.before[1], round.after[0]}) {
      EXPECT_EQ(AnyWindowIn(Bytes(values), capture), !secure) << (secure ? "secure" : "plain");
    }
  }
}

// Member 0's outcome when member 1's pieces are changed on the way by
// `tamper`: its all-reduce fails naming member 1, and none of its values is
// anything but its own or the correct mean (nothing unauthenticated merged).
void ExpectRejectedNamingMember1(ProxyingStore& store, const ProxiedRound& round) {
  EXPECT_FALSE(store.misread());
  ASSERT_TRUE(round.connected[0].ok()) << round.connected[0];
  EXPECT_EQ(round.reduced[0].code(), absl::StatusCode::kDataLoss) << round.reduced[0];
  EXPECT_THAT(round.reduced[0].message(),
              HasSubstr("member 1 ('learner-1') failed authentication"));
  EXPECT_FALSE(round.reduced[1].ok());  // member 0 stopped, so member 1's round fails too
  const std::vector<float> mean = ReferenceMean();
  size_t foreign = 0;
  for (size_t i = 0; i < mean.size(); ++i) {
    const float v = round.after[0][i];
    if (std::memcmp(&v, &mean[i], 4) != 0 && std::memcmp(&v, &round.before[0][i], 4) != 0)
      ++foreign;
  }
  EXPECT_EQ(foreign, 0u);
}

TEST(SecureCommunicatorTest, AByteFlippedOnTheWayIsRejectedAndItsSenderNamed) {
  std::atomic<bool> flipped{false};
  ProxyingStore store([&](uint64_t slot, std::span<std::byte> payload) {
    if (SlotOp(slot) >= 3 && payload.size() > 1024 && !flipped.exchange(true))
      payload[payload.size() / 3] ^= std::byte{0x10};
  });
  ProxiedRound round = ReduceThroughProxy(store, true);
  ASSERT_TRUE(flipped.load());
  ExpectRejectedNamingMember1(store, round);
}

TEST(SecureCommunicatorTest, AnOutsidersWellFormedPieceIsRejectedAndNoValueChanges) {
  // The outsider seals pieces of its own, of the right size at the right
  // place, under a key of its own (it has no token), and puts them in place
  // of member 1's.
  std::unique_ptr<Sealer> outsider = SealerFor("an-outsiders-token-99", 7);
  std::atomic<int> replaced{0};
  ProxyingStore store([&](uint64_t slot, std::span<std::byte> payload) {
    if (SlotOp(slot) < 3 || payload.size() <= kSealTagBytes) return;
    size_t plain = payload.size() - kSealTagBytes;  // the piece's size, sealed to this payload
    while (dataplane::SealedBytes(plain) > payload.size()) plain -= kSealTagBytes;
    std::vector<std::byte> mine(plain, std::byte{0x42});
    const PiecePlace place{SlotOp(slot), static_cast<uint32_t>((slot >> 20) & 0xF), slot & 0xFFFFF,
                           1, 0};
    ASSERT_TRUE(outsider->Seal(place, mine, payload).ok());
    replaced++;
  });
  ProxiedRound round = ReduceThroughProxy(store, true);
  ASSERT_GT(replaced.load(), 0);
  ExpectRejectedNamingMember1(store, round);
}

TEST(SecureCommunicatorTest, APieceRecordedInOneRoundIsRejectedInTheNext) {
  // Round 7: member 1's pieces recorded by slot; round 8 (the same
  // operations, so the same slots): one of them played in place of the new.
  std::mutex mu;
  std::map<uint64_t, std::vector<std::byte>> recorded;
  {
    ProxyingStore store([&](uint64_t slot, std::span<std::byte> payload) {
      std::lock_guard lock(mu);
      recorded[slot].assign(payload.begin(), payload.end());
    });
    ProxiedRound round = ReduceThroughProxy(store, true, 7);
    ASSERT_TRUE(round.reduced[0].ok()) << round.reduced[0];
  }
  std::atomic<int> replayed{0};
  ProxyingStore store([&](uint64_t slot, std::span<std::byte> payload) {
    std::lock_guard lock(mu);
    auto old = recorded.find(slot);
    if (SlotOp(slot) < 3 || old == recorded.end() || old->second.size() != payload.size()) return;
    if (std::equal(payload.begin(), payload.end(), old->second.begin())) return;
    std::copy(old->second.begin(), old->second.end(), payload.begin());
    replayed++;
  });
  ProxiedRound round = ReduceThroughProxy(store, true, 8);
  ASSERT_GT(replayed.load(), 0);
  ExpectRejectedNamingMember1(store, round);
}

}  // namespace
}  // namespace mend
