// FlatParameters held in plain vectors of floats, each with a name and a
// shape: the model of the tests and benchmarks that drive rounds without
// LibTorch.
//
// Thread-safety: as FlatParameters (the training thread; Values() spans
// from the round's threads, each its own range).
#pragma once

#include <cstring>
#include <functional>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "reducer/flat_state.h"

namespace mend::reducer {

class VectorParameters final : public FlatParameters {
 public:
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
  };
  // Every value `start`. `in_place`: the round works on the vectors where
  // they are (Values()), as on a model's CPU fp32 parameters; else through
  // CopyOut and CopyIn, as on parameters staged from a GPU.
  VectorParameters(std::vector<Tensor> tensors, float start, bool in_place = false)
      : tensors_(std::move(tensors)), in_place_(in_place) {
    for (const Tensor& tensor : tensors_) {
      const int64_t numel = std::accumulate(tensor.shape.begin(), tensor.shape.end(), int64_t{1},
                                            std::multiplies<int64_t>());
      values_.emplace_back(static_cast<size_t>(numel), start);
    }
  }

  size_t count() const override { return tensors_.size(); }
  const std::string& name(size_t i) const override { return tensors_[i].name; }
  std::vector<int64_t> shape(size_t i) const override { return tensors_[i].shape; }
  size_t numel(size_t i) const override { return values_[i].size(); }
  void CopyOut(size_t i, std::span<float> out) const override {
    std::memcpy(out.data(), values_[i].data(), out.size_bytes());
  }
  void CopyIn(size_t i, std::span<const float> in) override {
    std::memcpy(values_[i].data(), in.data(), in.size_bytes());
  }
  std::span<float> Values(size_t i) override {
    return in_place_ ? std::span<float>(values_[i]) : std::span<float>();
  }

  std::vector<std::vector<float>>& values() { return values_; }
  std::vector<float>& values(size_t i) { return values_[i]; }
  const std::vector<float>& values(size_t i) const { return values_[i]; }
  // Every parameter's values, in order, end to end.
  std::vector<float> All() const {
    std::vector<float> all;
    for (const std::vector<float>& values : values_)
      all.insert(all.end(), values.begin(), values.end());
    return all;
  }

 private:
  const std::vector<Tensor> tensors_;
  const bool in_place_;
  std::vector<std::vector<float>> values_;
};

}  // namespace mend::reducer
