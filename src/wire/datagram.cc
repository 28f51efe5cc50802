#include "wire/datagram.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <cstring>

#include "core/status_format.h"
#include "fmt/format.h"

namespace mend::coordinator::datagram {
namespace {

constexpr std::string_view kKeyLabel = "mend datagram channel v1";
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
