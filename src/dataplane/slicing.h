// How a reduction cuts a buffer: one slice per member (the member that owns
// and reduces it), each slice cut into segments (the pipelining unit), every
// boundary on a multiple of the codec's alignment so that pieces encode on
// their own. Pure arithmetic, the same on every member.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "mend/codec.h"

namespace mend::dataplane {

class Slicing {
 public:
  // `values` in `members` slices, segments of about `segment_values`.
  Slicing(size_t values, int members, size_t alignment, size_t segment_values);

  int members() const { return members_; }
  size_t segments() const { return segments_; }
  // [begin, end) of segment `segment` of slice `slice` (empty past its end).
  std::pair<size_t, size_t> Piece(int slice, size_t segment) const;

 private:
  size_t values_;
  int members_;
  size_t slice_values_;
  size_t segment_values_;
  size_t segments_;
};

// Where each piece's encoding sits in a buffer holding all of them, in
// (slice, segment) order.
class EncodedLayout {
 public:
  EncodedLayout(const Slicing& slicing, const Codec& codec);

  size_t piece_bytes(int slice, size_t segment) const { return bytes_[Index(slice, segment)]; }
  size_t offset(int slice, size_t segment) const { return offsets_[Index(slice, segment)]; }
  size_t offset_in_slice(int slice, size_t segment) const {
    return offset(slice, segment) - offset(slice, 0);
  }
  size_t slice_bytes(int slice) const {
    return offsets_[Index(slice, 0) + segments_] - offsets_[Index(slice, 0)];
  }
  size_t total_bytes() const { return offsets_.back(); }

 private:
  size_t Index(int slice, size_t segment) const {
    return static_cast<size_t>(slice) * segments_ + segment;
  }

  size_t segments_;
  std::vector<size_t> bytes_;
  std::vector<size_t> offsets_;  // one more than bytes_: the end
};

}  // namespace mend::dataplane
