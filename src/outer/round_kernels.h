// The round's arithmetic on one run of a fragment's flat state: the
// pseudo-gradient at the boundary (with the provisional outer step) and the
// outer step's commit into the global state and the local parameters.
//
// Element by element these are the operations of PseudoGradient,
// OuterNesterovStep, OuterAverageStep and ApplyOuterResult (mend/outer.h),
// in the same order and in fp32: the same bits. They are written so that
// the compiler vectorises them (no aliasing, no branch in the loop, the sum
// of squares in kLanes partial sums); built with -O3 in mend_outer. Each
// returns the sum of squares of the run's pseudo-gradient in double: lane j
// sums the values at j, j + kLanes, ..., the lanes are added in order, then
// the tail, so every member computes the same sum from the same values.
//
// Thread-safety: pure functions over the caller's buffers; runs that do not
// overlap may be worked on from any threads at once.
#pragma once

#include <cstddef>

namespace mend::kernels {

inline constexpr size_t kLanes = 8;

// d <- g - theta; returns sum(d^2).
double Difference(const float* g, const float* theta, float* d, size_t n);

// The provisional outer step (outer_apply = eager): OuterNesterovStep with
// this learner's pseudo-gradient `d` as the merge, into the local
// parameters: p = g - lr (d + mu (mu m + d)); theta <- p, step <- g - p.
void ProvisionalStep(const float* g, const float* m, const float* d, float* theta, float* step,
                     size_t n, float lr, float mu);

// What the commit does to the local parameters theta, given the global
// state's old value `old` and new value `next`.
enum class LocalUpdate {
  kReplace,   // theta <- next
  kProgress,  // theta += next - old
  kExact,     // theta += (next - old) + add
  kMix,       // theta <- alpha theta + (1 - alpha) next
};

struct CommitArgs {
  bool average = false;  // g <- g - d (m kept); else Nesterov's step with lr, mu
  float lr = 0;
  float mu = 0;
  LocalUpdate local = LocalUpdate::kReplace;
  float alpha = 0;  // kMix
};

// The outer step of merged pseudo-gradient `d` on the global state g and
// momentum m in place, and theta with it; `add` is kExact's term (else
// unused, may be null). Returns sum(d^2).
double Commit(const CommitArgs& args, const float* d, float* g, float* m, float* theta,
              const float* add, size_t n);

}  // namespace mend::kernels
