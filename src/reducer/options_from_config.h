// Each part's options out of a checked configuration: the one place below
// the front ends where a learner's Config is read. The round driver's
// creation (RoundDriver::Create, Reducer::Create, DataParallel) and a
// group's start call these; the parts themselves (the rounds, the data
// plane, the codecs) take only their own options.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <memory>

#include "mend/codec.h"
#include "mend/communicator.h"
#include "mend/config.h"
#include "reducer/fragments.h"
#include "reducer/learner_session.h"
#include "reducer/round_options.h"

namespace mend::reducer {

// The step of the job's final merge: total_steps with final_merge on; 0: none.
uint64_t FinalMergeStep(const Config& config);

// `checkpoint_secret`: CheckpointOptions::secret (empty: none).
RoundOptions MakeRoundOptions(const Config& config, const FragmentSchedule& schedule,
                              std::string checkpoint_secret = {});

// The data plane's part (collective_timeout_ms, connect_timeout_ms,
// dataplane_host, link_latency_ms, link_rate_mbit); a round adds its
// prefix, id, rank, size and member ids (CommunicatorOptionsForRound).
CommunicatorOptions CommunicatorOptionsFrom(const Config& config);

// The codec the configuration names (codec, codec_block_size, topk_*).
CodecOptions CodecOptionsFrom(const Config& config);

// What RoundDriver::Create takes, of a checked configuration.
StatusOr<RoundDriverOptions> RoundDriverOptionsOf(const ValidConfig& config);

// LearnerSession::Start with the agent's and the round driver's options of
// `config`: how a front end starts a learner.
StatusOr<std::unique_ptr<LearnerSession>> StartLearnerSession(const ValidConfig& config,
                                                              LearnerSessionOptions options);

}  // namespace mend::reducer
