#include "mend/buckets.h"

#include <algorithm>
#include <cstring>

#include "core/status_format.h"
#include "fmt/format.h"

namespace mend {

BucketPlan::BucketPlan(std::span<const size_t> tensor_sizes, size_t bucket_values) {
  bucket_values = std::max<size_t>(bucket_values, 1);
  size_t used = bucket_values;  // forces a first bucket
  for (size_t tensor = 0; tensor < tensor_sizes.size(); ++tensor) {
    size_t size = tensor_sizes[tensor];
    total_ += size;
    // A tensor that fits a bucket but not this one starts the next.
    if (size <= bucket_values && used + size > bucket_values) used = bucket_values;
    for (size_t offset = 0; offset < size;) {
      if (used == bucket_values) {
        bucket_sizes_.push_back(0);
        pieces_.emplace_back();
        used = 0;
      }
      size_t count = std::min(size - offset, bucket_values - used);
      pieces_.back().push_back({tensor, offset, used, count});
      used += count;
      bucket_sizes_.back() = used;
      offset += count;
    }
  }
}

void BucketPlan::Pack(size_t bucket, std::span<const std::span<const float>> tensors,
                      std::span<float> out) const {
  for (const Piece& piece : pieces_[bucket]) {
    std::memcpy(out.data() + piece.bucket_offset,
                tensors[piece.tensor].data() + piece.tensor_offset, piece.count * sizeof(float));
  }
}

void BucketPlan::Unpack(size_t bucket, std::span<const float> in,
                        std::span<const std::span<float>> tensors) const {
  for (const Piece& piece : pieces_[bucket]) {
    std::memcpy(tensors[piece.tensor].data() + piece.tensor_offset, in.data() + piece.bucket_offset,
                piece.count * sizeof(float));
  }
}

Status WeightedAllReduceBuckets(Communicator& comm, const BucketPlan& plan,
                                std::span<const std::span<float>> tensors, double weight,
                                const Codec* codec, std::vector<float>& scratch) {
  std::vector<std::span<const float>> views(tensors.begin(), tensors.end());
  for (size_t bucket = 0; bucket < plan.buckets(); ++bucket) {
    scratch.resize(plan.bucket_size(bucket));
    plan.Pack(bucket, views, scratch);
    Status status = comm.WeightedAllReduce(scratch, weight, codec);
    if (!status.ok()) {
      return Annotate(status, fmt::format("bucket {} of {}", bucket + 1, plan.buckets()));
    }
    plan.Unpack(bucket, scratch, tensors);
  }
  return OkStatus();
}

}  // namespace mend
