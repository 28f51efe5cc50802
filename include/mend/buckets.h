// Buckets: many tensors packed into few flat buffers, so that a collective
// runs once per bucket instead of once per tensor (a model has hundreds of
// small tensors; each collective costs at least a round trip).
//
// A plan is made once from the tensors' sizes (in values) and a bucket size:
// tensors are laid out in order; a tensor that fits in a bucket is never cut
// (it starts the next bucket when this one is too full), a larger one fills
// the rest of the current bucket and goes on into the next ones. The same
// sizes give the same plan on every member.
//
// Thread-safety: a plan is immutable; Pack/Unpack touch only their arguments.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "mend/codec.h"
#include "mend/communicator.h"
#include "mend/status.h"

namespace mend {

class BucketPlan {
 public:
  // One piece of a tensor inside a bucket.
  struct Piece {
    size_t tensor;         // index into the tensors' list
    size_t tensor_offset;  // first value of the piece in the tensor
    size_t bucket_offset;  // where it goes in the bucket
    size_t count;          // values
  };

  BucketPlan(std::span<const size_t> tensor_sizes, size_t bucket_values);

  size_t buckets() const { return bucket_sizes_.size(); }
  size_t bucket_size(size_t bucket) const { return bucket_sizes_[bucket]; }
  size_t total_values() const { return total_; }
  std::span<const Piece> pieces(size_t bucket) const { return pieces_[bucket]; }

  // Copies the bucket's pieces of `tensors` into `out` (bucket_size values).
  void Pack(size_t bucket, std::span<const std::span<const float>> tensors,
            std::span<float> out) const;
  // Copies `in` (bucket_size values) back into the bucket's pieces of `tensors`.
  void Unpack(size_t bucket, std::span<const float> in,
              std::span<const std::span<float>> tensors) const;

 private:
  std::vector<size_t> bucket_sizes_;
  std::vector<std::vector<Piece>> pieces_;
  size_t total_ = 0;
};

// tensors[i] <- weighted mean over the members (Communicator::WeightedAllReduce
// semantics), bucket by bucket through `scratch` (resized as needed). The
// tensors' sizes must be the same on every member.
[[nodiscard]] Status WeightedAllReduceBuckets(Communicator& comm, const BucketPlan& plan,
                                              std::span<const std::span<float>> tensors,
                                              double weight, const Codec* codec,
                                              std::vector<float>& scratch);

}  // namespace mend
