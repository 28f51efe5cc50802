// SparseLoCo's top-k per chunk with 2-bit values.
//
// Layout of n values in chunks of C (the last may be shorter), k' = min(k,
// chunk length) entries per chunk:
//   per chunk: [fp32 scale][k' indices: uint16 when C <= 65536, else uint32,
//               ascending][k' 2-bit codes, four a byte]
// A code c in {0, 1, 2, 3} decodes as (c - 1.5) * scale, scale = absmax/1.5
// of the kept values: a symmetric uniform 2-bit quantizer. The values it
// rounds away stay in the sender's error-feedback buffer.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "codecs/dense_codecs.h"

namespace mend::codecs {
namespace {

constexpr float kHalfLevels = 1.5f;

class TopKCodec final : public Codec {
 public:
  TopKCodec(size_t chunk, size_t k) : chunk_(chunk), k_(k), index_bytes_(chunk <= 65536 ? 2 : 4) {}

  CodecKind kind() const override { return CodecKind::kTopK; }
  bool dense() const override { return false; }
  size_t alignment() const override { return chunk_; }
  size_t EncodedBytes(size_t n) const override {
    size_t full = n / chunk_;
    size_t bytes = full * ChunkBytes(chunk_);
    if (n % chunk_ != 0) bytes += ChunkBytes(n % chunk_);
    return bytes;
  }

  void Encode(std::span<const float> in, std::span<std::byte> out) const override {
    std::vector<float> magnitudes;
    std::vector<std::pair<float, uint32_t>> heap;
    std::vector<uint32_t> kept_indices;
    std::byte* p = out.data();
    for (size_t start = 0; start < in.size(); start += chunk_) {
      const size_t len = std::min(chunk_, in.size() - start);
      const size_t kept = std::min(k_, len);
      const float* x = in.data() + start;
      SelectLargest(x, len, kept, magnitudes, heap, kept_indices);
      float absmax = 0;
      for (uint32_t index : kept_indices) absmax = std::max(absmax, magnitudes[index]);
      const float scale = absmax / kHalfLevels;
      // A subnormal absmax would make the inverse overflow: use 0 (all
      // values then take the codes nearest zero; they are below 1e-38).
      float inverse = absmax > 0 ? kHalfLevels / absmax : 0.0f;
      if (!std::isfinite(inverse)) inverse = 0.0f;
      std::memcpy(p, &scale, sizeof scale);
      std::byte* indices = p + sizeof(float);
      auto* codes = reinterpret_cast<uint8_t*>(indices + kept * index_bytes_);
      std::memset(codes, 0, (kept + 3) / 4);
      for (size_t j = 0; j < kept; ++j) {
        const uint32_t index = kept_indices[j];
        if (index_bytes_ == 2) {
          auto narrow = static_cast<uint16_t>(index);
          std::memcpy(indices + j * 2, &narrow, 2);
        } else {
          std::memcpy(indices + j * 4, &index, 4);
        }
        float v = std::isfinite(x[index]) ? x[index] * inverse + kHalfLevels : kHalfLevels;
        auto code = static_cast<uint8_t>(std::clamp<long>(std::lrint(v), 0, 3));
        codes[j / 4] |= static_cast<uint8_t>(code << (2 * (j % 4)));
      }
      p += ChunkBytes(len);
    }
  }

  void Decode(std::span<const std::byte> in, std::span<float> out) const override {
    std::fill(out.begin(), out.end(), 0.0f);
    DecodeAccumulate(in, 1.0f, out);
  }

  void DecodeAccumulate(std::span<const std::byte> in, float weight,
                        std::span<float> out) const override {
    const std::byte* p = in.data();
    for (size_t start = 0; start < out.size(); start += chunk_) {
      const size_t len = std::min(chunk_, out.size() - start);
      const size_t kept = std::min(k_, len);
      float scale;
      std::memcpy(&scale, p, sizeof scale);
      scale *= weight;
      const std::byte* indices = p + sizeof(float);
      const auto* codes = reinterpret_cast<const uint8_t*>(indices + kept * index_bytes_);
      float* y = out.data() + start;
      for (size_t j = 0; j < kept; ++j) {
        uint32_t index = 0;
        if (index_bytes_ == 2) {
          uint16_t narrow;
          std::memcpy(&narrow, indices + j * 2, 2);
          index = narrow;
        } else {
          std::memcpy(&index, indices + j * 4, 4);
        }
        // Indices come from the wire: one past the chunk is ignored, not written.
        if (index >= len) continue;
        const int code = (codes[j / 4] >> (2 * (j % 4))) & 3;
        y[index] += scale * (static_cast<float>(code) - kHalfLevels);
      }
      p += ChunkBytes(len);
    }
  }

 private:
  // The indices of the `kept` largest magnitudes of x[0, len), ascending;
  // among equal magnitudes the lower indices win. Non-finite values count as
  // zero. One pass with a min-heap of the best so far: at 1-2% density nearly
  // every value is turned away by one comparison with the heap's smallest.
  static void SelectLargest(const float* x, size_t len, size_t kept, std::vector<float>& magnitudes,
                            std::vector<std::pair<float, uint32_t>>& heap,
                            std::vector<uint32_t>& indices) {
    magnitudes.resize(len);
    for (size_t i = 0; i < len; ++i) {
      float m = std::fabs(x[i]);
      magnitudes[i] = std::isfinite(m) ? m : 0.0f;
    }
    // "Worse" first: smaller magnitude, or the same magnitude at a higher index.
    auto worse_on_top = [](const std::pair<float, uint32_t>& a,
                           const std::pair<float, uint32_t>& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    heap.clear();
    for (size_t i = 0; i < kept; ++i) heap.emplace_back(magnitudes[i], static_cast<uint32_t>(i));
    std::make_heap(heap.begin(), heap.end(), worse_on_top);
    for (size_t i = kept; i < len; ++i) {
      // A later index never wins a tie, so only a strictly larger value enters.
      if (magnitudes[i] <= heap.front().first) continue;
      std::pop_heap(heap.begin(), heap.end(), worse_on_top);
      heap.back() = {magnitudes[i], static_cast<uint32_t>(i)};
      std::push_heap(heap.begin(), heap.end(), worse_on_top);
    }
    indices.clear();
    for (const auto& entry : heap) indices.push_back(entry.second);
    std::sort(indices.begin(), indices.end());
  }

  size_t ChunkBytes(size_t len) const {
    size_t kept = std::min(k_, len);
    return sizeof(float) + kept * index_bytes_ + (kept + 3) / 4;
  }

  const size_t chunk_;
  const size_t k_;
  const size_t index_bytes_;
};

}  // namespace

std::unique_ptr<Codec> MakeTopKCodec(size_t chunk, size_t k) {
  return std::make_unique<TopKCodec>(chunk, k);
}

}  // namespace mend::codecs
