// Codecs: how pseudo-gradients travel between learners (docs/architecture.md, "Codecs").
//
//   fp32   the values as they are (4 bytes each)
//   bf16   the top 16 bits, rounded to nearest even (2 bytes each)
//   int8   per block of `block_size` values one fp32 absmax scale, values
//          rounded to [-127, 127] (1 byte each + 4 bytes per block)
//   int4   the same with [-7, 7], two values a byte
//   topk   per chunk of `topk_chunk` values the `topk_k` largest magnitudes,
//          their indices and 2-bit values with one fp32 scale (SparseLoCo);
//          meant to be used with TopKErrorFeedback
//
// Every codec encodes n values into EncodedBytes(n) bytes, a size fixed by n
// alone, so members can exchange payloads of known size. Decoding is a pure
// function of the bytes: every member that decodes the same bytes gets the
// same floats, which is what makes compressed all-reduce bit-identical.
// Dense codecs (all but topk) can be cut at any multiple of alignment()
// values and each piece encoded on its own (the reduce-scatter does that).
//
// Thread-safety: a Codec is immutable; its methods may be called from any
// number of threads at once.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mend/config_enums.h"
#include "mend/status.h"

namespace mend {

// (CodecKind is config_enums.h's: the `codec` key's values.)
std::string_view CodecName(CodecKind kind);
// "fp32", "bf16", "int8", "int4" or "topk"; INVALID_ARGUMENT otherwise.
[[nodiscard]] StatusOr<CodecKind> ParseCodecKind(std::string_view name);

struct CodecOptions {
  CodecKind kind = CodecKind::kFp32;
  size_t block_size = 64;    // int8, int4: values per absmax scale (even, >= 8)
  size_t topk_chunk = 4096;  // topk: values per chunk
  size_t topk_k = 64;        // topk: values kept per chunk (<= topk_chunk)
};

class Codec {
 public:
  virtual ~Codec() = default;

  virtual CodecKind kind() const = 0;
  // False for sparse codecs: their payloads are all-gathered, not reduced.
  virtual bool dense() const = 0;
  // Dense codecs: piece boundaries must be multiples of this many values.
  virtual size_t alignment() const = 0;
  // The size of Encode's output for `n` values.
  virtual size_t EncodedBytes(size_t n) const = 0;
  // Encodes `in` into `out` (out.size() == EncodedBytes(in.size())).
  virtual void Encode(std::span<const float> in, std::span<std::byte> out) const = 0;
  // out[i] = decoded value i (out.size() values from EncodedBytes(out.size()) bytes).
  virtual void Decode(std::span<const std::byte> in, std::span<float> out) const = 0;
  // out[i] += scale * decoded value i, accumulated in fp32.
  virtual void DecodeAccumulate(std::span<const std::byte> in, float scale,
                                std::span<float> out) const = 0;
};

// INVALID_ARGUMENT naming the option when a size is out of range.
[[nodiscard]] StatusOr<std::unique_ptr<Codec>> MakeCodec(const CodecOptions& options);

// One step of error feedback on a caller-held residual: residual <- beta *
// residual + delta; payload <- Encode(residual); residual -= Decode(payload).
// `decoded` is scratch of residual.size() values.
void EncodeWithErrorFeedback(const Codec& codec, float beta, std::span<float> residual,
                             std::span<const float> delta, std::span<std::byte> payload,
                             std::span<float> decoded);

// SparseLoCo's error feedback around a (top-k) codec, for one learner:
//   e <- beta * e + delta;  payload = Encode(e);  e <- e - Decode(payload)
// so what a round does not send is carried into the next one.
//
// Thread-safety: none; one owner.
class ErrorFeedback {
 public:
  // `codec` is not owned and must outlive this object.
  ErrorFeedback(const Codec* codec, size_t size, float beta);

  // Folds `delta` into the buffer and encodes it into `payload`
  // (EncodedBytes(size) bytes); the sent part is removed from the buffer.
  void EncodeWithFeedback(std::span<const float> delta, std::span<std::byte> payload);

  std::span<const float> residual() const { return residual_; }
  // Clears the residual (e.g. after a learner healed from a peer).
  void Reset();

 private:
  const Codec* const codec_;
  const float beta_;
  std::vector<float> residual_;
  std::vector<float> decoded_;
};

}  // namespace mend
