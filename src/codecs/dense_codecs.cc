// fp32, bf16 and the block-absmax integer codecs (int8, int4).
//
// The loops are written for the compiler's vectorizer (this target is built
// with -O3): no branches or library calls in the inner loops, rounding by
// the add-and-subtract trick, and each block's scale computed before its
// values are touched.
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
    if (!in.empty()) std::memcpy(out.data(), in.data(), in.size_bytes());
  }
  void Decode(std::span<const std::byte> in, std::span<float> out) const override {
    if (!out.empty()) std::memcpy(out.data(), in.data(), out.size_bytes());
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

// The largest |x| of a block, found on the bit patterns (for non-negative
// floats they order like the values, and an integer max vectorizes where a
// float max with NaN semantics does not); 0 when the block holds a NaN or Inf.
float BlockAbsmax(const float* x, size_t len) {
  uint32_t most = 0;
  for (size_t i = 0; i < len; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof bits);
    most = std::max(most, bits & 0x7FFFFFFFu);
  }
  if (most >= 0x7F800000u) return 0;  // non-finite: the block encodes as zeros
  float absmax;
  std::memcpy(&absmax, &most, sizeof absmax);
  return absmax;
}

// Round to nearest even for |v| <= 2^22 by adding and removing 1.5 * 2^23
// (exact in fp32 without -ffast-math, and it vectorizes).
inline float RoundEven(float v) {
  constexpr float kMagic = 12582912.0f;
  return (v + kMagic) - kMagic;
}

// x * inverse rounded, then clamped to [-qmax, qmax] in integers (|x| <=
// absmax keeps it within rounding of qmax already; the clamp is a guard).
// `inverse` is finite, so the conversion is always defined.
inline int32_t Quantize(float x, float inverse, int32_t qmax) {
  const auto r = static_cast<int32_t>(RoundEven(x * inverse));
  return std::min(std::max(r, -qmax), qmax);
}

// Sign-extends the low nibble of `byte`.
inline int32_t LowNibble(uint8_t byte) { return static_cast<int8_t>(byte << 4) >> 4; }
inline int32_t HighNibble(uint8_t byte) { return static_cast<int8_t>(byte) >> 4; }

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
    constexpr int32_t qmax = kQMax;
    for (size_t b = 0, start = 0; start < n; ++b, start += block_) {
      const size_t len = std::min(block_, n - start);
      const float* x = in.data() + start;
      const float absmax = BlockAbsmax(x, len);
      StoreFloat(scales + b * sizeof(float), absmax / kQMax);
      if (absmax == 0) {  // zeros, or a non-finite block: all codes 0
        std::memset(values + (kBits == 8 ? start : start / 2), 0, kBits == 8 ? len : (len + 1) / 2);
        continue;
      }
      const float inverse = kQMax / absmax;
      if (!std::isfinite(inverse)) {  // a subnormal absmax: divide instead
        EncodeTinyBlock(x, len, absmax, values, start);
        continue;
      }
      if constexpr (kBits == 8) {
        auto* q = reinterpret_cast<int8_t*>(values + start);
        for (size_t i = 0; i < len; ++i) q[i] = static_cast<int8_t>(Quantize(x[i], inverse, qmax));
      } else {
        // block_ is even, so every block but the last starts on a byte.
        uint8_t* q = values + start / 2;
        const size_t pairs = len / 2;
        for (size_t j = 0; j < pairs; ++j) {
          const int32_t lo = Quantize(x[2 * j], inverse, qmax);
          const int32_t hi = Quantize(x[2 * j + 1], inverse, qmax);
          q[j] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
        }
        if (len % 2 == 1)
          q[pairs] = static_cast<uint8_t>(Quantize(x[len - 1], inverse, qmax) & 0xF);
      }
    }
  }

  void Decode(std::span<const std::byte> in, std::span<float> out) const override {
    Apply(in, 1.0f, out, /*accumulate=*/false);
  }

  // A block whose absmax is so small that qmax / absmax overflows: the same
  // codes, computed as x / absmax * qmax (finite, since |x| <= absmax).
  static void EncodeTinyBlock(const float* x, size_t len, float absmax, uint8_t* values,
                              size_t start) {
    for (size_t i = 0; i < len; ++i) {
      const auto code = static_cast<int32_t>(RoundEven(x[i] / absmax * kQMax));
      const int32_t q = std::min(std::max(code, -kQMax), kQMax);
      if constexpr (kBits == 8) {
        values[start + i] = static_cast<uint8_t>(static_cast<int8_t>(q));
      } else {
        uint8_t& byte = values[(start + i) / 2];
        if (i % 2 == 0) {
          byte = static_cast<uint8_t>(q & 0xF);
        } else {
          byte = static_cast<uint8_t>(byte | ((q & 0xF) << 4));
        }
      }
    }
  }

  void DecodeAccumulate(std::span<const std::byte> in, float weight,
                        std::span<float> out) const override {
    Apply(in, weight, out, /*accumulate=*/true);
  }

 private:
  size_t Blocks(size_t n) const { return (n + block_ - 1) / block_; }

  // out = (accumulate ? out : 0) + weight * decoded.
  void Apply(std::span<const std::byte> in, float weight, std::span<float> out,
             bool accumulate) const {
    const size_t n = out.size();
    const std::byte* scales = in.data();
    const auto* values = reinterpret_cast<const uint8_t*>(in.data() + Blocks(n) * sizeof(float));
    if (accumulate) {
      Apply<true>(values, scales, weight, out);
    } else {
      Apply<false>(values, scales, weight, out);
    }
  }

  template <bool kAccumulate>
  void Apply(const uint8_t* values, const std::byte* scales, float weight,
             std::span<float> out) const {
    const size_t n = out.size();
    // Written so that the overwrite never reads `out` (it may hold garbage).
    auto put = [](float& y, float v) {
      if constexpr (kAccumulate) {
        y += v;
      } else {
        y = v;
      }
    };
    for (size_t b = 0, start = 0; start < n; ++b, start += block_) {
      const size_t len = std::min(block_, n - start);
      const float scale = weight * LoadFloat(scales + b * sizeof(float));
      float* y = out.data() + start;
      if constexpr (kBits == 8) {
        const auto* q = reinterpret_cast<const int8_t*>(values + start);
        for (size_t i = 0; i < len; ++i) put(y[i], scale * static_cast<float>(q[i]));
      } else {
        const uint8_t* q = values + start / 2;
        const size_t pairs = len / 2;
        for (size_t j = 0; j < pairs; ++j) {
          put(y[2 * j], scale * static_cast<float>(LowNibble(q[j])));
          put(y[2 * j + 1], scale * static_cast<float>(HighNibble(q[j])));
        }
        if (len % 2 == 1) {
          put(y[len - 1], scale * static_cast<float>(LowNibble(q[pairs])));
        }
      }
    }
  }

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
