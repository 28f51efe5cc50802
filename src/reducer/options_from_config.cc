#include "reducer/options_from_config.h"

#include <algorithm>

#include "core/parallel.h"
#include "reducer/fragment_book.h"

namespace mend::reducer {
namespace {

// DES-LOC's moments are averaged every momentum_sync_period_steps (3 H by
// default) and second_moment_sync_period_steps (6 H): in rounds.
void SetDeslocRounds(const Config& config, RoundOptions* options) {
  const int64_t h = config.sync_period_steps;
  const int64_t periods[2] = {
      config.momentum_sync_period_steps > 0 ? config.momentum_sync_period_steps : 3 * h,
      config.second_moment_sync_period_steps > 0 ? config.second_moment_sync_period_steps : 6 * h};
  for (int k = 0; k < 2; ++k) options->desloc_rounds[k] = static_cast<uint64_t>(periods[k] / h);
}

// round_threads, or (0) the pool's default for the host.
int RoundThreads(const Config& config) {
  return config.round_threads > 0 ? static_cast<int>(config.round_threads)
                                  : ThreadPool::DefaultThreads();
}

CheckpointOptions MakeCheckpointOptions(const Config& config, std::string secret) {
  CheckpointOptions options;
  options.dir = config.checkpoint_dir;
  options.keep = static_cast<int>(config.checkpoint_keep);
  options.every_rounds =
      static_cast<uint64_t>(std::max<int64_t>(0, config.checkpoint_every_rounds));
  options.resume_from = config.resume_from;
  options.resume = config.resume;
  options.job_id = config.job_id;
  options.config_toml = ConfigToToml(config);
  options.secret = std::move(secret);
  return options;
}

}  // namespace

uint64_t FinalMergeStep(const Config& config) {
  return config.final_merge && config.total_steps > 0 ? static_cast<uint64_t>(config.total_steps)
                                                      : 0;
}

RoundOptions MakeRoundOptions(const Config& config, const FragmentSchedule& schedule,
                              std::string checkpoint_secret) {
  RoundOptions options;
  options.concurrent = config.concurrent_outer_step;
  options.rounds_in_flight =
      !options.concurrent
          ? 1
          : static_cast<uint64_t>(config.rounds_in_flight > 0 ? config.rounds_in_flight
                                                              : schedule.fragments());
  options.overlap_steps = config.overlap_steps;
  options.apply = config.outer_apply;
  options.mixing_alpha = static_cast<float>(config.mixing_alpha);
  options.outer_warmup_steps =
      static_cast<uint64_t>(std::max<int64_t>(0, config.outer_warmup_steps));
  options.total_steps = static_cast<uint64_t>(std::max<int64_t>(0, config.total_steps));
  options.final_merge_step = FinalMergeStep(config);
  options.fragment_period = FragmentPeriod(schedule);
  if (options.concurrent && options.total_steps > 0)
    options.final_period = options.rounds_in_flight * options.fragment_period;
  options.train_through_lighthouse_outage = config.train_through_lighthouse_outage;
  options.round_threads = RoundThreads(config);
  options.sync.outer = {static_cast<float>(config.outer_lr),
                        static_cast<float>(config.outer_momentum)};
  options.sync.token_weighted = config.token_weighted_merge;
  options.sync.error_feedback_beta = static_cast<float>(config.error_feedback_beta);
  options.desloc = config.desloc;
  if (options.desloc) SetDeslocRounds(config, &options);
  options.heal_inner_optimizer = config.heal_inner_optimizer;
  options.diagnostics_dir = config.diagnostics_dir;
  options.checkpoints = MakeCheckpointOptions(config, std::move(checkpoint_secret));
  options.communicator = CommunicatorOptionsFrom(config);
  options.quorum_timeout = config.quorum_timeout_ms * kMicrosPerMilli;
  options.rack_aware = config.rack_aware;
  return options;
}

CommunicatorOptions CommunicatorOptionsFrom(const Config& config) {
  CommunicatorOptions options;
  options.timeout = config.collective_timeout_ms * kMicrosPerMilli;
  options.connect_timeout = config.connect_timeout_ms * kMicrosPerMilli;
  options.bind_host = config.dataplane_host;
  options.link.latency = config.link_latency_ms * kMicrosPerMilli;
  options.link.bytes_per_s = config.link_rate_mbit * 1e6 / 8;
  options.seal_threads = RoundThreads(config);
  return options;
}

CodecOptions CodecOptionsFrom(const Config& config) {
  return {config.codec, static_cast<size_t>(config.codec_block_size),
          static_cast<size_t>(config.topk_chunk_size), static_cast<size_t>(config.topk_k)};
}

StatusOr<RoundDriverOptions> RoundDriverOptionsOf(const ValidConfig& valid) {
  const Config& config = valid;
  MEND_ASSIGN_OR_RETURN(FragmentSchedule schedule,
                        FragmentSchedule::Make(config.fragments, config.sync_period_steps));
  return RoundDriverOptions{MakeRoundOptions(config, schedule), schedule, CodecOptionsFrom(config)};
}

StatusOr<std::unique_ptr<LearnerSession>> StartLearnerSession(const ValidConfig& config,
                                                              LearnerSessionOptions options) {
  MEND_ASSIGN_OR_RETURN(RoundDriverOptions driver, RoundDriverOptionsOf(config));
  return LearnerSession::Start(AgentOptionsOf(config), std::move(driver), std::move(options));
}

}  // namespace mend::reducer
