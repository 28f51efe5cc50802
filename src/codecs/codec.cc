#include "mend/codec.h"

#include <algorithm>
#include <array>
#include <utility>

#include "codecs/dense_codecs.h"
#include "core/status_format.h"
#include "fmt/format.h"

namespace mend {
namespace {

constexpr size_t kMinBlock = 8;
constexpr size_t kMaxBlock = 65536;
constexpr size_t kMinChunk = 64;
constexpr size_t kMaxChunk = 1 << 20;

}  // namespace

// The key table's choices of `codec` are the codecs' names.
std::string_view CodecName(CodecKind kind) { return EnumText("codec", kind); }

StatusOr<CodecKind> ParseCodecKind(std::string_view name) {
  MEND_ASSIGN_OR_RETURN(int kind, ParseEnumText("codec", name));
  return static_cast<CodecKind>(kind);
}

StatusOr<std::unique_ptr<Codec>> MakeCodec(const CodecOptions& options) {
  switch (options.kind) {
    case CodecKind::kFp32:
      return codecs::MakeFp32Codec();
    case CodecKind::kBf16:
      return codecs::MakeBf16Codec();
    case CodecKind::kInt8:
    case CodecKind::kInt4:
      if (options.block_size < kMinBlock || options.block_size > kMaxBlock ||
          options.block_size % 2 != 0) {
        return InvalidArgumentError(
            fmt::format("codec_block_size = {}: must be an even number in [{}, {}]",
                        options.block_size, kMinBlock, kMaxBlock));
      }
      if (options.kind == CodecKind::kInt8) return codecs::MakeInt8Codec(options.block_size);
      return codecs::MakeInt4Codec(options.block_size);
    case CodecKind::kTopK:
      if (options.topk_chunk < kMinChunk || options.topk_chunk > kMaxChunk) {
        return InvalidArgumentError(fmt::format("topk_chunk_size = {}: must be in [{}, {}]",
                                                options.topk_chunk, kMinChunk, kMaxChunk));
      }
      if (options.topk_k < 1 || options.topk_k > options.topk_chunk) {
        return InvalidArgumentError(fmt::format("topk_k = {}: must be in [1, topk_chunk_size = {}]",
                                                options.topk_k, options.topk_chunk));
      }
      return codecs::MakeTopKCodec(options.topk_chunk, options.topk_k);
  }
  return InvalidArgumentError("unknown codec kind");
}

ErrorFeedback::ErrorFeedback(const Codec* codec, size_t size, float beta)
    : codec_(codec), beta_(beta), residual_(size, 0.0f), decoded_(size, 0.0f) {}

void EncodeWithErrorFeedback(const Codec& codec, float beta, std::span<float> residual,
                             std::span<const float> delta, std::span<std::byte> payload,
                             std::span<float> decoded) {
  const size_t n = residual.size();
  for (size_t i = 0; i < n; ++i) residual[i] = beta * residual[i] + delta[i];
  codec.Encode(residual, payload);
  codec.Decode(payload, decoded);
  for (size_t i = 0; i < n; ++i) residual[i] -= decoded[i];
}

void ErrorFeedback::EncodeWithFeedback(std::span<const float> delta, std::span<std::byte> payload) {
  EncodeWithErrorFeedback(*codec_, beta_, residual_, delta, payload, decoded_);
}

void ErrorFeedback::Reset() { std::fill(residual_.begin(), residual_.end(), 0.0f); }

}  // namespace mend
