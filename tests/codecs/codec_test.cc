// Each codec's round trip against fp32: sizes, error bounds on random data,
// edge values, and SparseLoCo's error feedback.
#include "mend/codec.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace mend {
namespace {

std::vector<float> RandomNormal(size_t n, uint64_t seed, float sigma = 1.0f) {
  std::mt19937_64 random(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> values(n);
  for (float& v : values) v = normal(random);
  return values;
}

std::unique_ptr<Codec> Make(CodecKind kind, size_t block = 64, size_t chunk = 4096, size_t k = 64) {
  auto codec = MakeCodec({kind, block, chunk, k});
  EXPECT_TRUE(codec.ok()) << codec.status();
  return std::move(*codec);
}

std::vector<float> RoundTrip(const Codec& codec, const std::vector<float>& in) {
  std::vector<std::byte> bytes(codec.EncodedBytes(in.size()));
  codec.Encode(in, bytes);
  std::vector<float> out(in.size(), -1.0f);
  codec.Decode(bytes, out);
  return out;
}

double RelativeError(const std::vector<float>& want, const std::vector<float>& got) {
  double error = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    error += (double(want[i]) - got[i]) * (double(want[i]) - got[i]);
    norm += double(want[i]) * want[i];
  }
  return std::sqrt(error / norm);
}

TEST(CodecTest, EncodedSizesAreFixedByTheValueCount) {
  EXPECT_EQ(Make(CodecKind::kFp32)->EncodedBytes(1000), 4000u);
  EXPECT_EQ(Make(CodecKind::kBf16)->EncodedBytes(1000), 2000u);
  // 16 blocks of 64 (the last holds 40): 16 scales + one byte a value.
  EXPECT_EQ(Make(CodecKind::kInt8)->EncodedBytes(1000), 16u * 4 + 1000);
  EXPECT_EQ(Make(CodecKind::kInt4)->EncodedBytes(1000), 16u * 4 + 500);
  EXPECT_EQ(Make(CodecKind::kInt4)->EncodedBytes(999), 16u * 4 + 500);
  // Two full chunks: scale + 64 uint16 indices + 16 bytes of 2-bit codes.
  EXPECT_EQ(Make(CodecKind::kTopK)->EncodedBytes(8192), 2u * (4 + 128 + 16));
}

TEST(CodecTest, Fp32RoundTripIsExact) {
  auto in = RandomNormal(1001, 1);
  EXPECT_EQ(RoundTrip(*Make(CodecKind::kFp32), in), in);
}

TEST(CodecTest, Bf16KeepsEightSignificantBits) {
  auto in = RandomNormal(4096, 2, 3.0f);
  auto out = RoundTrip(*Make(CodecKind::kBf16), in);
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_LE(std::fabs(out[i] - in[i]), std::ldexp(std::fabs(in[i]), -8)) << i;
  }
  EXPECT_LT(RelativeError(in, out), 2e-3);
}

TEST(CodecTest, Bf16RoundsToNearestEvenAndKeepsSpecials) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> in = {1.0f + 1.0f / 256, 1.0f + 3.0f / 256, inf, -inf, -0.0f};
  auto out = RoundTrip(*Make(CodecKind::kBf16), in);
  EXPECT_EQ(out[0], 1.0f);               // tie rounds to the even neighbour (down)
  EXPECT_EQ(out[1], 1.0f + 4.0f / 256);  // tie rounds to the even neighbour (up)
  EXPECT_EQ(out[2], inf);
  EXPECT_EQ(out[3], -inf);
  EXPECT_TRUE(std::signbit(out[4]));
  auto nan = RoundTrip(*Make(CodecKind::kBf16), {std::numeric_limits<float>::quiet_NaN()});
  EXPECT_TRUE(std::isnan(nan[0]));
}

// Block quantizers: every value is within half a step (absmax / qmax / 2) of
// its block's absmax, for every block size.
void ExpectBlockBound(CodecKind kind, int qmax, double relative_bound) {
  for (size_t block : {8u, 64u, 250u}) {
    auto codec = Make(kind, block);
    auto in = RandomNormal(10'007, block);
    auto out = RoundTrip(*codec, in);
    for (size_t start = 0; start < in.size(); start += block) {
      size_t end = std::min(in.size(), start + block);
      float absmax = 0;
      for (size_t i = start; i < end; ++i) absmax = std::max(absmax, std::fabs(in[i]));
      for (size_t i = start; i < end; ++i) {
        ASSERT_LE(std::fabs(out[i] - in[i]), absmax / qmax / 2 * (1 + 1e-5f))
            << "block " << block << " value " << i;
      }
    }
    EXPECT_LT(RelativeError(in, out), relative_bound) << "block " << block;
  }
}

TEST(CodecTest, Int8ErrorIsHalfAStepOfTheBlockAbsmax) {
  ExpectBlockBound(CodecKind::kInt8, 127, 0.01);
}

TEST(CodecTest, Int4ErrorIsHalfAStepOfTheBlockAbsmax) {
  ExpectBlockBound(CodecKind::kInt4, 7, 0.15);
}

TEST(CodecTest, BlockQuantizersKeepZerosAndTheAbsmaxExactly) {
  for (CodecKind kind : {CodecKind::kInt8, CodecKind::kInt4}) {
    std::vector<float> in(64, 0.0f);
    in[3] = -2.5f;
    in[10] = 1.0f;
    auto out = RoundTrip(*Make(kind), in);
    EXPECT_EQ(out[3], -2.5f);
    EXPECT_EQ(out[0], 0.0f);
    std::vector<float> zeros(100, 0.0f);
    EXPECT_EQ(RoundTrip(*Make(kind), zeros), zeros);
  }
}

TEST(CodecTest, SubnormalBlocksStayWithinTheBound) {
  // Found by the codec fuzzer: qmax / absmax overflows for a subnormal absmax.
  for (CodecKind kind : {CodecKind::kInt8, CodecKind::kInt4, CodecKind::kTopK}) {
    std::vector<float> in(64, 0.0f);
    in[0] = 1e-45f;  // the smallest subnormal
    in[1] = -1e-45f;
    in[2] = 3e-39f;
    auto out = RoundTrip(*Make(kind, 64, 64, 4), in);
    for (size_t i = 0; i < in.size(); ++i) {
      ASSERT_TRUE(std::isfinite(out[i])) << CodecName(kind) << " " << i;
      ASSERT_LE(std::fabs(out[i] - in[i]), 3e-39f) << CodecName(kind) << " " << i;
    }
  }
}

TEST(CodecTest, NonFiniteBlockDecodesAsZerosNotNaN) {
  std::vector<float> in(64, 1.0f);
  in[5] = std::numeric_limits<float>::quiet_NaN();
  for (CodecKind kind : {CodecKind::kInt8, CodecKind::kInt4}) {
    for (float v : RoundTrip(*Make(kind), in)) EXPECT_TRUE(std::isfinite(v));
  }
}

TEST(CodecTest, TopKKeepsTheLargestMagnitudesOfEachChunk) {
  auto codec = Make(CodecKind::kTopK, 64, 256, 4);
  std::vector<float> in(512, 0.01f);
  // Chunk 0: the four largest are at 7, 100, 200, 255; chunk 1 at 300 only
  // stands out, the rest of its kept entries are ties among the small ones.
  in[7] = 3.0f;
  in[100] = -3.0f;
  in[200] = 1.0f;
  in[255] = -1.0f;
  in[300] = 2.0f;
  auto out = RoundTrip(*codec, in);
  EXPECT_FLOAT_EQ(out[7], 3.0f);
  EXPECT_FLOAT_EQ(out[100], -3.0f);
  EXPECT_FLOAT_EQ(out[200], 1.0f);  // 2-bit levels: +-absmax, +-absmax/3
  EXPECT_FLOAT_EQ(out[255], -1.0f);
  EXPECT_FLOAT_EQ(out[300], 2.0f);
  int nonzero = 0;
  for (float v : out) nonzero += v != 0.0f;
  EXPECT_LE(nonzero, 8);
}

TEST(CodecTest, TopKIgnoresIndicesOutsideTheChunk) {
  auto codec = Make(CodecKind::kTopK, 64, 64, 1);
  std::vector<std::byte> bytes(codec->EncodedBytes(64));
  float scale = 1.0f;
  std::memcpy(bytes.data(), &scale, 4);
  uint16_t index = 64;  // one past the chunk
  std::memcpy(bytes.data() + 4, &index, 2);
  std::vector<float> out(64, 0.0f);
  codec->DecodeAccumulate(bytes, 1.0f, out);
  for (float v : out) EXPECT_EQ(v, 0.0f);
}

TEST(CodecTest, DecodeAccumulateAddsScaledValues) {
  for (CodecKind kind :
       {CodecKind::kFp32, CodecKind::kBf16, CodecKind::kInt8, CodecKind::kInt4, CodecKind::kTopK}) {
    auto codec = Make(kind);
    auto in = RandomNormal(5000, 9);
    std::vector<std::byte> bytes(codec->EncodedBytes(in.size()));
    codec->Encode(in, bytes);
    std::vector<float> decoded(in.size());
    codec->Decode(bytes, decoded);
    std::vector<float> acc(in.size(), 1.0f);
    codec->DecodeAccumulate(bytes, 0.5f, acc);
    for (size_t i = 0; i < in.size(); ++i) {
      ASSERT_FLOAT_EQ(acc[i], 1.0f + 0.5f * decoded[i]) << CodecName(kind) << " " << i;
    }
  }
}

TEST(CodecTest, DensePiecesEncodeLikeTheWhole) {
  // The reduce-scatter encodes aligned pieces separately; the decoded values
  // must not depend on where the pieces were cut.
  for (CodecKind kind : {CodecKind::kBf16, CodecKind::kInt8, CodecKind::kInt4}) {
    auto codec = Make(kind, 32);
    auto in = RandomNormal(32 * 10 + 7, 4);
    auto whole = RoundTrip(*codec, in);
    size_t cut = codec->alignment() * 3;
    std::vector<float> head(in.begin(), in.begin() + static_cast<long>(cut));
    std::vector<float> tail(in.begin() + static_cast<long>(cut), in.end());
    auto a = RoundTrip(*codec, head);
    auto b = RoundTrip(*codec, tail);
    a.insert(a.end(), b.begin(), b.end());
    EXPECT_EQ(a, whole) << CodecName(kind);
  }
}

TEST(CodecTest, ErrorFeedbackCarriesWhatWasNotSent) {
  auto codec = Make(CodecKind::kTopK, 64, 1024, 16);  // about 1.6% density
  const size_t n = 8192;
  ErrorFeedback feedback(codec.get(), n, /*beta=*/1.0f);
  std::vector<double> sent_total(n, 0.0), delta_total(n, 0.0);
  std::vector<std::byte> payload(codec->EncodedBytes(n));
  std::vector<float> decoded(n);
  for (int round = 0; round < 50; ++round) {
    auto delta = RandomNormal(n, 100 + round);
    feedback.EncodeWithFeedback(delta, payload);
    codec->Decode(payload, decoded);
    for (size_t i = 0; i < n; ++i) {
      sent_total[i] += decoded[i];
      delta_total[i] += delta[i];
    }
  }
  // With beta = 1 nothing is lost: sent + residual = every delta, summed.
  auto residual = feedback.residual();
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::fabs(sent_total[i] + residual[i] - delta_total[i]));
  }
  EXPECT_LT(worst, 1e-3);
  // And the residual stays bounded instead of growing with the rounds.
  double norm = 0;
  for (float r : residual) norm += double(r) * r;
  EXPECT_LT(std::sqrt(norm / n), 20.0);
  feedback.Reset();
  for (float r : feedback.residual()) EXPECT_EQ(r, 0.0f);
}

TEST(CodecTest, OptionsOutOfRangeNameTheKey) {
  auto odd = MakeCodec({CodecKind::kInt4, 63});
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(std::string(StatusMessage(odd.status())).find("codec_block_size = 63"),
            std::string::npos);
  auto k = MakeCodec({CodecKind::kTopK, 64, 128, 129});
  ASSERT_FALSE(k.ok());
  EXPECT_NE(std::string(StatusMessage(k.status())).find("topk_k = 129"), std::string::npos);
  EXPECT_FALSE(ParseCodecKind("fp8").ok());
  EXPECT_EQ(*ParseCodecKind("int4"), CodecKind::kInt4);
}

}  // namespace
}  // namespace mend
