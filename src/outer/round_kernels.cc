#include "outer/round_kernels.h"

namespace mend::kernels {
namespace {

double Total(const double (&lanes)[kLanes], double tail) {
  double sum = 0;
  for (double lane : lanes) sum += lane;
  return sum + tail;
}

struct Outer {
  float lr, mu, keep, take;
};

// One element of the commit: the global state g and momentum m in place;
// returns theta's new value.
template <bool kAverage, LocalUpdate kLocal>
inline float CommitOne(const Outer& o, float d, float& g, float& m, float theta, float add) {
  const float old = g;
  float next;
  if constexpr (kAverage) {
    next = old - d;
  } else {
    const float mm = o.mu * m + d;
    m = mm;
    next = old - o.lr * (d + o.mu * mm);
  }
  g = next;
  if constexpr (kLocal == LocalUpdate::kReplace) return next;
  if constexpr (kLocal == LocalUpdate::kProgress) return theta + (next - old);
  if constexpr (kLocal == LocalUpdate::kExact) return theta + ((next - old) + add);
  return o.keep * theta + o.take * next;
}

template <bool kAverage, LocalUpdate kLocal>
double CommitRun(const CommitArgs& args, const float* __restrict d, float* __restrict g,
                 float* __restrict m, float* __restrict theta, const float* __restrict add,
                 size_t n) {
  const Outer o{args.lr, args.mu, args.alpha, 1.0f - args.alpha};
  constexpr bool kAdds = kLocal == LocalUpdate::kExact;
  double lanes[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      const size_t k = i + j;
      theta[k] = CommitOne<kAverage, kLocal>(o, d[k], g[k], m[k], theta[k], kAdds ? add[k] : 0.0f);
      lanes[j] += static_cast<double>(d[k]) * d[k];
    }
  }
  double tail = 0;
  for (; i < n; ++i) {
    theta[i] = CommitOne<kAverage, kLocal>(o, d[i], g[i], m[i], theta[i], kAdds ? add[i] : 0.0f);
    tail += static_cast<double>(d[i]) * d[i];
  }
  return Total(lanes, tail);
}

template <bool kAverage>
double CommitAs(const CommitArgs& args, const float* d, float* g, float* m, float* theta,
                const float* add, size_t n) {
  switch (args.local) {
    case LocalUpdate::kReplace:
      return CommitRun<kAverage, LocalUpdate::kReplace>(args, d, g, m, theta, add, n);
    case LocalUpdate::kProgress:
      return CommitRun<kAverage, LocalUpdate::kProgress>(args, d, g, m, theta, add, n);
    case LocalUpdate::kExact:
      return CommitRun<kAverage, LocalUpdate::kExact>(args, d, g, m, theta, add, n);
    case LocalUpdate::kMix:
      return CommitRun<kAverage, LocalUpdate::kMix>(args, d, g, m, theta, add, n);
  }
  return 0;
}

}  // namespace

double Difference(const float* __restrict g, const float* __restrict theta, float* __restrict d,
                  size_t n) {
  double lanes[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      const float v = g[i + j] - theta[i + j];
      d[i + j] = v;
      lanes[j] += static_cast<double>(v) * v;
    }
  }
  double tail = 0;
  for (; i < n; ++i) {
    const float v = g[i] - theta[i];
    d[i] = v;
    tail += static_cast<double>(v) * v;
  }
  return Total(lanes, tail);
}

void ProvisionalStep(const float* __restrict g, const float* __restrict m,
                     const float* __restrict d, float* __restrict theta, float* __restrict step,
                     size_t n, float lr, float mu) {
  for (size_t i = 0; i < n; ++i) {
    const float mm = mu * m[i] + d[i];
    const float provisional = g[i] - lr * (d[i] + mu * mm);
    step[i] = g[i] - provisional;
    theta[i] = provisional;
  }
}

double Commit(const CommitArgs& args, const float* d, float* g, float* m, float* theta,
              const float* add, size_t n) {
  return args.average ? CommitAs<true>(args, d, g, m, theta, add, n)
                      : CommitAs<false>(args, d, g, m, theta, add, n);
}

}  // namespace mend::kernels
