// The training example's model: a small decoder-only transformer over bytes
// (GPT-style: token and learned position embeddings, pre-norm blocks of
// causal self-attention and an MLP, a final norm and a linear head).
//
// Parameters are registered in a fixed order (embeddings, then block by
// block, then the head), which is the layer order the reducer's fragments
// are strided over.
//
// Thread-safety: as any torch::nn::Module.
#pragma once

#include <cstdint>

#include "mend/status.h"
#include "torch/nn/module.h"
#include "torch/nn/modules/container/modulelist.h"
#include "torch/nn/modules/embedding.h"
#include "torch/nn/modules/linear.h"
#include "torch/nn/modules/normalization.h"
#include "torch/nn/pimpl.h"
#include "train/gpt_options.h"

namespace mend::train {

[[nodiscard]] Status CheckGptOptions(const GptOptions& options);

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(int64_t dim, int64_t heads);
  at::Tensor forward(const at::Tensor& x);

 private:
  at::Tensor Attention(const at::Tensor& x);

  int64_t heads_;
  torch::nn::LayerNorm norm1_{nullptr}, norm2_{nullptr};
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr}, up_{nullptr}, down_{nullptr};
};
TORCH_MODULE(Block);

class GptImpl : public torch::nn::Module {
 public:
  explicit GptImpl(const GptOptions& options);
  // [batch, time] int64 bytes -> [batch, time, vocab] logits.
  at::Tensor forward(const at::Tensor& bytes);
  // Mean cross-entropy (nats per byte) of predicting `targets`.
  at::Tensor Loss(const at::Tensor& bytes, const at::Tensor& targets);
  const GptOptions& options() const { return options_; }
  int64_t parameter_count();

 private:
  GptOptions options_;
  torch::nn::Embedding tokens_{nullptr};
  at::Tensor positions_;
  torch::nn::ModuleList blocks_;
  torch::nn::LayerNorm norm_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(Gpt);

// Initial parameters: normal(0, 0.02) weights, zero biases, unit norms;
// the same for every learner given the same seed.
void InitGpt(Gpt& model, uint64_t seed);

}  // namespace mend::train
