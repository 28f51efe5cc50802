// The fp32 all-reduce's arithmetic (GlooCommunicator's reduce): built with
// -O3 so that its loops are vectorised.
//
// Thread-safety: a pure function over the caller's buffers.
#pragma once

#include <cstddef>
#include <vector>

namespace mend::dataplane {

// out = scale * (G_0 + G_1 + ...), where group G_k = w_a x_a + w_b x_b + ...
// over its members in order, every operation in fp32 from left to right
// (x_r may be `out` itself). Element by element, in blocks that stay in L1:
// one pass over each input and one over the output. The rack-aware merge
// computes each G_k in its rack and the rest across racks with the same
// operations, hence the same bits.
void WeightedSum(float* out, const std::vector<const float*>& inputs,
                 const std::vector<float>& weights, const std::vector<std::vector<int>>& groups,
                 float scale, size_t n);

}  // namespace mend::dataplane
