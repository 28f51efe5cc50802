// What the round driver and the outer state read of a learner's config,
// built once from it after CheckConfig accepted it (MakeRoundOptions, in
// options_from_config.h): the derived values (the most rounds in flight,
// the round threads, DES-LOC's sync intervals in rounds, the final merge's
// step) are worked out there, not where they are used.
//
// Thread-safety: immutable once made.
#pragma once

#include <cstdint>
#include <string>

#include "mend/codec.h"
#include "mend/communicator.h"
#include "mend/config_enums.h"
#include "mend/outer_sync.h"
#include "mend/status.h"
#include "reducer/fragments.h"

namespace mend::reducer {

// Where checkpoints go, and what a learner resumes from.
struct CheckpointOptions {
  std::string dir;            // checkpoint_dir (empty: none)
  int keep = 0;               // checkpoint_keep
  uint64_t every_rounds = 0;  // checkpoint_every_rounds (0: never)
  std::string resume_from;    // a file to start from (empty: none)
  bool resume = false;        // the newest checkpoint in `dir`, when there is one
  std::string job_id;
  std::string config_toml;  // the learner's config, as each checkpoint records it
  // What checkpoints (files and exported state) are authenticated with: the
  // job token with checkpoint_authenticate (LearnerAgent::checkpoint_secret),
  // else empty.
  std::string secret;
};

struct RoundOptions {
  bool concurrent = false;        // concurrent_outer_step
  uint64_t rounds_in_flight = 1;  // the most at once (1: synchronous, or rounds_in_flight = 1)
  int64_t overlap_steps = 0;      // tau as configured (0: tuned)
  OuterApply apply = OuterApply::kEager;
  float mixing_alpha = 0.5f;
  uint64_t outer_warmup_steps = 0;
  uint64_t total_steps = 0;       // 0: not known
  uint64_t final_merge_step = 0;  // 0: no final merge (FinalMergeStep)
  uint64_t fragment_period = 1;   // steps between two rounds (of consecutive fragments)
  // The job's last fragment periods, as many as rounds may be in flight (0:
  // none; see InFinalPeriod).
  uint64_t final_period = 0;
  bool train_through_lighthouse_outage = false;
  int round_threads = 1;  // the training thread's pool for the round's arithmetic
  // The outer optimizer, the merge's weights and the error feedback (the
  // codec is the driver's own).
  OuterSyncOptions sync;
  bool desloc = false;
  uint64_t desloc_rounds[2] = {3, 6};  // rounds between two syncs of each moment
  bool heal_inner_optimizer = false;
  std::string diagnostics_dir;
  CheckpointOptions checkpoints;
  // Each round's data plane: the configuration's part (CommunicatorOptionsFrom);
  // a round adds its own members (CommunicatorOptionsForRound).
  CommunicatorOptions communicator;
  Micros quorum_timeout = 0;  // quorum_timeout_ms: a round's join
  bool rack_aware = false;

  // Whether `step` lies in the job's final period (total_steps known,
  // concurrent rounds): a round launched there could be taken up only after
  // the last step (the tuned tau is below a fragment period), so every
  // learner would wait for it at shutdown; none is launched. The rule
  // follows from the configuration alone, so that every learner skips the
  // same boundaries.
  bool InFinalPeriod(uint64_t step) const {
    return final_period > 0 && step <= total_steps && step + final_period > total_steps;
  }
  // The job's last boundary as a learner at `step` at shutdown knows it:
  // the last within a fragment period of its step, or (none is launched in
  // the final period) of the period's start.
  uint64_t LastBoundary(uint64_t step) const;
  // INVALID_ARGUMENT when desloc or heal_inner_optimizer needs the inner
  // optimizer's moments and the reducer was given none.
  Status CheckMoments(bool given) const;
  // Whether a round of (the lighthouse's) step `step` that exchanges
  // `fragment` is the job's final merge: total_steps known and reached, and
  // not the fragment's own boundary round there (synchronous mode launches
  // that one; concurrent mode none in the last fragment period). Every
  // member decides alike, from the round and the job's configuration.
  bool IsFinalMerge(const FragmentSchedule& schedule, uint64_t step, int fragment) const;
};

// What a round driver is made of (RoundDriver::Create): its rounds, their
// schedule and the codec of what they exchange. The front ends make it
// with RoundDriverOptionsOf (reducer/options_from_config.h).
struct RoundDriverOptions {
  RoundOptions rounds;
  FragmentSchedule schedule;
  CodecOptions codec;
};

}  // namespace mend::reducer
