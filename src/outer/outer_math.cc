#include "mend/outer.h"

namespace mend {

void PseudoGradient(std::span<const float> base, std::span<const float> local,
                    std::span<float> out) {
  const size_t n = out.size();
  for (size_t i = 0; i < n; ++i) out[i] = base[i] - local[i];
}

void OuterNesterovStep(std::span<float> theta_g, std::span<float> momentum,
                       std::span<const float> delta, const OuterOptions& options) {
  const float lr = options.lr;
  const float mu = options.momentum;
  const size_t n = theta_g.size();
  for (size_t i = 0; i < n; ++i) {
    const float m = mu * momentum[i] + delta[i];
    momentum[i] = m;
    theta_g[i] -= lr * (delta[i] + mu * m);
  }
}

void OuterAverageStep(std::span<float> theta_g, std::span<const float> delta) {
  const size_t n = theta_g.size();
  for (size_t i = 0; i < n; ++i) theta_g[i] -= delta[i];
}

void ApplyOuterResult(std::span<float> theta_i, std::span<const float> theta_g_new,
                      std::span<const float> theta_base, std::span<const float> delta_i,
                      OuterApply mode, float alpha) {
  const size_t n = theta_i.size();
  if (mode != OuterApply::kMix) {
    for (size_t i = 0; i < n; ++i) {
      theta_i[i] += (theta_g_new[i] - theta_base[i]) + delta_i[i];
    }
  } else {
    const float keep = alpha;
    const float take = 1.0f - alpha;
    for (size_t i = 0; i < n; ++i) theta_i[i] = keep * theta_i[i] + take * theta_g_new[i];
  }
}

}  // namespace mend
