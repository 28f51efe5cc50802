// The outer synchronizer's arithmetic (docs/architecture.md, "Outer
// synchronizer arithmetic"), on flat fp32 buffers: the reducer keeps one buffer per
// fragment of the model and calls these around each round's exchange.
//
// Notation: theta_g the global parameters (bit-identical on every member
// after a round), theta_base the theta_g this learner last started from,
// theta_i its local parameters, delta_i = theta_base - theta_i(s) its
// pseudo-gradient at the round's boundary step s, delta the merged one.
//
// All functions are pure loops over their arguments (the same inputs give
// the same bits on every member); none allocates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "mend/config_enums.h"
#include "mend/status.h"

namespace mend {

struct OuterOptions {
  float lr = 0.7f;        // eta
  float momentum = 0.9f;  // mu; 0 turns the outer optimizer into SGD
};

// out = base - local: the pseudo-gradient (what local training moved).
void PseudoGradient(std::span<const float> base, std::span<const float> local,
                    std::span<float> out);

// Outer Nesterov step on theta_g with the merged pseudo-gradient:
//   m <- mu m + delta;  theta_g <- theta_g - eta (delta + mu m)
// With eta = 1 and mu = 0 it is theta_g - delta: plain averaging of the
// members' parameters (and SparseLoCo's outer step).
void OuterNesterovStep(std::span<float> theta_g, std::span<float> momentum,
                       std::span<const float> delta, const OuterOptions& options);

// The outer warm-up's step: theta_g <- theta_g - delta, the members' average,
// without touching the momentum (OuterNesterovStep with eta = 1 and mu = 0
// would leave delta in it).
void OuterAverageStep(std::span<float> theta_g, std::span<const float> delta);

// (OuterApply is config_enums.h's: the `outer_apply` key's values.)

// Brings a round's result into the local parameters, `late` inner steps
// after the boundary (0: synchronous). `theta_base` is the global state the
// round started from, `delta_i` this learner's pseudo-gradient of the round.
//   exact: theta_i <- theta_i + (theta_g' - theta_base) + delta_i
//          ( = theta_g' + the progress since the boundary; = theta_g' when
//            nothing happened since)
//   mix:   theta_i <- alpha theta_i + (1 - alpha) theta_g'
void ApplyOuterResult(std::span<float> theta_i, std::span<const float> theta_g_new,
                      std::span<const float> theta_base, std::span<const float> delta_i,
                      OuterApply mode, float alpha);

// Which fragments of a Streaming DiLoCo schedule start their exchange at an
// inner step. P fragments, period H: fragment p's boundaries are the steps
// s > 0 with s = p * H / P (mod H) (the first at p * H / P, or H for p = 0),
// so the fragments are staggered by H / P. With P = 1 it is every H steps
// (plain DiLoCo).
class FragmentSchedule {
 public:
  // INVALID_ARGUMENT when fragments < 1, period < 1 or fragments > period.
  [[nodiscard]] static StatusOr<FragmentSchedule> Make(int64_t fragments, int64_t period);

  int64_t fragments() const { return fragments_; }
  int64_t period() const { return period_; }
  // The step offset of fragment p within the period.
  int64_t offset(int64_t fragment) const { return fragment * period_ / fragments_; }
  // True when fragment p's exchange starts after inner step `step` (1-based).
  bool StartsAt(int64_t fragment, int64_t step) const {
    const int64_t o = offset(fragment);
    return step > 0 && step >= o && (step - o) % period_ == 0;
  }

 private:
  FragmentSchedule(int64_t fragments, int64_t period) : fragments_(fragments), period_(period) {}
  int64_t fragments_;
  int64_t period_;
};

// Fragment of layer `layer` (layers strided: l mod P).
inline int64_t FragmentOfLayer(int64_t layer, int64_t fragments) { return layer % fragments; }

}  // namespace mend
