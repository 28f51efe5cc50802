#include "wire/datagram.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstring>

#include "core/status_format.h"
#include "fmt/format.h"

namespace mend::coordinator::datagram {
namespace {

constexpr std::string_view kKeyLabel = "mend datagram channel v1";
constexpr size_t kMaxString = 1024;

// Appends little-endian integers and length-prefixed strings.
class Writer {
 public:
  explicit Writer(const Header& header) {
    out_.reserve(128);
    U32(kMagic);
    U8(static_cast<uint8_t>(header.kind));
    U8(kVersion);
    U16(0);
    U64(header.session_id);
    U64(header.seq);
  }
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U16(uint16_t v) { Raw(&v, 2); }
  void U32(uint32_t v) { Raw(&v, 4); }
  void U64(uint64_t v) { Raw(&v, 8); }
  void F64(double v) { Raw(&v, 8); }
  void Str(std::string_view s) {
    size_t n = std::min(s.size(), kMaxString);
    U16(static_cast<uint16_t>(n));
    out_.append(s.data(), n);
  }
  std::string Seal(Signer& signer) {
    signer.Seal(out_);
    return std::move(out_);
  }

 private:
  void Raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  std::string out_;
};

// Reads what Writer wrote; every read is bounds-checked.
class Reader {
 public:
  // A datagram too short for header and MAC reads as an empty body.
  explicit Reader(std::string_view datagram)
      : data_(datagram.size() < kHeaderBytes + kMacBytes
                  ? std::string_view()
                  : datagram.substr(kHeaderBytes, datagram.size() - kHeaderBytes - kMacBytes)) {}
  bool U8(uint8_t& v) { return Raw(&v, 1); }
  bool U16(uint16_t& v) { return Raw(&v, 2); }
  bool U32(uint32_t& v) { return Raw(&v, 4); }
  bool U64(uint64_t& v) { return Raw(&v, 8); }
  bool F64(double& v) { return Raw(&v, 8); }
  bool Str(std::string& s) {
    uint16_t n = 0;
    if (!U16(n) || n > kMaxString || data_.size() - pos_ < n) return false;
    s.assign(data_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  // True when every byte was consumed.
  bool Done() const { return pos_ == data_.size(); }

 private:
  bool Raw(void* p, size_t n) {
    if (data_.size() - pos_ < n) return false;
    std::memcpy(p, data_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  std::string_view data_;
  size_t pos_ = 0;
};

template <typename T>
StatusOr<T> Malformed(std::string_view what) {
  return InvalidArgumentError(fmt::format("malformed {} datagram", what));
}

}  // namespace

Key DeriveKey(std::string_view token) {
  Key key{};
  unsigned int length = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
       reinterpret_cast<const unsigned char*>(kKeyLabel.data()), kKeyLabel.size(), key.data(),
       &length);
  return key;
}

Signer::Signer(const Key& key) {
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  context_ = EVP_MAC_CTX_new(mac);
  EVP_MAC_free(mac);
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                         OSSL_PARAM_construct_end()};
  EVP_MAC_init(context_, key.data(), key.size(), params);
}

Signer::~Signer() { EVP_MAC_CTX_free(context_); }

std::array<uint8_t, 32> Signer::Compute(std::string_view data) {
  std::array<uint8_t, 32> mac{};
  size_t length = 0;
  // Re-initialising with no key keeps the key schedule and restarts the MAC.
  EVP_MAC_init(context_, nullptr, 0, nullptr);
  EVP_MAC_update(context_, reinterpret_cast<const unsigned char*>(data.data()), data.size());
  EVP_MAC_final(context_, mac.data(), &length, mac.size());
  return mac;
}

void Signer::Seal(std::string& datagram) {
  auto mac = Compute(datagram);
  datagram.append(reinterpret_cast<const char*>(mac.data()), kMacBytes);
}

bool Signer::Verify(std::string_view datagram) {
  if (datagram.size() < kHeaderBytes + kMacBytes) return false;
  auto mac = Compute(datagram.substr(0, datagram.size() - kMacBytes));
  return CRYPTO_memcmp(mac.data(), datagram.data() + datagram.size() - kMacBytes, kMacBytes) == 0;
}

std::string Encode(const Header& header, const Heartbeat& body, Signer& signer) {
  Writer w(header);
  w.U64(body.step);
  w.U64(body.tokens_total);
  w.U64(body.tokens_since_last_round);
  size_t n = std::min(body.step_time_us.size(), kMaxStepTimes);
  w.U16(static_cast<uint16_t>(n));
  // The newest step times when there are too many.
  for (size_t i = body.step_time_us.size() - n; i < body.step_time_us.size(); ++i) {
    w.U32(body.step_time_us[i]);
  }
  return w.Seal(signer);
}

std::string Encode(const Header& header, const Join& body, Signer& signer) {
  Writer w(header);
  w.U64(body.join_id);
  w.U64(body.last_round_id);
  w.U64(body.step);
  w.U64(body.tokens_since_last_round);
  w.U32(body.timeout_ms);
  return w.Seal(signer);
}

std::string Encode(const Header& header, const Ack& body, Signer& signer) {
  Writer w(header);
  w.U8(body.slow ? 1 : 0);
  w.F64(body.slow_zscore);
  w.U64(body.latest_round_id);
  w.U64(body.lighthouse_instance);
  w.U64(body.latest_round_step);
  w.U8(body.short_of_quorum ? 1 : 0);
  return w.Seal(signer);
}

std::string Encode(const Header& header, const Decision& body, Signer& signer) {
  Writer w(header);
  w.U64(body.join_id);
  w.U8(body.code);
  w.Str(body.message);
  w.U64(body.round_id);
  w.U32(body.rank);
  w.U32(body.world_size);
  w.U64(body.total_tokens);
  w.U64(body.heal_round_id);
  w.U64(body.step);
  w.U32(body.waited_ms);
  w.Str(body.closed_by);
  w.Str(body.rendezvous_prefix);
  w.Str(body.heal_from_id);
  w.Str(body.heal_from_address);
  size_t n = std::min(body.heal_to.size(), kMaxHealTo);
  w.U8(body.heal_to_truncated || n < body.heal_to.size() ? 1 : 0);
  w.U16(static_cast<uint16_t>(n));
  for (size_t i = 0; i < n; ++i) w.Str(body.heal_to[i]);
  return w.Seal(signer);
}

std::string EncodeUnknownSession(const Header& header, Signer& signer) {
  return Writer(header).Seal(signer);
}

StatusOr<Header> ParseHeader(std::string_view datagram) {
  if (datagram.size() < kHeaderBytes + kMacBytes || datagram.size() > kMaxDatagramBytes) {
    return InvalidArgumentError(fmt::format("datagram of {} bytes", datagram.size()));
  }
  uint32_t magic = 0;
  std::memcpy(&magic, datagram.data(), 4);
  auto kind = static_cast<uint8_t>(datagram[4]);
  auto version = static_cast<uint8_t>(datagram[5]);
  if (magic != kMagic) return InvalidArgumentError("not a mend datagram");
  if (version != kVersion) {
    return InvalidArgumentError(
        fmt::format("datagram version {}, this side speaks {}", version, kVersion));
  }
  if (kind < 1 || kind > 5) return InvalidArgumentError(fmt::format("datagram kind {}", kind));
  Header header;
  header.kind = static_cast<Kind>(kind);
  std::memcpy(&header.session_id, datagram.data() + 8, 8);
  std::memcpy(&header.seq, datagram.data() + 16, 8);
  return header;
}

StatusOr<Heartbeat> DecodeHeartbeat(std::string_view datagram) {
  Reader r(datagram);
  Heartbeat body;
  uint16_t n = 0;
  if (!r.U64(body.step) || !r.U64(body.tokens_total) || !r.U64(body.tokens_since_last_round) ||
      !r.U16(n) || n > kMaxStepTimes) {
    return Malformed<Heartbeat>("heartbeat");
  }
  body.step_time_us.resize(n);
  for (uint32_t& us : body.step_time_us) {
    if (!r.U32(us)) return Malformed<Heartbeat>("heartbeat");
  }
  if (!r.Done()) return Malformed<Heartbeat>("heartbeat");
  return body;
}

StatusOr<Join> DecodeJoin(std::string_view datagram) {
  Reader r(datagram);
  Join body;
  if (!r.U64(body.join_id) || !r.U64(body.last_round_id) || !r.U64(body.step) ||
      !r.U64(body.tokens_since_last_round) || !r.U32(body.timeout_ms) || !r.Done()) {
    return Malformed<Join>("join");
  }
  return body;
}

StatusOr<Ack> DecodeAck(std::string_view datagram) {
  Reader r(datagram);
  Ack body;
  uint8_t slow = 0;
  uint8_t short_of_quorum = 0;
  if (!r.U8(slow) || !r.F64(body.slow_zscore) || !r.U64(body.latest_round_id) ||
      !r.U64(body.lighthouse_instance) || !r.U64(body.latest_round_step) ||
      !r.U8(short_of_quorum) || !r.Done()) {
    return Malformed<Ack>("ack");
  }
  body.slow = slow != 0;
  body.short_of_quorum = short_of_quorum != 0;
  return body;
}

StatusOr<Decision> DecodeDecision(std::string_view datagram) {
  Reader r(datagram);
  Decision body;
  uint8_t truncated = 0;
  uint16_t n = 0;
  if (!r.U64(body.join_id) || !r.U8(body.code) || !r.Str(body.message) || !r.U64(body.round_id) ||
      !r.U32(body.rank) || !r.U32(body.world_size) || !r.U64(body.total_tokens) ||
      !r.U64(body.heal_round_id) || !r.U64(body.step) || !r.U32(body.waited_ms) ||
      !r.Str(body.closed_by) || !r.Str(body.rendezvous_prefix) || !r.Str(body.heal_from_id) ||
      !r.Str(body.heal_from_address) || !r.U8(truncated) || !r.U16(n) || n > kMaxHealTo) {
    return Malformed<Decision>("decision");
  }
  body.heal_to.resize(n);
  for (std::string& id : body.heal_to) {
    if (!r.Str(id)) return Malformed<Decision>("decision");
  }
  if (!r.Done()) return Malformed<Decision>("decision");
  body.heal_to_truncated = truncated != 0;
  return body;
}

}  // namespace mend::coordinator::datagram
