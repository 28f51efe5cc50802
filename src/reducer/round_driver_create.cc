// RoundDriver::Create: the policy of a learner of one rank or of a group
// (which joins its LearnerGroup and takes this rank's slice of the
// parameters and moments), the round services, and the driver over them.
#include <utility>

#include "core/status_format.h"
#include "fmt/ranges.h"
#include "reducer/round_driver_impl.h"
#include "xxhash.h"

namespace mend::reducer {

std::string ParametersSetting(const std::vector<std::vector<int64_t>>& shapes) {
  // Each shape's rank, then its sizes: [2, 3] then [6] differs from [2, 3, 6].
  std::vector<int64_t> words;
  uint64_t values = 0;
  for (const std::vector<int64_t>& shape : shapes) {
    words.push_back(static_cast<int64_t>(shape.size()));
    words.insert(words.end(), shape.begin(), shape.end());
    uint64_t numel = 1;
    for (int64_t size : shape) numel *= static_cast<uint64_t>(size);
    values += numel;
  }
  std::string setting =
      fmt::format("parameters={} tensors, {} values, shapes {:016x}:", shapes.size(), values,
                  XXH3_64bits(words.data(), words.size() * sizeof(int64_t)));
  // The shapes themselves, as many as fit in the lighthouse's limit on a
  // setting (512 characters), so that a refusal shows where two models
  // differ (the digest covers the rest).
  constexpr size_t kMaxLength = 480;
  for (const std::vector<int64_t>& shape : shapes) {
    std::string text = fmt::format(" [{}]", fmt::join(shape, ","));
    if (setting.size() + text.size() > kMaxLength) {
      setting += " ...";
      break;
    }
    setting += text;
  }
  return setting;
}

StatusOr<std::unique_ptr<RoundDriver>> RoundDriver::Create(
    RoundDriverOptions options, LearnerAgent& agent, const Clock& clock,
    std::unique_ptr<FlatParameters> parameters, std::unique_ptr<FlatMoments> moments,
    uint64_t start_step, std::unique_ptr<RoundServices> services) {
  RoundOptions& rounds = options.rounds;
  rounds.checkpoints.secret = agent.checkpoint_secret();
  MEND_ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec, MakeCodec(options.codec));
  std::unique_ptr<RoundPolicy> policy = SingleRankPolicy();
  if (agent.options().group_size > 1) {
    if (parameters->count() == 0)
      return InvalidArgumentError("reducer: the model has no parameters");
    MEND_ASSIGN_OR_RETURN(std::unique_ptr<LearnerGroup> group,
                          LearnerGroup::Join(rounds, agent, *parameters));
    std::unique_ptr<FlatParameters> slice = group->Slice();
    std::unique_ptr<FlatMoments> moment_slice = moments ? group->Slice(*moments) : nullptr;
    policy = GroupPolicy(std::move(group), std::move(parameters), std::move(moments));
    parameters = std::move(slice);
    moments = std::move(moment_slice);
  }
  if (!services) {
    services = LighthouseRoundServices(agent, clock, rounds.communicator.timeout,
                                       rounds.train_through_lighthouse_outage);
  }
  auto driver = std::make_unique<RoundDriverImpl>(
      std::move(rounds), clock, agent.id(), options.schedule, std::move(codec), std::move(policy),
      std::move(parameters), std::move(moments));
  MEND_RETURN_IF_ERROR(driver->Init(start_step, std::move(services)));
  return std::unique_ptr<RoundDriver>(std::move(driver));
}

}  // namespace mend::reducer
