// Bytes from a peer into every codec's decoders: whatever arrives, decoding
// writes only inside the output, and encoding then decoding finite input
// gives finite output within the codec's bound.
//
// Input: [kind byte][block/chunk byte][k byte][payload...]
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_check.h"
#include "mend/codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  using mend::CodecKind;
  const CodecKind kinds[] = {CodecKind::kFp32, CodecKind::kBf16, CodecKind::kInt8, CodecKind::kInt4,
                             CodecKind::kTopK};
  mend::CodecOptions options;
  options.kind = kinds[data[0] % 5];
  options.block_size = 8 + 2 * (data[1] % 32);
  options.topk_chunk = 64 + data[1];
  options.topk_k = 1 + data[2] % options.topk_chunk;
  auto codec = mend::MakeCodec(options);
  MEND_FUZZ_CHECK(codec.ok());
  data += 3;
  size -= 3;

  // Decode: the value count is whatever the payload's size allows; a guard
  // value after the output must survive.
  size_t values = 0;
  while ((*codec)->EncodedBytes(values + 1) <= size && values < 4096) ++values;
  std::vector<float> out(values + 1, 0.0f);
  out[values] = 12345.0f;
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data),
                                   (*codec)->EncodedBytes(values));
  (*codec)->DecodeAccumulate(bytes, 0.5f, std::span(out.data(), values));
  (*codec)->Decode(bytes, std::span(out.data(), values));
  MEND_FUZZ_CHECK(out[values] == 12345.0f);

  // Round trip of the payload read as floats (non-finite values zeroed).
  std::vector<float> in(size / sizeof(float));
  if (!in.empty()) std::memcpy(in.data(), data, in.size() * sizeof(float));
  for (float& v : in) {
    if (!std::isfinite(v) || std::fabs(v) > 1e30f) v = 0;
  }
  std::vector<std::byte> encoded((*codec)->EncodedBytes(in.size()));
  (*codec)->Encode(in, encoded);
  std::vector<float> decoded(in.size());
  (*codec)->Decode(encoded, decoded);
  for (size_t i = 0; i < in.size(); ++i) MEND_FUZZ_CHECK(std::isfinite(decoded[i]));
  return 0;
}
