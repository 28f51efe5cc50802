#include "dataplane/weighted_sum.h"

#include <algorithm>
#include <cstring>

namespace mend::dataplane {
namespace {

// (An input never overlaps the block being summed: it lives on this stack.)
void Scaled(float* __restrict sum, const float* __restrict x, float w, size_t n) {
  for (size_t i = 0; i < n; ++i) sum[i] = w * x[i];
}

void AddScaled(float* __restrict sum, const float* __restrict x, float w, size_t n) {
  for (size_t i = 0; i < n; ++i) sum[i] += w * x[i];
}

void Add(float* __restrict sum, const float* __restrict x, size_t n) {
  for (size_t i = 0; i < n; ++i) sum[i] += x[i];
}

void Scale(float* __restrict sum, float scale, size_t n) {
  for (size_t i = 0; i < n; ++i) sum[i] *= scale;
}

}  // namespace

void WeightedSum(float* out, const std::vector<const float*>& inputs,
                 const std::vector<float>& weights, const std::vector<std::vector<int>>& groups,
                 float scale, size_t n) {
  constexpr size_t kBlock = 1024;
  alignas(64) float block[kBlock];
  alignas(64) float group[kBlock];
  for (size_t start = 0; start < n; start += kBlock) {
    const size_t len = std::min(kBlock, n - start);
    for (size_t g = 0; g < groups.size(); ++g) {
      float* sum = g == 0 ? block : group;
      const std::vector<int>& members = groups[g];
      const auto first = static_cast<size_t>(members[0]);
      Scaled(sum, inputs[first] + start, weights[first], len);
      for (size_t m = 1; m < members.size(); ++m) {
        const auto member = static_cast<size_t>(members[m]);
        AddScaled(sum, inputs[member] + start, weights[member], len);
      }
      if (g > 0) Add(block, group, len);
    }
    if (scale != 1.0f) Scale(block, scale, len);
    std::memcpy(out + start, block, len * sizeof(float));
  }
}

}  // namespace mend::dataplane
