// The secure data plane's cryptography (docs/architecture.md, "Security"):
// every piece a communicator sends is sealed with AES-256-GCM (OpenSSL's
// EVP) under a key of its own.
//
// The key: HKDF-SHA256 over the job token, salted with the digest of the
// communicator's transcript: its rendezvous prefix, round, size, member ids,
// and 16 random bytes from every member, drawn when it connects. So only
// holders of the token derive it, each round and member set has its own, and
// a member that connects again (a restart, a resumed job, a round retried
// under the same prefix) makes a new one.
//
// The nonce (96 bits) is the piece's place: the operation (a counter that
// never repeats in a communicator), the lane, phase and segment, the
// sender's rank and the receiver's. A piece moved to another place, replayed
// from another round, sent by a member without the token, or changed on the
// way does not open.
//
// Lanes: a piece of 512 KiB or more is sealed as up to 16 lanes of at least
// 256 KiB, each with its own nonce and tag, so that a sealer with threads
// seals and opens them side by side. The wire bytes are the same whatever
// the threads; every lane must open for any byte of the piece to be used.
//
// Thread-safety: a Sealer is used by one thread at a time (its
// communicator's), which its own threads help; the functions are pure.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mend/status.h"

namespace mend::dataplane {

inline constexpr size_t kSealTagBytes = 16;
inline constexpr size_t kSealNonceBytes = 12;
inline constexpr size_t kMemberRandomBytes = 16;
inline constexpr size_t kSealLanes = 16;                // the most a piece has
inline constexpr size_t kSealLaneMinBytes = 256 << 10;  // a lane's least

// The lanes of a piece of `bytes` (at least one), and its size sealed: the
// ciphertext, then a tag a lane.
size_t SealLanes(size_t bytes);
inline size_t SealedBytes(size_t bytes) { return bytes + SealLanes(bytes) * kSealTagBytes; }
using SealKey = std::array<unsigned char, 32>;
using TranscriptDigest = std::array<std::byte, 32>;

// Where a piece goes: its nonce.
struct PiecePlace {
  uint64_t op = 0;        // < 2^36
  uint32_t phase = 0;     // < 2^4
  uint64_t segment = 0;   // < 2^20
  uint32_t sender = 0;    // < 2^16
  uint32_t receiver = 0;  // < 2^16
};
// INTERNAL when a field is out of its range (a bug in mend: two pieces would
// share a nonce).
[[nodiscard]] Status CheckPlace(const PiecePlace& place);
// The nonce of lane `lane` (< kSealLanes) of the piece at `place`.
std::array<unsigned char, kSealNonceBytes> NonceOf(const PiecePlace& place, size_t lane = 0);

// The SHA-256 of what every member of a communicator agrees on, and of every
// member's random bytes (`randoms`: kMemberRandomBytes each, by rank).
TranscriptDigest Transcript(std::string_view prefix, uint64_t round_id, int world_size,
                            const std::vector<std::string>& member_ids,
                            std::span<const std::byte> randoms);

// HKDF-SHA256(secret, salt = transcript, info = mend's label). INTERNAL when
// OpenSSL fails.
[[nodiscard]] StatusOr<SealKey> DeriveKey(std::string_view secret, const TranscriptDigest& salt);

// `n` random bytes from OpenSSL's generator.
[[nodiscard]] Status RandomBytes(std::span<std::byte> out);

class Sealer {
 public:
  // INTERNAL when OpenSSL cannot set up the cipher. `threads` seal and open
  // a piece's lanes (1: the caller alone).
  static StatusOr<std::unique_ptr<Sealer>> Make(const SealKey& key, int threads = 1);
  ~Sealer();
  Sealer(const Sealer&) = delete;
  Sealer& operator=(const Sealer&) = delete;

  // `wire` (SealedBytes(plain.size())) <- the ciphertext, then the tags.
  [[nodiscard]] Status Seal(const PiecePlace& place, std::span<const std::byte> plain,
                            std::span<std::byte> wire);
  // Decrypts `wire` (SealedBytes(plain.size())) in place and checks its
  // tags; only when every one verifies is the plaintext copied to `plain`:
  // bytes that do not authenticate never reach it. False when they do not.
  [[nodiscard]] bool Open(const PiecePlace& place, std::span<std::byte> wire,
                          std::span<std::byte> plain);

 private:
  struct Contexts;
  explicit Sealer(std::unique_ptr<Contexts> contexts);
  std::unique_ptr<Contexts> contexts_;
};

}  // namespace mend::dataplane
