#include "core/hmac.h"

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

namespace mend {

Sha256Bytes DeriveHmacKey(std::string_view secret, std::string_view label) {
  Sha256Bytes key{};
  unsigned int length = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(label.data()), label.size(), key.data(), &length);
  return key;
}

HmacSha256::HmacSha256(const Sha256Bytes& key) {
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  context_ = EVP_MAC_CTX_new(mac);
  EVP_MAC_free(mac);
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                         OSSL_PARAM_construct_end()};
  EVP_MAC_init(context_, key.data(), key.size(), params);
}

HmacSha256::~HmacSha256() { EVP_MAC_CTX_free(context_); }

void HmacSha256::Update(const void* data, size_t size) {
  EVP_MAC_update(context_, static_cast<const unsigned char*>(data), size);
}

Sha256Bytes HmacSha256::Final() {
  Sha256Bytes mac{};
  size_t length = 0;
  EVP_MAC_final(context_, mac.data(), &length, mac.size());
  EVP_MAC_init(context_, nullptr, 0, nullptr);  // (no key: the same key, a new message)
  return mac;
}

}  // namespace mend
