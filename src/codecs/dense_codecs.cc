// fp32, bf16 and the block-absmax integer codecs (int8, int4).
//
// The loops are written for the compiler's vectorizer (this target is built
// with -O3 and without errno from math functions): no branches in the inner
// loops, lrint for round-to-nearest-even, and each block's scale computed
// before its values are touched.
#include "codecs/dense_codecs.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace mend::codecs {
namespace {

float LoadFloat(const std::byte* p) {
  float value;
  std::memcpy(&value, p, sizeof value);
  return value;
}

void StoreFloat(std::byte* p, float value) { std::memcpy(p, &value, sizeof value); }

// ------------------------------------------------------------------ fp32 --

class Fp32Codec final : public Codec {
 public:
  CodecKind kind() const override { return CodecKind::kFp32; }
  bool dense() const override { return true; }
  size_t alignment() const override { return 1; }
  size_t EncodedBytes(size_t n) const override { return n * sizeof(float); }

  void Encode(std::span<const float> in, std::span<std::byte> out) const override {
    std::memcpy(out.data(), in.data(), in.size_bytes());
  }
  void Decode(std::span<const std::byte> in, std::span<float> out) const override {
    std::memcpy(out.data(), in.data(), out.size_bytes());
  }
  void DecodeAccumulate(std::span<const std::byte> in, float scale,
                        std::span<float> out) const override {
    const std::byte* src = in.data();
    float* dst = out.data();
    const size_t n = out.size();
    for (size_t i = 0; i < n; ++i) dst[i] += scale * LoadFloat(src + i * sizeof(float));
  }
};

// ------------------------------------------------------------------ bf16 --

uint16_t ToBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  // Round to nearest even; a NaN stays a (quiet) NaN instead of rounding to Inf.
  uint32_t rounded = bits + 0x7FFFu + ((bits >> 16) & 1u);
  bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<uint16_t>(nan ? ((bits >> 16) | 0x40u) : (rounded >> 16));
}

float FromBf16(uint16_t half) {
  uint32_t bits = static_cast<uint32_t>(half) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

class Bf16Codec final : public Codec {
 public:
  CodecKind kind() const override { return CodecKind::kBf16; }
  bool dense() const override { return true; }
  size_t alignment() const override { return 1; }
  size_t EncodedBytes(size_t n) const override { return n * sizeof(uint16_t); }

  void Encode(std::span<const float> in, std::span<std::byte> out) const override {
    const size_t n = in.size();
    for (size_t i = 0; i < n; ++i) {
      uint16_t half = ToBf16(in[i]);
      std::memcpy(out.data() + i * sizeof half, &half, sizeof half);
    }
  }
  void Decode(std::span<const std::byte> in, std::span<float> out) const override {
    const size_t n = out.size();
    for (size_t i = 0; i < n; ++i) {
      uint16_t half;
      std::memcpy(&half, in.data() + i * sizeof half, sizeof half);
      out[i] = FromBf16(half);
    }
  }
  void DecodeAccumulate(std::span<const std::byte> in, float scale,
                        std::span<float> out) const override {
    const size_t n = out.size();
    for (size_t i = 0; i < n; ++i) {
      uint16_t half;
      std::memcpy(&half, in.data() + i * sizeof half, sizeof half);
      out[i] += scale * FromBf16(half);
    }
  }
};

// ------------------------------------------------------- int8 and int4 --
//
// Layout of n values in blocks of B (the last block may be shorter):
//   [one fp32 scale per block][the values: int8 each, or int4 two a byte,
//    value i in the low nibble of byte i/2 when i is even]
// A value decodes as q * scale with scale = absmax / qmax, qmax = 127 or 7.

template <int kBits>
class BlockQuantCodec final : public Codec {
 public:
  static constexpr int kQMax = (1 << (kBits - 1)) - 1;

  explicit BlockQuantCodec(size_t block) : block_(block) {}

  CodecKind kind() const override { return kBits == 8 ? CodecKind::kInt8 : CodecKind::kInt4; }
  bool dense() const override { return true; }
  size_t alignment() const override { return block_; }
  size_t EncodedBytes(size_t n) const override {
    return Blocks(n) * sizeof(float) + (kBits == 8 ? n : (n + 1) / 2);
  }

  void Encode(std::span<const float> in, std::span<std::byte> out) const override {
    const size_t n = in.size();
    std::byte* scales = out.data();
    auto* values = reinterpret_cast<uint8_t*>(out.data() + Blocks(n) * sizeof(float));
    for (size_t b = 0, start = 0; start < n; ++b, start += block_) {
      const size_t len = std::min(block_, n - start);
      const float* x = in.data() + start;
      float absmax = 0;
      for (size_t i = 0; i < len; ++i) absmax = std::max(absmax, std::fabs(x[i]));
      // Non-finite values have no useful scale; they encode as zeros.
      if (!std::isfinite(absmax)) absmax = 0;
      const float scale = absmax / kQMax;
      const float inverse = absmax > 0 ? kQMax / absmax : 0.0f;
      StoreFloat(scales + b * sizeof(float), scale);
      if constexpr (kBits == 8) {
        uint8_t* q = values + start;
        for (size_t i = 0; i < len; ++i) {
          long v = std::lrint(x[i] * inverse);
          q[i] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp<long>(v, -kQMax, kQMax)));
        }
      } else {
        // block_ is even, so every block but the last starts on a byte.
        uint8_t* q = values + start / 2;
        for (size_t i = 0; i + 1 < len; i += 2) {
          long lo = std::clamp<long>(std::lrint(x[i] * inverse), -kQMax, kQMax);
          long hi = std::clamp<long>(std::lrint(x[i + 1] * inverse), -kQMax, kQMax);
          q[i / 2] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
        }
        if (len % 2 == 1) {
          long lo = std::clamp<long>(std::lrint(x[len - 1] * inverse), -kQMax, kQMax);
          q[len / 2] = static_cast<uint8_t>(lo & 0xF);
        }
      }
    }
  }

  void Decode(std::span<const std::byte> in, std::span<float> out) const override {
    std::fill(out.begin(), out.end(), 0.0f);
    DecodeAccumulate(in, 1.0f, out);
  }

  void DecodeAccumulate(std::span<const std::byte> in, float weight,
                        std::span<float> out) const override {
    const size_t n = out.size();
    const std::byte* scales = in.data();
    const auto* values = reinterpret_cast<const uint8_t*>(in.data() + Blocks(n) * sizeof(float));
    for (size_t b = 0, start = 0; start < n; ++b, start += block_) {
      const size_t len = std::min(block_, n - start);
      const float scale = weight * LoadFloat(scales + b * sizeof(float));
      float* y = out.data() + start;
      if constexpr (kBits == 8) {
        const auto* q = reinterpret_cast<const int8_t*>(values + start);
        for (size_t i = 0; i < len; ++i) y[i] += scale * static_cast<float>(q[i]);
      } else {
        const uint8_t* q = values + start / 2;
        for (size_t i = 0; i < len; ++i) {
          // Sign-extend the nibble: shift it to the top of an int8, then back.
          const uint8_t byte = q[i / 2];
          const uint8_t nibble = (i % 2 == 0) ? (byte & 0xF) : (byte >> 4);
          const auto v = static_cast<int8_t>(static_cast<uint8_t>(nibble << 4)) >> 4;
          y[i] += scale * static_cast<float>(v);
        }
      }
    }
  }

 private:
  size_t Blocks(size_t n) const { return (n + block_ - 1) / block_; }

  const size_t block_;
};

}  // namespace

std::unique_ptr<Codec> MakeFp32Codec() { return std::make_unique<Fp32Codec>(); }
std::unique_ptr<Codec> MakeBf16Codec() { return std::make_unique<Bf16Codec>(); }
std::unique_ptr<Codec> MakeInt8Codec(size_t block) {
  return std::make_unique<BlockQuantCodec<8>>(block);
}
std::unique_ptr<Codec> MakeInt4Codec(size_t block) {
  return std::make_unique<BlockQuantCodec<4>>(block);
}

}  // namespace mend::codecs
