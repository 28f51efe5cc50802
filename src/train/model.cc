#include "train/model.h"

#include <dlfcn.h>

#include <cmath>
#include <limits>

#include "ATen/ATen.h"
#include "core/status_format.h"
#include "fmt/format.h"
#include "torch/nn/functional/activation.h"
#include "torch/nn/functional/loss.h"
#include "torch/nn/init.h"
#include "torch/utils.h"

namespace mend::train {

Status CheckGptOptions(const GptOptions& options) {
  auto bad = [](const char* name, int64_t value, const char* rule) {
    return InvalidArgumentError(fmt::format("model: {} = {}: {}", name, value, rule));
  };
  if (options.vocab < 2 || options.vocab > 256)
    return bad("vocab", options.vocab, "must be in [2, 256]");
  if (options.context < 2 || options.context > 4096)
    return bad("context", options.context, "must be in [2, 4096]");
  if (options.dim < 8 || options.dim > 8192) return bad("dim", options.dim, "must be in [8, 8192]");
  if (options.layers < 1 || options.layers > 64)
    return bad("layers", options.layers, "must be in [1, 64]");
  if (options.heads < 1 || options.dim % options.heads != 0) {
    return bad("heads", options.heads, fmt::format("must divide dim = {}", options.dim).c_str());
  }
  return OkStatus();
}

BlockImpl::BlockImpl(int64_t dim, int64_t heads) : heads_(heads) {
  norm1_ = register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
  qkv_ = register_module("qkv", torch::nn::Linear(dim, 3 * dim));
  proj_ = register_module("proj", torch::nn::Linear(dim, dim));
  norm2_ = register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
  up_ = register_module("up", torch::nn::Linear(dim, 4 * dim));
  down_ = register_module("down", torch::nn::Linear(4 * dim, dim));
}

at::Tensor BlockImpl::Attention(const at::Tensor& x) {
  const int64_t batch = x.size(0), time = x.size(1), dim = x.size(2);
  const int64_t head_dim = dim / heads_;
  std::vector<at::Tensor> qkv = qkv_->forward(x).split(dim, /*dim=*/2);
  auto heads = [&](const at::Tensor& t) {
    return t.view({batch, time, heads_, head_dim}).transpose(1, 2);  // [B, h, T, d]
  };
  at::Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
  at::Tensor scores =
      at::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(head_dim)));
  at::Tensor mask = at::ones({time, time}, at::TensorOptions().dtype(at::kBool)).triu(1);
  scores = scores.masked_fill(mask, -std::numeric_limits<float>::infinity());
  at::Tensor y = at::matmul(at::softmax(scores, -1), v);  // [B, h, T, d]
  return proj_->forward(y.transpose(1, 2).reshape({batch, time, dim}));
}

at::Tensor BlockImpl::forward(const at::Tensor& x) {
  at::Tensor h = x + Attention(norm1_->forward(x));
  return h + down_->forward(at::gelu(up_->forward(norm2_->forward(h))));
}

GptImpl::GptImpl(const GptOptions& options) : options_(options) {
  tokens_ = register_module("tokens", torch::nn::Embedding(options.vocab, options.dim));
  positions_ = register_parameter("positions", at::zeros({options.context, options.dim}));
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  for (int64_t l = 0; l < options.layers; ++l)
    blocks_->push_back(Block(options.dim, options.heads));
  norm_ = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({options.dim})));
  head_ = register_module(
      "head", torch::nn::Linear(torch::nn::LinearOptions(options.dim, options.vocab).bias(false)));
}

at::Tensor GptImpl::forward(const at::Tensor& bytes) {
  const int64_t time = bytes.size(1);
  at::Tensor x = tokens_->forward(bytes) + positions_.slice(0, 0, time);
  for (const auto& block : *blocks_) x = block->as<Block>()->forward(x);
  return head_->forward(norm_->forward(x));
}

at::Tensor GptImpl::Loss(const at::Tensor& bytes, const at::Tensor& targets) {
  at::Tensor logits = forward(bytes);
  return at::cross_entropy_loss(logits.reshape({-1, options_.vocab}), targets.reshape({-1}));
}

int64_t GptImpl::parameter_count() {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

void InitGpt(Gpt& model, uint64_t seed) {
  at::NoGradGuard no_grad;
  auto generator = at::detail::createCPUGenerator(seed);
  for (auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    at::Tensor& p = item.value();
    const bool is_norm = name.find("norm") != std::string::npos;
    const bool is_bias = name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0;
    if (is_norm) {
      p.fill_(is_bias ? 0.0 : 1.0);
    } else if (is_bias) {
      p.zero_();
    } else {
      p.normal_(0.0, 0.02, generator);
    }
  }
}

void SetComputeThreads(int threads) {
  at::set_num_threads(threads);
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set(threads);
  }
}

}  // namespace mend::train
