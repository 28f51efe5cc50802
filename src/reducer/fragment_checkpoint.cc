#include "reducer/fragment_checkpoint.h"

#include <optional>
#include <span>

#include "core/status_format.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "spdlog/spdlog.h"

namespace mend::reducer {
namespace {

struct Piece {
  std::string name;
  size_t begin = 0;
  size_t end = 0;
};

// "NAME[a:b]" (learner_group.cc's name for a piece of a parameter).
std::optional<Piece> ParsePiece(const std::string& text) {
  const size_t open = text.rfind('[');
  const size_t colon = text.rfind(':');
  if (open == std::string::npos || colon == std::string::npos || colon < open ||
      text.back() != ']') {
    return std::nullopt;
  }
  try {
    Piece piece{text.substr(0, open), std::stoul(text.substr(open + 1, colon - open - 1)),
                std::stoul(text.substr(colon + 1, text.size() - colon - 2))};
    if (piece.begin >= piece.end) return std::nullopt;
    return piece;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

void AddFragmentTensors(const FlatParameters& parameters, const std::vector<Fragment>& fragments,
                        Checkpoint* checkpoint) {
  for (const Fragment& fragment : fragments) {
    size_t offset = 0;
    for (size_t l : fragment.parameters) {
      const size_t n = parameters.numel(l);
      const std::vector<int64_t> shape = parameters.shape(l);
      auto slice = [&](std::span<const float> all) {
        return std::vector<float>(all.begin() + static_cast<long>(offset),
                                  all.begin() + static_cast<long>(offset + n));
      };
      checkpoint->tensors.push_back(
          {"global/" + parameters.name(l), shape, slice(fragment.state->global())});
      checkpoint->tensors.push_back(
          {"outer_momentum/" + parameters.name(l), shape, slice(fragment.state->momentum())});
      offset += n;
    }
  }
}

void AddResidualTensors(const FlatParameters& parameters, const std::vector<Fragment>& fragments,
                        Checkpoint* checkpoint) {
  for (const Fragment& fragment : fragments) {
    std::span<const float> residual = fragment.state->residual();
    if (residual.empty()) continue;
    size_t offset = 0;
    for (size_t l : fragment.parameters) {
      const size_t n = parameters.numel(l);
      checkpoint->tensors.push_back(
          {"error_feedback/" + parameters.name(l), parameters.shape(l),
           std::vector<float>(residual.begin() + static_cast<long>(offset),
                              residual.begin() + static_cast<long>(offset + n))});
      offset += n;
    }
  }
}

std::vector<std::vector<float>> FragmentResiduals(const Checkpoint& checkpoint,
                                                  const FlatParameters& parameters,
                                                  const std::vector<Fragment>& fragments) {
  std::vector<std::vector<float>> residuals;
  for (const Fragment& fragment : fragments) {
    std::vector<float> residual;
    for (size_t l : fragment.parameters) {
      const CheckpointTensor* t = checkpoint.Find("error_feedback/" + parameters.name(l));
      if (t == nullptr || t->values.size() != parameters.numel(l)) {
        residual.clear();
        break;
      }
      residual.insert(residual.end(), t->values.begin(), t->values.end());
    }
    residuals.push_back(std::move(residual));
  }
  return residuals;
}

StatusOr<std::vector<std::pair<std::vector<float>, std::vector<float>>>> FragmentStates(
    const Checkpoint& checkpoint, const FlatParameters& parameters,
    const std::vector<Fragment>& fragments, const std::string& where) {
  std::vector<std::pair<std::vector<float>, std::vector<float>>> states;
  for (const Fragment& fragment : fragments) {
    std::vector<float> global, momentum;
    for (size_t l : fragment.parameters) {
      const std::string& name = parameters.name(l);
      const std::vector<int64_t> shape = parameters.shape(l);
      for (auto [prefix, out] :
           {std::pair{"global/", &global}, std::pair{"outer_momentum/", &momentum}}) {
        const CheckpointTensor* t = checkpoint.Find(prefix + name);
        if (!t) {
          // A multi-rank learner's slice holds pieces "NAME[a:b]" of the
          // parameters: values a..b of the whole tensor (any group size
          // reads a checkpoint of any other).
          if (auto piece = ParsePiece(name)) {
            const CheckpointTensor* whole = checkpoint.Find(prefix + piece->name);
            if (whole && piece->end <= whole->values.size()) {
              out->insert(out->end(), whole->values.begin() + static_cast<long>(piece->begin),
                          whole->values.begin() + static_cast<long>(piece->end));
              continue;
            }
          }
          return InvalidArgumentError(fmt::format(
              "checkpoint of round {} in {}: no tensor '{}{}' (is it from another model?)",
              checkpoint.meta.round_id, where, prefix, name));
        }
        if (t->shape != shape) {
          return InvalidArgumentError(fmt::format(
              "checkpoint of round {} in {}: tensor '{}{}' has shape [{}], the model's is [{}]",
              checkpoint.meta.round_id, where, prefix, name, fmt::join(t->shape, ", "),
              fmt::join(shape, ", ")));
        }
        out->insert(out->end(), t->values.begin(), t->values.end());
      }
    }
    states.emplace_back(std::move(global), std::move(momentum));
  }
  return states;
}

void CheckpointWriter::Write(std::shared_ptr<const Checkpoint> checkpoint) {
  Join();
  thread_ = std::thread([this, checkpoint]() {
    StatusOr<std::string> written = directory_.Save(*checkpoint);
    if (written.ok()) {
      written_.fetch_add(1);
      spdlog::info("checkpoint of round {} written to {}", checkpoint->meta.round_id, *written);
    } else {
      failed_.fetch_add(1);
      spdlog::error("checkpoint of round {} not written: {}", checkpoint->meta.round_id,
                    written.status());
    }
  });
}

void CheckpointWriter::Join() {
  if (thread_.joinable()) thread_.join();
}

}  // namespace mend::reducer
