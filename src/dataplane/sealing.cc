#include "dataplane/sealing.h"

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <functional>

#include "core/parallel.h"
#include "fmt/format.h"

namespace mend::dataplane {

size_t SealLanes(size_t bytes) {
  return std::clamp<size_t>(bytes / kSealLaneMinBytes, 1, kSealLanes);
}

namespace {

constexpr char kLabel[] = "mend data plane v1: AES-256-GCM";
// EVP takes int lengths: longer pieces go through in steps of this.
constexpr size_t kStep = size_t{1} << 30;

void AppendWord(EVP_MD_CTX* ctx, uint64_t word) {
  unsigned char bytes[8];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<unsigned char>(word >> (8 * i));
  EVP_DigestUpdate(ctx, bytes, sizeof(bytes));
}

void AppendText(EVP_MD_CTX* ctx, std::string_view text) {
  AppendWord(ctx, text.size());
  EVP_DigestUpdate(ctx, text.data(), text.size());
}

// EVP_EncryptUpdate or EVP_DecryptUpdate over `n` bytes, in steps of kStep.
using Update = int (*)(EVP_CIPHER_CTX*, unsigned char*, int*, const unsigned char*, int);
bool UpdateInSteps(Update update, EVP_CIPHER_CTX* ctx, unsigned char* out, const unsigned char* in,
                   size_t n) {
  for (size_t at = 0; at < n; at += kStep) {
    const int step = static_cast<int>(std::min(kStep, n - at));
    int written = 0;
    if (update(ctx, out + at, &written, in + at, step) != 1 || written != step) return false;
  }
  return true;
}

// Lane `lane` of a piece of `n` bytes: where its bytes start, how many,
// and where its tag is (after the piece, in lane order). Each lane but the
// last has ceil(n / lanes) bytes.
struct Lane {
  size_t at, bytes, tag;
};
Lane LaneOf(size_t n, size_t lane) {
  const size_t lanes = SealLanes(n), most = (n + lanes - 1) / lanes, at = lane * most;
  return {at, at < n ? std::min(most, n - at) : 0, n + lane * kSealTagBytes};
}

bool AllDone(const std::array<char, kSealLanes>& done, size_t lanes) {
  return std::find(done.begin(), done.begin() + lanes, 0) == done.begin() + lanes;
}

}  // namespace

Status CheckPlace(const PiecePlace& place) {
  if (place.op >= (uint64_t{1} << 36) || place.phase >= 16 || place.segment >= (1u << 20) ||
      place.sender >= (1u << 16) || place.receiver >= (1u << 16)) {
    return InternalError(fmt::format(
        "data plane: a piece's place (operation {}, phase {}, segment {}, sender {}, receiver {}) "
        "does not fit its nonce (a bug in mend: please report it)",
        place.op, place.phase, place.segment, place.sender, place.receiver));
  }
  return OkStatus();
}

std::array<unsigned char, kSealNonceBytes> NonceOf(const PiecePlace& place, size_t lane) {
  const uint64_t slot =
      (place.op << 28) | (uint64_t{lane} << 24) | (uint64_t{place.phase} << 20) | place.segment;
  std::array<unsigned char, kSealNonceBytes> nonce{};
  for (int i = 0; i < 8; ++i) nonce[i] = static_cast<unsigned char>(slot >> (8 * i));
  nonce[8] = static_cast<unsigned char>(place.sender);
  nonce[9] = static_cast<unsigned char>(place.sender >> 8);
  nonce[10] = static_cast<unsigned char>(place.receiver);
  nonce[11] = static_cast<unsigned char>(place.receiver >> 8);
  return nonce;
}

TranscriptDigest Transcript(std::string_view prefix, uint64_t round_id, int world_size,
                            const std::vector<std::string>& member_ids,
                            std::span<const std::byte> randoms) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
  AppendText(ctx.get(), kLabel);
  AppendText(ctx.get(), prefix);
  AppendWord(ctx.get(), round_id);
  AppendWord(ctx.get(), static_cast<uint64_t>(world_size));
  AppendWord(ctx.get(), member_ids.size());
  for (const std::string& id : member_ids) AppendText(ctx.get(), id);
  AppendWord(ctx.get(), randoms.size());
  EVP_DigestUpdate(ctx.get(), randoms.data(), randoms.size());
  TranscriptDigest digest{};
  unsigned int length = 0;
  EVP_DigestFinal_ex(ctx.get(), reinterpret_cast<unsigned char*>(digest.data()), &length);
  return digest;
}

StatusOr<SealKey> DeriveKey(std::string_view secret, const TranscriptDigest& salt) {
  std::unique_ptr<EVP_KDF, decltype(&EVP_KDF_free)> kdf(EVP_KDF_fetch(nullptr, "HKDF", nullptr),
                                                        EVP_KDF_free);
  if (!kdf) return InternalError("data plane: OpenSSL has no HKDF");
  std::unique_ptr<EVP_KDF_CTX, decltype(&EVP_KDF_CTX_free)> ctx(EVP_KDF_CTX_new(kdf.get()),
                                                                EVP_KDF_CTX_free);
  char digest_name[] = "SHA256";
  std::string key(secret);
  std::string label(kLabel);
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest_name, 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, key.data(), key.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, const_cast<std::byte*>(salt.data()),
                                        salt.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, label.data(), label.size()),
      OSSL_PARAM_construct_end()};
  SealKey out{};
  if (!ctx || EVP_KDF_derive(ctx.get(), out.data(), out.size(), params) != 1) {
    return InternalError("data plane: OpenSSL's HKDF failed");
  }
  return out;
}

Status RandomBytes(std::span<std::byte> out) {
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(out.size())) != 1)
    return InternalError("data plane: OpenSSL's random generator failed");
  return OkStatus();
}

// Each lane's contexts (the key set once: each piece sets only its nonce),
// so that lanes run side by side; and the threads that run them.
struct Sealer::Contexts {
  std::array<EVP_CIPHER_CTX*, kSealLanes> seal{};
  std::array<EVP_CIPHER_CTX*, kSealLanes> open{};
  std::unique_ptr<ThreadPool> pool;  // null: the caller alone
  ~Contexts() {
    for (EVP_CIPHER_CTX* ctx : seal) EVP_CIPHER_CTX_free(ctx);
    for (EVP_CIPHER_CTX* ctx : open) EVP_CIPHER_CTX_free(ctx);
  }
  // body(lane) for every lane, on the pool when there is one.
  void ForLanes(size_t lanes, const std::function<void(size_t)>& body) {
    if (pool && lanes > 1) {
      pool->ParallelFor(lanes, body);
    } else {
      for (size_t lane = 0; lane < lanes; ++lane) body(lane);
    }
  }
};

Sealer::Sealer(std::unique_ptr<Contexts> contexts) : contexts_(std::move(contexts)) {}
Sealer::~Sealer() = default;

StatusOr<std::unique_ptr<Sealer>> Sealer::Make(const SealKey& key, int threads) {
  auto contexts = std::make_unique<Contexts>();
  for (size_t lane = 0; lane < kSealLanes; ++lane) {
    EVP_CIPHER_CTX*& seal = contexts->seal[lane];
    EVP_CIPHER_CTX*& open = contexts->open[lane];
    seal = EVP_CIPHER_CTX_new();
    open = EVP_CIPHER_CTX_new();
    if (seal == nullptr || open == nullptr ||
        EVP_EncryptInit_ex(seal, EVP_aes_256_gcm(), nullptr, key.data(), nullptr) != 1 ||
        EVP_DecryptInit_ex(open, EVP_aes_256_gcm(), nullptr, key.data(), nullptr) != 1) {
      return InternalError("data plane: OpenSSL cannot set up AES-256-GCM");
    }
  }
  if (threads > 1) contexts->pool = std::make_unique<ThreadPool>(threads);
  return std::unique_ptr<Sealer>(new Sealer(std::move(contexts)));
}

Status Sealer::Seal(const PiecePlace& place, std::span<const std::byte> plain,
                    std::span<std::byte> wire) {
  MEND_RETURN_IF_ERROR(CheckPlace(place));
  const size_t n = plain.size(), lanes = SealLanes(n);
  if (wire.size() != SealedBytes(n)) {
    return InternalError("data plane: a sealed piece's buffer has the wrong size");
  }
  auto* out = reinterpret_cast<unsigned char*>(wire.data());
  const auto* in = reinterpret_cast<const unsigned char*>(plain.data());
  std::array<char, kSealLanes> sealed{};
  contexts_->ForLanes(lanes, [&](size_t lane) {
    EVP_CIPHER_CTX* ctx = contexts_->seal[lane];
    const Lane l = LaneOf(n, lane);
    const auto nonce = NonceOf(place, lane);
    int tail = 0;
    sealed[lane] = EVP_EncryptInit_ex(ctx, nullptr, nullptr, nullptr, nonce.data()) == 1 &&
                   UpdateInSteps(EVP_EncryptUpdate, ctx, out + l.at, in + l.at, l.bytes) &&
                   EVP_EncryptFinal_ex(ctx, out + l.tag, &tail) == 1 &&
                   EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, kSealTagBytes, out + l.tag) == 1;
  });
  if (!AllDone(sealed, lanes)) return InternalError("data plane: OpenSSL could not seal a piece");
  return OkStatus();
}

bool Sealer::Open(const PiecePlace& place, std::span<std::byte> wire, std::span<std::byte> plain) {
  const size_t n = plain.size(), lanes = SealLanes(n);
  if (!CheckPlace(place).ok() || wire.size() != SealedBytes(n)) return false;
  auto* bytes = reinterpret_cast<unsigned char*>(wire.data());
  std::array<char, kSealLanes> opened{};
  contexts_->ForLanes(lanes, [&](size_t lane) {
    EVP_CIPHER_CTX* ctx = contexts_->open[lane];
    const Lane l = LaneOf(n, lane);
    const auto nonce = NonceOf(place, lane);
    int tail = 0;
    opened[lane] =
        EVP_DecryptInit_ex(ctx, nullptr, nullptr, nullptr, nonce.data()) == 1 &&
        UpdateInSteps(EVP_DecryptUpdate, ctx, bytes + l.at, bytes + l.at, l.bytes) &&
        EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, kSealTagBytes, bytes + l.tag) == 1 &&
        EVP_DecryptFinal_ex(ctx, bytes + l.tag, &tail) == 1;
  });
  if (!AllDone(opened, lanes)) return false;
  // Every lane verified: the plaintext, lane by lane (side by side too).
  contexts_->ForLanes(lanes, [&](size_t lane) {
    const Lane l = LaneOf(n, lane);
    if (l.bytes > 0) std::memcpy(plain.data() + l.at, wire.data() + l.at, l.bytes);
  });
  return true;
}

}  // namespace mend::dataplane
