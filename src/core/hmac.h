// HMAC-SHA256 through OpenSSL's EVP_MAC, for what mend authenticates under
// a key from the job token: the control plane's datagrams
// (wire/datagram.h) and checkpoints at rest (checkpoint.cc).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

typedef struct evp_mac_ctx_st EVP_MAC_CTX;

namespace mend {

using Sha256Bytes = std::array<uint8_t, 32>;

// HMAC-SHA256(secret, label): the key of one purpose (`label`) of a secret.
Sha256Bytes DeriveHmacKey(std::string_view secret, std::string_view label);

// An HMAC-SHA256 under one key, fed in parts. Final() ends a message and
// starts the next under the same key (OpenSSL keeps the key schedule).
class HmacSha256 {
 public:
  explicit HmacSha256(const Sha256Bytes& key);
  ~HmacSha256();
  HmacSha256(const HmacSha256&) = delete;
  HmacSha256& operator=(const HmacSha256&) = delete;

  void Update(const void* data, size_t size);
  Sha256Bytes Final();

 private:
  EVP_MAC_CTX* context_;
};

}  // namespace mend
