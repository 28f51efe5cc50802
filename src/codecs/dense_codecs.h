// The concrete codecs behind MakeCodec (include/mend/codec.h).
#pragma once

#include <cstddef>
#include <memory>

#include "mend/codec.h"

namespace mend::codecs {

std::unique_ptr<Codec> MakeFp32Codec();
std::unique_ptr<Codec> MakeBf16Codec();
// `block` values per scale; even and at least 8 (MakeCodec checks).
std::unique_ptr<Codec> MakeInt8Codec(size_t block);
std::unique_ptr<Codec> MakeInt4Codec(size_t block);
// `k` <= `chunk` values kept per chunk.
std::unique_ptr<Codec> MakeTopKCodec(size_t chunk, size_t k);

}  // namespace mend::codecs
