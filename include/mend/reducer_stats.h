// What a reducer reports of its rounds (Reducer::stats()).
#pragma once

#include <cstdint>

namespace mend {

// Where the rounds' time went, in seconds summed over the rounds this
// learner completed (the work of a phase on several threads adds up, so
// phases that overlap the transfer can add up to more than the round).
struct RoundPhases {
  // The boundary's pseudo-gradient (copy-out): the training thread's, or
  // a synchronous round's, made as its merge reaches each piece.
  double snapshot = 0;
  double join = 0;                 // the quorum, the rendezvous and the members' connections
  double agree_or_heal = 0;        // comparing the members' states, or healing
  double encode = 0;               // the codec's encoding (none for fp32)
  double transfer = 0;             // waiting for the network (sends and receives)
  double reduce = 0;               // summing and decoding the members' pieces
  double outer_step = 0;           // training thread: the outer step with the parameters' update
  double moments_and_buffers = 0;  // DES-LOC's moments, sync_buffers
  double round = 0;                // launch to the end of the round's thread (wall)
};

struct ReducerStats {
  uint64_t steps = 0;           // the job's step as this learner knows it (see Create)
  uint64_t tokens = 0;          // tokens the learner trained on (all its ranks'), this process
  uint64_t rounds_started = 0;  // rounds launched at a fragment boundary
  uint64_t rounds = 0;          // rounds this learner completed
  uint64_t failed_rounds = 0;   // rounds that failed or formed without it
  uint64_t passed_over = 0;     // rounds for its boundary that closed without it (it trained on)
  uint64_t heals = 0;           // times it took the global state from a peer
  uint64_t moment_syncs = 0;    // DES-LOC moment averagings (first and second counted apart)
  uint64_t bytes_sent = 0;      // data-plane bytes of the merges, all rounds
  // Data-plane bytes this learner sent to members in other racks (or of no
  // rack), all rounds, healing included: what the slow links carried.
  uint64_t cross_rack_bytes_sent = 0;
  uint64_t last_round_id = 0;
  uint64_t checkpoints = 0;          // written by this learner
  uint64_t checkpoint_failures = 0;  // writes that failed (logged; training goes on)
  uint64_t resumed_from_round = 0;   // the checkpoint's round when it resumed, else 0
  uint64_t overlap_steps = 0;     // tau of the latest round launched (tuned when overlap_steps = 0)
  uint64_t parameter_copies = 0;  // fragment-sized copies to or from the parameters (rounds only)
  uint64_t final_rounds = 0;      // rounds of the final merge at shutdown this learner completed
  uint64_t round_waits = 0;  // rounds a step waited for (not arrived when due, or at a boundary)
  uint64_t most_rounds_in_flight = 0;  // the most rounds in flight at once
  // Rounds whose pseudo-gradient was made as the merge reached each piece
  // (synchronous, fp32, fewer than three members, parameters in place).
  uint64_t rounds_made_in_merge = 0;
  // Bytes this rank sent to its group's other ranks (mend's own connections
  // inside the rack): the shared slices after each round, and agreements.
  uint64_t group_bytes_sent = 0;
  // Of those, the bytes of the model's state (parameters, moments, a
  // round's values) the shared slices carried: a whole replica's after each
  // round; only the replicated pieces of a sharded model.
  uint64_t group_state_bytes_sent = 0;
  // How far rounds moved `steps` onto the job's (forward: positive): a
  // heal, or a round whose members were a fragment period or more ahead. A
  // learner that restarted joins the job at the others' step, so a loop
  // counting its own iterations runs this many past the job's end.
  int64_t steps_moved = 0;
  RoundPhases phases;
};

}  // namespace mend
