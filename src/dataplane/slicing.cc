#include "dataplane/slicing.h"

#include <algorithm>

namespace mend::dataplane {

Slicing::Slicing(size_t values, int members, size_t alignment, size_t segment_values)
    : values_(values), members_(std::max(members, 1)) {
  const size_t units = (values + alignment - 1) / alignment;
  const size_t members_count = static_cast<size_t>(members_);
  slice_values_ = (units + members_count - 1) / members_count * alignment;
  segment_values_ = std::max(alignment, segment_values / alignment * alignment);
  segments_ = slice_values_ == 0 ? 1 : (slice_values_ + segment_values_ - 1) / segment_values_;
}

std::pair<size_t, size_t> Slicing::Piece(int slice, size_t segment) const {
  const size_t slice_begin = std::min(values_, static_cast<size_t>(slice) * slice_values_);
  const size_t slice_end = std::min(values_, slice_begin + slice_values_);
  const size_t begin = std::min(slice_end, slice_begin + segment * segment_values_);
  const size_t end = std::min(slice_end, begin + segment_values_);
  return {begin, end};
}

EncodedLayout::EncodedLayout(const Slicing& slicing, const Codec& codec)
    : segments_(slicing.segments()) {
  for (int slice = 0; slice < slicing.members(); ++slice) {
    for (size_t s = 0; s < segments_; ++s) {
      auto [begin, end] = slicing.Piece(slice, s);
      bytes_.push_back(end > begin ? codec.EncodedBytes(end - begin) : 0);
    }
  }
  offsets_.resize(bytes_.size() + 1, 0);
  for (size_t i = 0; i < bytes_.size(); ++i) offsets_[i + 1] = offsets_[i] + bytes_[i];
}

}  // namespace mend::dataplane
