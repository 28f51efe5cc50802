// The job's final merge (final_merge, at shutdown after the job's last
// step): one round per fragment whose state is of an earlier step, each
// launched and taken up at once, so that every member ends with the
// members' average model, global and local alike. The last one's
// checkpoint (with checkpoint_dir and checkpoint_every_rounds) holds the
// merged model. A join whose round closed without it (it came too late: the
// others merged and left), or that is short of a quorum, is called off (as
// the phase table decides); the learner then keeps its own model (short of
// a quorum: the others are gone, said in a warning) or takes the job's final
// one (left out: the caller, TakeTheJobsFinalModel).
//
// Thread-safety: the training thread, at shutdown.
#pragma once

#include <functional>

#include "mend/clock.h"
#include "mend/reducer_stats.h"
#include "mend/status.h"
#include "reducer/flights.h"
#include "reducer/outer_state.h"
#include "reducer/round_options.h"
#include "reducer/round_plan.h"

namespace mend::reducer {

// Nothing in flight. `ask`: the phase table's decision on an event now.
// True when the job's final round closed without this learner.
StatusOr<bool> RunFinalMerge(Flights& flights, const OuterState& outer, const RoundOptions& options,
                             ReducerStats& stats, const Clock& clock,
                             const std::function<Decision(Event)>& ask);

}  // namespace mend::reducer
