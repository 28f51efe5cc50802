// The lighthouse's datagram (UDP) control channel: heartbeats and quorum
// joins from learners, acknowledgements and round decisions back, one UDP
// datagram each. It carries the same information as the gRPC Heartbeat and
// Quorum calls at a fraction of the cost per message, for jobs with
// thousands of learners (gRPC stays the default and does everything else:
// registration, the store, status, member lists).
//
// Wire format, little-endian:
//   u32 magic "MND1" | u8 kind | u8 version (kVersion) | u16 reserved (0)
//   u64 session_id | u64 seq | body (per kind) | 16-byte MAC
// The MAC is HMAC-SHA256, truncated to 16 bytes, over everything before it,
// keyed by DeriveKey(job token): only holders of the job token can speak on
// the channel. `seq` grows with every datagram a sender sends in a session;
// a receiver drops any datagram whose seq is not above the last it accepted
// (replays, duplicates, reordering). Reliability is the sender's job: a
// learner resends a join until its decision arrives; the lighthouse resends a
// decision when it sees the join again.
//
// Thread-safety: encoding and decoding are pure functions; a Signer is used
// by one thread at a time.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mend/status.h"

typedef struct evp_mac_ctx_st EVP_MAC_CTX;

namespace mend::coordinator::datagram {

inline constexpr uint32_t kMagic = 0x31444E4D;  // "MND1" in little-endian order
// 2: acks carry the latest round's step; 3: decisions the round's step;
// 4: acks whether the learner's join is short of a quorum.
inline constexpr uint8_t kVersion = 4;
inline constexpr size_t kHeaderBytes = 24;
inline constexpr size_t kMacBytes = 16;
inline constexpr size_t kMaxDatagramBytes = 8192;
inline constexpr size_t kMaxStepTimes = 256;
inline constexpr size_t kMaxHealTo = 64;

using Key = std::array<uint8_t, 32>;

// The channel key of a job: HMAC-SHA256(token, "mend datagram channel v1").
Key DeriveKey(std::string_view token);

// Computes and checks MACs with one key; reuses its OpenSSL context.
class Signer {
 public:
  explicit Signer(const Key& key);
  ~Signer();
  Signer(const Signer&) = delete;
  Signer& operator=(const Signer&) = delete;

  // Appends the MAC of `datagram` to it.
  void Seal(std::string& datagram);
  // True when the last kMacBytes of `datagram` are the MAC of the rest.
  bool Verify(std::string_view datagram);

 private:
  std::array<uint8_t, 32> Compute(std::string_view data);

  EVP_MAC_CTX* context_;
};

enum class Kind : uint8_t {
  kHeartbeat = 1,       // learner -> lighthouse
  kJoin = 2,            // learner -> lighthouse
  kAck = 3,             // lighthouse -> learner
  kDecision = 4,        // lighthouse -> learner
  kUnknownSession = 5,  // lighthouse -> learner: register again (over gRPC)
};

struct Header {
  Kind kind = Kind::kHeartbeat;
  uint64_t session_id = 0;
  uint64_t seq = 0;
};

struct Heartbeat {
  uint64_t step = 0;
  uint64_t tokens_total = 0;
  uint64_t tokens_since_last_round = 0;
  std::vector<uint32_t> step_time_us;  // at most kMaxStepTimes
};

struct Join {
  uint64_t join_id = 0;  // chosen by the learner; resends reuse it
  uint64_t last_round_id = 0;
  uint64_t step = 0;
  uint64_t tokens_since_last_round = 0;
  uint32_t timeout_ms = 0;
};

struct Ack {
  bool slow = false;
  double slow_zscore = 0;
  uint64_t latest_round_id = 0;
  uint64_t lighthouse_instance = 0;
  uint64_t latest_round_step = 0;
  bool short_of_quorum = false;
};

struct Decision {
  uint64_t join_id = 0;
  uint8_t code = 0;  // a StatusCode; 0 is a round
  std::string message;
  uint64_t round_id = 0;
  uint32_t rank = 0;
  uint32_t world_size = 0;
  uint64_t total_tokens = 0;
  uint64_t heal_round_id = 0;
  uint64_t step = 0;
  uint32_t waited_ms = 0;
  std::string closed_by;
  std::string rendezvous_prefix;
  std::string heal_from_id;
  std::string heal_from_address;
  std::vector<std::string> heal_to;  // at most kMaxHealTo
  bool heal_to_truncated = false;
};

// Each Encode builds header + body and seals it with `signer`.
std::string Encode(const Header& header, const Heartbeat& body, Signer& signer);
std::string Encode(const Header& header, const Join& body, Signer& signer);
std::string Encode(const Header& header, const Ack& body, Signer& signer);
std::string Encode(const Header& header, const Decision& body, Signer& signer);
// kUnknownSession carries no body.
std::string EncodeUnknownSession(const Header& header, Signer& signer);

// Checks size, magic and version and reads the header. It does not check the
// MAC: call Signer::Verify before trusting anything.
[[nodiscard]] StatusOr<Header> ParseHeader(std::string_view datagram);

// Decode the body of a verified datagram; INVALID_ARGUMENT when malformed.
[[nodiscard]] StatusOr<Heartbeat> DecodeHeartbeat(std::string_view datagram);
[[nodiscard]] StatusOr<Join> DecodeJoin(std::string_view datagram);
[[nodiscard]] StatusOr<Ack> DecodeAck(std::string_view datagram);
[[nodiscard]] StatusOr<Decision> DecodeDecision(std::string_view datagram);

}  // namespace mend::coordinator::datagram
