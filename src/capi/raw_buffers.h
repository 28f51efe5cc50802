// The round driver's view (reducer/flat_state.h) of caller-owned fp32
// buffers: what a mend_learner attaches to. Each counts its writes, and
// records which buffers a call read and wrote, so that a front end that
// stages its parameters learns when to copy them back, and which.
//
// Thread-safety: the thread that calls the learner (as the driver); Values()
// also from the round's pool while that thread waits for it.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "reducer/flat_state.h"

namespace mend::capi {

struct RawBuffer {
  std::string name;
  float* data = nullptr;
  size_t numel = 0;
  std::vector<int64_t> shape;
  uint64_t replica_key = 0;  // (FlatParameters::replica_key)
};

class RawParameters final : public reducer::FlatParameters {
 public:
  explicit RawParameters(std::vector<RawBuffer> buffers)
      : buffers_(std::move(buffers)),
        touched_(std::make_unique<std::atomic<uint8_t>[]>(buffers_.size())) {}

  size_t count() const override { return buffers_.size(); }
  const std::string& name(size_t i) const override { return buffers_[i].name; }
  std::vector<int64_t> shape(size_t i) const override { return buffers_[i].shape; }
  size_t numel(size_t i) const override { return buffers_[i].numel; }
  uint64_t replica_key(size_t i) const override { return buffers_[i].replica_key; }
  void CopyOut(size_t i, std::span<float> out) const override {
    Touch(i, kRead);
    if (!out.empty()) std::memcpy(out.data(), buffers_[i].data, out.size_bytes());
  }
  void CopyIn(size_t i, std::span<const float> in) override {
    if (!in.empty()) std::memcpy(buffers_[i].data, in.data(), in.size_bytes());
    Touch(i, kWritten);
    ++writes_;
  }
  std::span<float> Values(size_t i) override {
    Touch(i, kRead);
    return {buffers_[i].data, buffers_[i].numel};
  }
  void Wrote(size_t i) override {
    Touch(i, kWritten);
    ++writes_;
  }
  uint64_t writes() const { return writes_; }

  // What the calls since ClearTouched() did to buffer i: kRead | kWritten.
  static constexpr uint8_t kRead = 1;
  static constexpr uint8_t kWritten = 2;
  uint8_t touched(size_t i) const { return touched_[i].load(std::memory_order_relaxed); }
  void ClearTouched() {
    for (size_t i = 0; i < buffers_.size(); ++i) touched_[i].store(0, std::memory_order_relaxed);
  }

 private:
  void Touch(size_t i, uint8_t how) const { touched_[i].fetch_or(how, std::memory_order_relaxed); }

  const std::vector<RawBuffer> buffers_;
  uint64_t writes_ = 0;
  // (Values() is called from the round's pool: several threads at once.)
  const std::unique_ptr<std::atomic<uint8_t>[]> touched_;
};

// Adam's two moments of each parameter, handed over as they appear, with
// the optimizer's betas and its step count (a caller-owned counter).
class RawMoments final : public reducer::FlatMoments {
 public:
  explicit RawMoments(std::vector<size_t> numels)
      : numels_(std::move(numels)), moments_(numels_.size()) {
    for (size_t n : numels_) size_ += n;
  }

  void Set(size_t index, float* first, float* second) { moments_[index] = {first, second}; }
  // `step` (may be null: none) is read at boundaries and written by heals.
  void SetOptimizer(double beta1, double beta2, uint64_t* step) {
    betas_ = {beta1, beta2};
    step_ = step;
  }

  size_t size() const override { return size_; }
  bool Read(Which which, std::span<float> out) const override {
    size_t offset = 0;
    for (size_t i = 0; i < numels_.size(); ++i) {
      const float* m = moments_[i][which];
      if (m == nullptr && numels_[i] > 0) return false;
      if (numels_[i] > 0) std::memcpy(out.data() + offset, m, numels_[i] * sizeof(float));
      offset += numels_[i];
    }
    return true;
  }
  void Adjust(Which which, std::span<const float> target, std::span<const float> snapshot,
              float weight) override {
    ForEach(which, [&](float* m, size_t offset, size_t n) {
      reducer::AdjustMoment(which, std::span(m, n), target.subspan(offset, n),
                            snapshot.subspan(offset, n), weight);
    });
  }
  void Replace(Which which, std::span<const float> target) override {
    ForEach(which, [&](float* m, size_t offset, size_t n) {
      std::memcpy(m, target.data() + offset, n * sizeof(float));
    });
  }
  double beta(Which which) const override { return betas_[which]; }
  uint64_t step() const override { return step_ != nullptr ? *step_ : 0; }
  void set_step(uint64_t step) override {
    if (step_ == nullptr) return;
    *step_ = step;
    ++writes_;
  }
  uint64_t writes() const { return writes_; }

 private:
  template <typename Body>
  void ForEach(Which which, Body&& body) {
    size_t offset = 0;
    for (size_t i = 0; i < numels_.size(); ++i) {
      if (float* m = moments_[i][which]; m != nullptr && numels_[i] > 0)
        body(m, offset, numels_[i]);
      offset += numels_[i];
    }
    ++writes_;
  }

  const std::vector<size_t> numels_;
  std::vector<std::array<float*, 2>> moments_;
  size_t size_ = 0;
  std::array<double, 2> betas_ = {0.9, 0.999};  // torch's defaults until the front end says
  uint64_t* step_ = nullptr;                    // caller-owned; null: none
  uint64_t writes_ = 0;
};

}  // namespace mend::capi
