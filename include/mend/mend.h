/* mend's C ABI: everything a front end needs to run a learner of a mend job,
 * an embedded lighthouse, or to read a lighthouse's status, in plain C.
 *
 * libmend.so implements it without LibTorch and exports only the mend_*
 * symbols of this header; its C++ dependencies (gRPC, protobuf, abseil,
 * Gloo, spdlog, fmt) are linked in with hidden symbols, so that it loads into
 * any process (one with another torch, protobuf or Gloo) without either side
 * interposing on the other. The Python package drives it with ctypes.
 *
 * Conventions.
 *  - Every call that can fail returns a mend_status: MEND_OK, or one of the
 *    canonical codes (equal to mend's, abseil's and gRPC's codes). The
 *    message of the last failed call on the calling thread is
 *    mend_last_error().
 *  - Handles are opaque; each has a function that frees it. A handle may be
 *    used from any thread, one call at a time (a mend_learner: see there).
 *  - Strings a call returns through a `char**` are the caller's: free them
 *    with mend_string_free(). `const char*` results are owned by the handle
 *    they came from and valid as long as it is.
 *  - Buffers passed to mend_learner_create stay the caller's: mend reads and
 *    writes them in place and never frees them; they must outlive the learner.
 *  - Waits have deadlines: from the configuration (rpc_timeout_ms,
 *    quorum_timeout_ms, connect_timeout_ms, ...) or from the call.
 */
#ifndef MEND_MEND_H_
#define MEND_MEND_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this interface; mend_abi_version() returns the one the
 * loaded library implements. A front end refuses a library of another one. */
#define MEND_ABI_VERSION 13

typedef enum mend_status {
  MEND_OK = 0,
  MEND_CANCELLED = 1,
  MEND_UNKNOWN = 2,
  MEND_INVALID_ARGUMENT = 3,  /* bad input; the message names the key or field and the value */
  MEND_DEADLINE_EXCEEDED = 4, /* a wait ran past its timeout */
  MEND_NOT_FOUND = 5,         /* e.g. an unknown configuration key (the message suggests one) */
  MEND_ALREADY_EXISTS = 6,
  MEND_PERMISSION_DENIED = 7,
  MEND_RESOURCE_EXHAUSTED = 8,
  MEND_FAILED_PRECONDITION = 9, /* fix the state first (e.g. a call after shutdown, or in a fork) */
  MEND_ABORTED = 10,            /* interrupted, or membership changed under the call */
  MEND_OUT_OF_RANGE = 11,
  MEND_UNIMPLEMENTED = 12,
  MEND_INTERNAL = 13,
  MEND_UNAVAILABLE = 14,     /* a peer or service cannot be reached */
  MEND_DATA_LOSS = 15,       /* a damaged checkpoint or state */
  MEND_UNAUTHENTICATED = 16, /* a missing or wrong job token */
  /* Not an error: mend_learner_step or mend_learner_wait returned at its
   * wait_ms while the step still waits for a round; call mend_learner_wait. */
  MEND_PENDING = 100
} mend_status;

uint32_t mend_abi_version(void);
/* The package version, e.g. "0.1.0". */
const char* mend_version(void);
/* The message of the last call on this thread that did not return MEND_OK or
 * MEND_PENDING; "" before any. Valid until the thread's next mend call. */
const char* mend_last_error(void);
/* "OK", "INVALID_ARGUMENT", ... ("PENDING" for MEND_PENDING). */
const char* mend_status_name(mend_status status);
void mend_string_free(char* text);
void mend_bytes_free(void* bytes);

/* Logging to standard error at `level` (trace, debug, info, warn, error,
 * off), each line tagged with `name`. Learners and lighthouses started
 * through this interface set it from their configuration's log_level. */
mend_status mend_set_logging(const char* level, const char* name);
/* Writes `message` to that log at `level` (for a front end's own lines). */
mend_status mend_log(const char* level, const char* message);

/* ---- Configuration: the key table of README's configuration section. ---- */

typedef struct mend_config mend_config;

/* Every key at its default. */
mend_status mend_config_new(mend_config** out);
mend_status mend_config_copy(const mend_config* config, mend_config** out);
void mend_config_free(mend_config* config);
/* Sets `key` from its text form ("2000", "true", "int4", ...), with the
 * checks of `mend --set`: INVALID_ARGUMENT naming the key, the value, the
 * allowed range and `source` (NULL: "mend_config_set"); NOT_FOUND for an
 * unknown key, naming the closest known key. */
mend_status mend_config_set(mend_config* config, const char* key, const char* value,
                            const char* source);
/* Applies the top-level keys of a TOML file. Here, in
 * mend_config_apply_environment and in mend_config_set_json, a DES-LOC moment
 * period (momentum_sync_period_steps, second_moment_sync_period_steps) given
 * without desloc turns DES-LOC on. */
mend_status mend_config_load_file(mend_config* config, const char* path);
/* Applies every MEND_<KEY> variable of the process environment (an unknown
 * MEND_ variable is an error, except MEND_JOB_TOKEN and the front ends' own
 * MEND_LEARNER_ID and MEND_LIBRARY). */
mend_status mend_config_apply_environment(mend_config* config);
/* The rules that tie keys together (e.g. heartbeat_timeout_ms >= 2 *
 * heartbeat_ms). Learner and lighthouse starts check them too. */
mend_status mend_config_check(const mend_config* config);
/* The value of `key` as text mend_config_set accepts. */
mend_status mend_config_get(const mend_config* config, const char* key, char** value);
/* The whole configuration as TOML that mend_config_load_file accepts. */
mend_status mend_config_to_toml(const mend_config* config, char** toml);
/* Many keys at once (ABI 6): `json` is an object of key -> text, each set as
 * mend_config_set sets it, in the object's order, with `source` followed by
 * the key in an error ("keyword" -> "keyword outer_lr"; NULL:
 * "mend_config_set_json"). All or nothing: on an error (a key that is not a
 * string of text, an unknown key, a bad value) `config` is left as it was. */
mend_status mend_config_set_json(mend_config* config, const char* json, const char* source);
/* Every key's text (what mend_config_get gives) as one JSON object, in
 * documentation order (ABI 6). */
mend_status mend_config_to_json(const mend_config* config, char** json);
/* The key table as JSON: [{"name", "type" (int|float|bool|str|enum),
 * "default", "help", "min", "max" (numbers only), "choices"}...], in
 * documentation order. */
mend_status mend_config_keys_json(char** json);
/* The known key closest to `unknown` ("" when none is close). */
mend_status mend_config_suggest_key(const char* unknown, char** suggestion);
/* The job token: MEND_JOB_TOKEN when set, else the contents of token_file. */
mend_status mend_config_read_token(const mend_config* config, char** token);
/* A setting every learner of the job must have the same, beside the shared
 * configuration keys (ABI 10): a learner started from `config` sends
 * `key` = `value` when it registers, and one whose value differs from the
 * job's alive learners' (or that sends none where they do) is refused with
 * INVALID_ARGUMENT naming the key, both values and where the space-separated
 * items after the value's first ": " first differ. The Python package sends
 * the digest of a model's frozen parameters this way. `key`: letters,
 * digits and '_', not a configuration key; key and value together at most
 * 500 characters; setting a key again replaces its value. */
mend_status mend_config_add_job_setting(mend_config* config, const char* key, const char* value);

/* ---- Lighthouse (the job's coordinator), embedded in this process. ---- */

typedef struct mend_lighthouse mend_lighthouse;

/* Serves the configuration's `bind` (port 0 picks a free port) and `http`
 * (empty: no HTTP side) with `token`. */
mend_status mend_lighthouse_start(const mend_config* config, const char* token,
                                  mend_lighthouse** out);
/* The gRPC address learners use as their `lighthouse` key, with the port bound. */
const char* mend_lighthouse_address(const mend_lighthouse* lighthouse);
/* The HTTP address (status page, /status.json, /metrics); "" without one. */
const char* mend_lighthouse_http_address(const mend_lighthouse* lighthouse);
/* The status document (what /status.json serves); 0 for a limit: all. */
mend_status mend_lighthouse_status_json(const mend_lighthouse* lighthouse, uint32_t max_learners,
                                        uint32_t max_rounds, char** json);
/* Stops serving (waiting calls fail with UNAVAILABLE) and frees it. */
void mend_lighthouse_stop(mend_lighthouse* lighthouse);

/* The status document of the lighthouse at `address` (HOST:PORT), read over
 * gRPC within `timeout_ms`. `ca_file`: PEM roots for TLS, NULL or "" for
 * plaintext. */
mend_status mend_status_json(const char* address, const char* token, const char* ca_file,
                             uint32_t max_learners, uint32_t max_rounds, int64_t timeout_ms,
                             char** json);

/* ---- A learner group's store, served by group rank 0. ---- */

typedef struct mend_group_store mend_group_store;

/* Serves the store of a learner group (group_size > 1) at `address`
 * (HOST:PORT; port 0 picks a free one). Group rank 0 calls it before
 * mend_learner_create, passes mend_group_store_address() to the other ranks
 * (through the launcher: torchrun's store, a collective), and every rank,
 * rank 0 included, sets it as `group_store`. Keep it until the learner is
 * freed. */
mend_status mend_group_store_serve(const mend_config* config, const char* token,
                                   const char* address, mend_group_store** out);
const char* mend_group_store_address(const mend_group_store* store);
void mend_group_store_stop(mend_group_store* store);

/* ---- A learner over caller-owned buffers. ---- */

/* One named fp32 parameter. Every learner of a job passes the same names
 * and sizes in the same order (it decides the fragments and the names in
 * checkpoints). */
typedef struct mend_buffer {
  const char* name;
  float* data; /* numel values, read and written in place */
  uint64_t numel;
  const int64_t* shape; /* ndim sizes whose product is numel; NULL with ndim 0 means {numel} */
  uint32_t ndim;
} mend_buffer;

typedef struct mend_stats {
  uint64_t steps;                 /* the job's step as this learner knows it */
  uint64_t rounds_started;        /* rounds launched at a fragment boundary */
  uint64_t rounds;                /* rounds this learner completed */
  uint64_t failed_rounds;         /* rounds that failed or formed without it */
  uint64_t passed_over;           /* rounds for its boundary that closed without it */
  uint64_t heals;                 /* times it took the global state from a peer */
  uint64_t moment_syncs;          /* DES-LOC moment averagings */
  uint64_t bytes_sent;            /* data-plane bytes of the merges */
  uint64_t cross_rack_bytes_sent; /* data-plane bytes to other racks, heals included */
  uint64_t last_round_id;
  uint64_t checkpoints; /* written by this learner */
  uint64_t checkpoint_failures;
  uint64_t resumed_from_round;    /* the checkpoint's round when it resumed, else 0 */
  uint64_t overlap_steps;         /* tau of the latest round launched */
  uint64_t parameter_copies;      /* fragment-sized copies to or from the buffers (rounds only) */
  uint64_t round_waits;           /* rounds a step waited for (ABI 2) */
  uint64_t most_rounds_in_flight; /* the most rounds in flight at once (ABI 2) */
  /* synchronous rounds whose pseudo-gradient was made as their merge
   * reached each piece, not at the boundary (ABI 7) */
  uint64_t rounds_made_in_merge;
  /* bytes this rank sent to its group's other ranks on mend's own
   * connections inside the rack: after each round the slices of what
   * several ranks hold (a replica's whole model; none of a sharded one's
   * shards), and the ranks' agreements (ABI 11) */
  uint64_t group_bytes_sent;
  /* of those, the bytes of the model's state alone: the slices shared
   * after each round (and of the moments), without the agreements, whose
   * count depends on how long a quorum takes to form (ABI 13) */
  uint64_t group_state_bytes_sent;
} mend_stats;

typedef struct mend_learner mend_learner;

/* Starts a learner: connects to config's `lighthouse` (retried in the
 * background if it is not up yet), registers as `learner_id` (for a group:
 * every rank passes the same id), and attaches to `parameters`. `start_step`
 * is the inner steps already done (0: a fresh start). May read and write the
 * buffers (a resumed checkpoint, a group's rank 0 parameters): see
 * MEND_STEP_WROTE. The group rank and size are config's group_rank and
 * group_size. */
mend_status mend_learner_create(const mend_config* config, const char* token,
                                const char* learner_id, const mend_buffer* parameters, size_t count,
                                uint64_t start_step, mend_learner** out);
/* mend_learner_create for a model sharded over a group's ranks (FSDP2,
 * tensor parallelism): each rank passes its own pieces of every parameter
 * (the same names, in the same order, on every rank; a piece may be
 * empty), and `replica_keys[i]` for parameter i: the ranks that pass the
 * same key hold the same values of it. A shard's key is its rank's own; a
 * piece several ranks hold (a Replicate() placement, a parameter tensor
 * parallelism leaves whole) has the same key on each. Each rank exchanges
 * its shards and a slice of what it shares with the same rank of every
 * other learner, and after a round only those shared slices travel inside
 * the group. Keys all 0 (or NULL): every rank holds the whole model, as
 * mend_learner_create. (ABI 11) */
mend_status mend_learner_create_sharded(const mend_config* config, const char* token,
                                        const char* learner_id, const mend_buffer* parameters,
                                        const uint64_t* replica_keys, size_t count,
                                        uint64_t start_step, mend_learner** out);
/* The inner optimizer's Adam moments of parameter `index` (numel fp32 values
 * each, caller-owned, read and written in place at rounds), for desloc and
 * heal_inner_optimizer; hand them over once the optimizer has them. NULL
 * for both: none (yet). */
mend_status mend_learner_set_moments(mend_learner* learner, size_t index, float* first,
                                     float* second);

/* The inner optimizer's Adam betas and its step count (Adam's t, the
 * exponent of its bias correction; caller-owned, NULL: none), for desloc
 * and heal_inner_optimizer: the betas weigh what a round brings against the
 * progress made since its boundary, and a heal writes the source's step
 * count into *step with its moments, so that the healed learner takes the
 * same next step as the source. *step is read at a round's boundary and
 * written when a heal is applied (MEND_STEP_READS / MEND_STEP_WROTE cover
 * it). Without this call the betas are torch's defaults (0.9, 0.999) and
 * no step count is kept. Betas outside [0, 1) are INVALID_ARGUMENT. (ABI 3) */
mend_status mend_learner_set_optimizer(mend_learner* learner, double beta1, double beta2,
                                       uint64_t* step);

/* The model's buffers (BatchNorm's running statistics), synchronised at
 * every round so that every member ends it with the same values: with
 * MEND_BUFFERS_AVERAGED averaged over the round's members with its weights
 * (floating-point buffers), with MEND_BUFFERS_FROM_FIRST_MEMBER taken from
 * its first member (integer buffers, carried as floats: exact below 2^24).
 * Caller-owned like the parameters; read at a round's boundary and written
 * when it is applied (MEND_STEP_READS / MEND_STEP_WROTE cover them). Before
 * the first step (FAILED_PRECONDITION after); once per kind. */
#define MEND_BUFFERS_AVERAGED 0u
#define MEND_BUFFERS_FROM_FIRST_MEMBER 1u
mend_status mend_learner_set_buffers(mend_learner* learner, const mend_buffer* buffers,
                                     size_t count, uint32_t kind);

/* What the next step does (mend_learner_plan_step), and what the last call
 * did (mend_learner_last_flags). */
#define MEND_STEP_MAY_WAIT 1u  /* it starts or applies a round, and may wait for one */
#define MEND_STEP_READS 2u     /* it may read the parameter and moment buffers */
#define MEND_STEP_WROTE 4u     /* it wrote the parameter or moment buffers */
#define MEND_STEP_MAY_WRITE 8u /* it may write them (ABI 8) */
/* it launches a concurrent round due at the next step (tau = 1) (ABI 9) */
#define MEND_STEP_DUE_NEXT 16u

/* Fixes the plan of the next mend_learner_step and returns it (MAY_WAIT,
 * READS, MAY_WRITE, DUE_NEXT). A front end that stages its parameters (a GPU's,
 * through host buffers) copies them into the buffers before a step that
 * READS, and back after any call whose mend_learner_last_flags() has
 * WROTE; with no plan, a step behaves as if planned at its start. A step
 * that READS without MAY_WRITE (a concurrent round's launch with nothing in
 * flight and no provisional step) only reads the buffers: the front end
 * may make that mend_learner_step later, before the parameters change (the
 * next optimizer step), once its copies into the buffers are done; it
 * writes nothing then. With DUE_NEXT that round would then overlap no
 * step (it is waited for at the next one): better made at once. Cheap:
 * call it every step. */
uint32_t mend_learner_plan_step(mend_learner* learner);
/* One inner step done, with the tokens it processed: at a fragment boundary
 * it starts a round, and a round's result is applied at its apply step,
 * waiting for it there. Returns when the step is done, or MEND_PENDING once
 * `wait_ms` passed (< 0: no limit) while it still waits for a round; then
 * only mend_learner_wait and mend_learner_interrupt may be called until one
 * returns something else. Errors are what the caller must act on (a fatal
 * refusal, a broken group); failed rounds are counted and survived. */
mend_status mend_learner_step(mend_learner* learner, uint64_t tokens, int64_t wait_ms);
mend_status mend_learner_wait(mend_learner* learner, int64_t wait_ms);
/* Calls off the round being waited for (that step returns ABORTED) and
 * every later join; for leaving the job on a signal. Any thread. */
void mend_learner_interrupt(mend_learner* learner);
/* MEND_STEP_WROTE when the last create, step, import or shutdown wrote the buffers. */
uint32_t mend_learner_last_flags(const mend_learner* learner);

mend_status mend_learner_stats(const mend_learner* learner, mend_stats* out);

/* Where the rounds' time went: seconds summed over the rounds this learner
 * completed; work on several threads adds up (ABI 4). */
typedef struct mend_round_phases {
  double snapshot;            /* the boundary's pseudo-gradient, on the calling thread */
  double join;                /* the quorum, the rendezvous and the members' connections */
  double agree_or_heal;       /* comparing the members' states, or healing */
  double encode;              /* the codec's encoding */
  double transfer;            /* waiting for the network */
  double reduce;              /* summing and decoding the members' pieces */
  double outer_step;          /* the outer step and the buffers' update, on the calling thread */
  double moments_and_buffers; /* DES-LOC's moments, sync_buffers */
  double round;               /* launch to the end of the round's thread (wall) */
} mend_round_phases;
mend_status mend_learner_round_phases(const mend_learner* learner, mend_round_phases* out);
int mend_learner_fragments(const mend_learner* learner);
/* Staging by fragment (ABI 5). Parameter `index` belongs to fragment
 * index mod fragments; mend_learner_parameter_fragment says which (-1: no
 * such parameter). mend_learner_step_fragments fills `out` (one byte per
 * fragment, `count` = mend_learner_fragments) with 1 where
 *   MEND_FRAGMENTS_PLANNED  the next step may read or write that fragment's
 *                           parameters, as mend_learner_plan_step fixed it
 *                           (every fragment when no plan is fixed);
 *   MEND_FRAGMENTS_READ     the last create, step, import or shutdown read them;
 *   MEND_FRAGMENTS_WROTE    ... wrote them.
 * A front end that stages its parameters copies in only the planned
 * fragments before a step that READS, and copies back only those it WROTE.
 * A concurrent round touches its own fragment (at its launch and when it is
 * taken up); a heal, a synchronous round whose outcome is not known before
 * the step, and a group's rounds touch every fragment. */
#define MEND_FRAGMENTS_PLANNED 0u
#define MEND_FRAGMENTS_READ 1u
#define MEND_FRAGMENTS_WROTE 2u
int mend_learner_parameter_fragment(const mend_learner* learner, uint64_t index);
mend_status mend_learner_step_fragments(const mend_learner* learner, uint32_t which, uint8_t* out,
                                        uint64_t count);
/* The global parameters of `fragment` as of the last round (its
 * parameters' values in order): *count is set to their number; up to
 * `capacity` are copied into `out` (NULL with 0 asks for the count). */
mend_status mend_learner_global_state(const mend_learner* learner, int fragment, float* out,
                                      uint64_t capacity, uint64_t* count);
/* The outer state (global parameters and outer momentum of every fragment,
 * by parameter name, with the round and step) as bytes in mend's checkpoint
 * format; free with mend_bytes_free. For a group a collective: every rank
 * calls it at the same step; rank 0 gets the whole model, the others 0
 * bytes. */
mend_status mend_learner_export_state(mend_learner* learner, void** bytes, uint64_t* size);
/* Makes exported bytes (or a checkpoint file's) the global state, between
 * rounds (FAILED_PRECONDITION while one is in flight); INVALID_ARGUMENT
 * naming a tensor that does not fit the model, DATA_LOSS for damaged bytes.
 * For a group every rank imports the same bytes. With flags 0 the state
 * also becomes the parameters (MEND_STEP_WROTE) and the step is the state's
 * (the step of its newest round). With MEND_IMPORT_KEEP_PARAMETERS the
 * parameters are left as they are (the caller restored them, e.g. from the
 * model's own checkpoint) and the exporting learner's step, tokens since its
 * rounds and error feedback come back with the state: the job goes on
 * exactly where the export left it (exported bytes only). */
#define MEND_IMPORT_KEEP_PARAMETERS 1u
mend_status mend_learner_import_state(mend_learner* learner, const void* bytes, uint64_t size,
                                      uint32_t flags);
/* This rank's own outer state, for checkpoints of a sharded model that
 * each rank saves its part of (torch.distributed.checkpoint) (ABI 12):
 * the global parameters and outer momentum of every parameter this rank
 * holds, in the order its parameters were given at creation, into `global`
 * and `momentum` (`values` each: mend_learner_own_values' count, else
 * INVALID_ARGUMENT); `*described` gets the state's description (round,
 * steps, tokens) as checkpoint bytes without tensors, to free with
 * mend_bytes_free. For a group a collective on every rank: the values of
 * parameters that ranks share are gathered among them, and every rank
 * gets its own. */
mend_status mend_learner_own_values(const mend_learner* learner, uint64_t* values);
mend_status mend_learner_export_own_state(mend_learner* learner, float* global, float* momentum,
                                          uint64_t values, void** described, uint64_t* size);
/* The export's three back, between rounds (FAILED_PRECONDITION while one is
 * in flight), at the same step on every rank of a group: the parameters
 * stay the caller's, and the exporting learner's step and tokens since its
 * rounds come back (as mend_learner_import_state with
 * MEND_IMPORT_KEEP_PARAMETERS). The values may have been resharded from a
 * checkpoint of another rank count: each rank's are those it holds now. */
mend_status mend_learner_import_own_state(mend_learner* learner, const float* global,
                                          const float* momentum, uint64_t values,
                                          const void* described, uint64_t size);
/* Writes the global state to `path` now, atomically (a checkpoint file);
 * for a group a collective, written by rank 0. */
mend_status mend_learner_save_checkpoint(mend_learner* learner, const char* path);
/* Finishes the round in flight and leaves the job. Idempotent. */
mend_status mend_learner_shutdown(mend_learner* learner);
/* Frees the learner; without shutdown first, the round in flight is called
 * off and dropped. In a forked child (where the learner's threads do not
 * exist) it frees nothing and returns. */
void mend_learner_free(mend_learner* learner);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MEND_MEND_H_ */
