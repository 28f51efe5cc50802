// The lighthouse's datagram (UDP) control channel: heartbeats and quorum
// joins from learners, acknowledgements and round decisions back, one UDP
// datagram each. It carries the same information as the gRPC Heartbeat and
// Quorum calls at a fraction of the cost per message, for jobs with
// thousands of learners (gRPC stays the default and does everything else:
// registration, the store, status, member lists).
//
// Wire format, little-endian:
//   u32 magic "MND1" | u8 kind | u8 version (kVersion) | u16 reserved (0)
//   u64 session_id | u64 seq | body | 16-byte MAC
// The body is the protocol's own protobuf message for the kind (see Kind):
// the same messages as the gRPC calls, so one handler on each side serves
// both channels (coordinator/control_handler.h, learner/control_proto.h).
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

#include "core/hmac.h"
#include "mend/status.h"

namespace mend::coordinator::datagram {

inline constexpr uint32_t kMagic = 0x31444E4D;  // "MND1" in little-endian order
// 2: acks carry the latest round's step; 3: decisions the round's step;
// 4: acks whether the learner's join is short of a quorum; 5: the bodies are
// the protocol's protobuf messages.
inline constexpr uint8_t kVersion = 5;
inline constexpr size_t kHeaderBytes = 24;
inline constexpr size_t kMacBytes = 16;
inline constexpr size_t kMaxDatagramBytes = 8192;

using Key = Sha256Bytes;

// The channel key of a job: HMAC-SHA256(token, "mend datagram channel v1").
Key DeriveKey(std::string_view token);

// Computes and checks MACs with one key; reuses its OpenSSL context.
class Signer {
 public:
  explicit Signer(const Key& key) : hmac_(key) {}

  // Appends the MAC of `datagram` to it.
  void Seal(std::string& datagram);
  // True when the last kMacBytes of `datagram` are the MAC of the rest.
  bool Verify(std::string_view datagram);

 private:
  Sha256Bytes Compute(std::string_view data);

  HmacSha256 hmac_;
};

// What each kind carries: the control protocol's own messages
// (proto/mend/v1/lighthouse.proto), serialized.
enum class Kind : uint8_t {
  kHeartbeat = 1,       // learner -> lighthouse: v1::HeartbeatRequest
  kJoin = 2,            // learner -> lighthouse: v1::DatagramJoin
  kAck = 3,             // lighthouse -> learner: v1::HeartbeatResponse
  kDecision = 4,        // lighthouse -> learner: v1::DatagramDecision
  kUnknownSession = 5,  // lighthouse -> learner, no body: register again (over gRPC)
  kSuperseded = 6,      // lighthouse -> learner, no body: a newer registration took the
                        // learner's id; the session's process must stop
};

struct Header {
  Kind kind = Kind::kHeartbeat;
  uint64_t session_id = 0;
  uint64_t seq = 0;
};

// The most body bytes one datagram holds.
inline constexpr size_t kMaxBodyBytes = kMaxDatagramBytes - kHeaderBytes - kMacBytes;

// Builds header + body and seals it with `signer`. The body must fit
// (kMaxBodyBytes); a longer one is a programming error and is cut.
std::string Encode(const Header& header, std::string_view body, Signer& signer);
// The header alone, with room reserved for a body of `body_bytes` and the
// MAC: a message is appended to it, then Seal (EncodeMessage does both).
std::string EncodeHeader(const Header& header, size_t body_bytes);
// Seals a datagram of header and body (a body past kMaxBodyBytes is cut).
void Seal(std::string& datagram, Signer& signer);

// Checks size, magic and version and reads the header. It does not check the
// MAC: call Signer::Verify before trusting anything.
[[nodiscard]] StatusOr<Header> ParseHeader(std::string_view datagram);

// The body of a datagram whose header parsed: the bytes between header and MAC.
std::string_view Body(std::string_view datagram);

// A message as a datagram's body, and back (INVALID_ARGUMENT when the body
// is not one). `Message` is a protobuf message type.
template <typename Message>
std::string EncodeMessage(const Header& header, const Message& body, Signer& signer) {
  std::string out = EncodeHeader(header, body.ByteSizeLong());
  body.AppendToString(&out);  // serialized in place, after the header
  Seal(out, signer);
  return out;
}
// Into `message`, reusing what it holds (a receiving thread's own): false
// when the body is not one.
template <typename Message>
[[nodiscard]] bool DecodeInto(std::string_view datagram, Message* message) {
  std::string_view body = Body(datagram);
  return message->ParseFromArray(body.data(), static_cast<int>(body.size()));
}
template <typename Message>
[[nodiscard]] StatusOr<Message> DecodeMessage(std::string_view datagram) {
  Message message;
  if (!DecodeInto(datagram, &message)) return InvalidArgumentError("malformed datagram body");
  return message;
}

}  // namespace mend::coordinator::datagram
