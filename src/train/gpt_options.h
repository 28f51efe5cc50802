// The shape of the training example's model (train/model.h), without
// LibTorch: what `mend train` parses and the trainer's options carry.
#pragma once

#include <cstdint>

namespace mend::train {

struct GptOptions {
  int64_t vocab = 256;
  int64_t context = 64;
  int64_t dim = 128;
  int64_t layers = 2;
  int64_t heads = 4;
};

// LibTorch's intra-op threads, and those of the BLAS it calls: Debian's
// OpenBLAS (pthread build) starts a worker per core that spins between
// calls, which halves the speed of two learners sharing a machine. The
// BLAS's call is looked up at run time because the BLAS is chosen by the
// system's alternatives, not at link time. (In model.cc.)
void SetComputeThreads(int threads);

}  // namespace mend::train
