#include "wire/datagram.h"

#include <openssl/crypto.h>

#include <algorithm>
#include <cstring>

#include "core/status_format.h"
#include "fmt/format.h"

namespace mend::coordinator::datagram {
namespace {

constexpr std::string_view kKeyLabel = "mend datagram channel v1";
}  // namespace

Key DeriveKey(std::string_view token) { return DeriveHmacKey(token, kKeyLabel); }

Sha256Bytes Signer::Compute(std::string_view data) {
  hmac_.Update(data.data(), data.size());
  return hmac_.Final();
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

std::string EncodeHeader(const Header& header, size_t body_bytes) {
  std::string out;
  out.reserve(kHeaderBytes + std::min(body_bytes, kMaxBodyBytes) + kMacBytes);
  auto raw = [&out](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); };
  const uint32_t magic = kMagic;
  const uint8_t kind_and_version[2] = {static_cast<uint8_t>(header.kind), kVersion};
  const uint16_t reserved = 0;
  raw(&magic, 4);
  raw(kind_and_version, 2);
  raw(&reserved, 2);
  raw(&header.session_id, 8);
  raw(&header.seq, 8);
  return out;
}

void Seal(std::string& datagram, Signer& signer) {
  if (datagram.size() > kHeaderBytes + kMaxBodyBytes) datagram.resize(kHeaderBytes + kMaxBodyBytes);
  signer.Seal(datagram);
}

std::string Encode(const Header& header, std::string_view body, Signer& signer) {
  std::string out = EncodeHeader(header, body.size());
  out.append(body.substr(0, kMaxBodyBytes));
  signer.Seal(out);
  return out;
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
  if (kind < 1 || kind > static_cast<uint8_t>(Kind::kSuperseded)) {
    return InvalidArgumentError(fmt::format("datagram kind {}", kind));
  }
  Header header;
  header.kind = static_cast<Kind>(kind);
  std::memcpy(&header.session_id, datagram.data() + 8, 8);
  std::memcpy(&header.seq, datagram.data() + 16, 8);
  return header;
}

std::string_view Body(std::string_view datagram) {
  if (datagram.size() < kHeaderBytes + kMacBytes) return {};
  return datagram.substr(kHeaderBytes, datagram.size() - kHeaderBytes - kMacBytes);
}

}  // namespace mend::coordinator::datagram
