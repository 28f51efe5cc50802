// The table of every configuration key: type, range, meaning.

#include "mend/config.h"

namespace mend {
namespace {

constexpr double kMaxMs = 3'600'000;  // one hour

ConfigKey Int(std::string_view name, int64_t Config::*field, double min, double max,
              std::string_view help) {
  return ConfigKey{name, ConfigType::kInt, help, min, max, {}, field};
}
ConfigKey Real(std::string_view name, double Config::*field, double min, double max,
               std::string_view help) {
  return ConfigKey{name, ConfigType::kDouble, help, min, max, {}, field};
}
ConfigKey Bool(std::string_view name, bool Config::*field, std::string_view help) {
  return ConfigKey{name, ConfigType::kBool, help, 0, 1, {}, field};
}
ConfigKey Text(std::string_view name, std::string Config::*field, std::string_view help) {
  return ConfigKey{name, ConfigType::kString, help, 0, 0, {}, field};
}
template <typename E>
ConfigKey Enum(std::string_view name, E Config::*field, std::vector<std::string_view> choices,
               std::string_view help) {
  ConfigKey::EnumField access{[field](const Config& c) { return static_cast<int>(c.*field); },
                              [field](Config& c, int v) { c.*field = static_cast<E>(v); }};
  return ConfigKey{name, ConfigType::kEnum, help, 0, 0, std::move(choices), std::move(access)};
}

std::vector<ConfigKey> BuildKeys() {
  using C = Config;
  return {
      Text("job_id", &C::job_id,
           "Name of the job; learners and lighthouse must agree. Letters, digits and . _ : @ + "
           "-, at most 128 characters."),
      Text("token_file", &C::token_file,
           "File holding the job token (MEND_JOB_TOKEN overrides it; never on argv)."),
      Text("tls_cert_file", &C::tls_cert_file,
           "Lighthouse: PEM certificate; enables TLS together with tls_key_file."),
      Text("tls_key_file", &C::tls_key_file, "Lighthouse: PEM private key for tls_cert_file."),
      Text("tls_ca_file", &C::tls_ca_file,
           "Learner: PEM roots that sign the lighthouse's certificate; enables TLS."),
      Text("lighthouse", &C::lighthouse, "Learner: lighthouse gRPC address, HOST:PORT."),
      Text("bind", &C::bind, "Lighthouse: gRPC listen address, HOST:PORT (port 0 picks one)."),
      Text("http", &C::http,
           "Lighthouse: status page and /metrics address, HOST:PORT; empty turns it off."),
      Int("quorum_min_learners", &C::quorum_min_learners, 1, 100000,
          "Lighthouse: K: a round never closes with fewer members (the lighthouse's value "
          "holds; a learner's is not read)."),
      Int("grace_window_ms", &C::grace_window_ms, 0, 600000,
          "Lighthouse: G: once K learners joined, wait at most this long for the other healthy "
          "ones."),
      Bool(
          "grace_window_adaptive", &C::grace_window_adaptive,
          "Lighthouse: shrink the grace window to 2x the latest arrival after quorum in the last 8 "
          "rounds, "
          "within [grace_window_min_ms, grace_window_ms]."),
      Int("grace_window_min_ms", &C::grace_window_min_ms, 0, 600000,
          "Lighthouse: floor of the adaptive grace window."),
      Int("heartbeat_ms", &C::heartbeat_ms, 10, 60000,
          "Lighthouse: the learners' heartbeat period (it tells them at registration)."),
      Int("heartbeat_timeout_ms", &C::heartbeat_timeout_ms, 20, kMaxMs,
          "Lighthouse: a learner silent this long is dead and left out of rounds (it tells "
          "the learners at registration)."),
      Int("quorum_timeout_ms", &C::quorum_timeout_ms, 1, kMaxMs,
          "How long a learner waits for a round before it trains on. A synchronous learner "
          "stops waiting sooner, after a heartbeat timeout, once learners have left or died and "
          "fewer than the quorum's minimum are alive."),
      Int("lighthouse_wait_ms", &C::lighthouse_wait_ms, 0, kMaxMs,
          "Learner: how long its start (mend_init, mend train) waits for the lighthouse to answer "
          "its "
          "registration before it fails with UNAVAILABLE naming the address; long enough for "
          "learners started "
          "a little before their lighthouse. 0: do not wait (keep trying in the background). "
          "Outages after the "
          "start are ridden over as before."),
      Int("rpc_timeout_ms", &C::rpc_timeout_ms, 1, kMaxMs,
          "Deadline of every other call to the lighthouse."),
      Real("failslow_zscore_threshold", &C::failslow_zscore_threshold, 0.5, 1000,
           "Lighthouse: robust z-score of a learner's median step time above which it is flagged "
           "slow."),
      Int("failslow_window_steps", &C::failslow_window_steps, 3, 10000,
          "Lighthouse: inner-step times per learner in the fail-slow detector's sliding window."),
      Bool("rack_aware", &C::rack_aware,
           "Prefer a heal source in the learner's own rack, and merge a round where learners share "
           "a rack in three "
           "steps: inside each rack, across racks between one learner per rack, back inside the "
           "rack (cross-rack "
           "bytes fall by the learners per rack)."),
      Text("rack", &C::rack,
           "Learner: its failure domain (rack, zone). Letters, digits and . _ : @ + -, at most "
           "128 characters."),
      Int("group_size", &C::group_size, 1, 1024,
          "Learner: ranks per learner (the hosts of a rack, each training with DDP inside). Rank r "
          "owns "
          "slice r of the cross-rack exchange; every learner of a job has the same size."),
      Int("group_rank", &C::group_rank, 0, 1023,
          "Learner: this process's rank in its group (0 speaks for the group to the lighthouse)."),
      Int("group_generation", &C::group_generation, 0, 1000000000,
          "Learner: which start of its group this is; a launcher that restarts a group gives it a "
          "new one (torchrun's "
          "restart count is taken as well), so that the restarted ranks do not meet the old ones' "
          "keys."),
      Text("group_store", &C::group_store,
           "Learner: the group's own store, HOST:PORT, served by group rank 0 (the lighthouse's "
           "store service). "
           "Its ranks share round decisions there, so only group rank 0 talks to the lighthouse "
           "about rounds. "
           "Under torchrun the Python package serves it on rank 0 at dataplane_host and passes the "
           "address to "
           "the other ranks; mend train's launcher gives each group a free port. Empty: the "
           "lighthouse's store."),
      Enum("control_plane", &C::control_plane, {"grpc", "udp"},
           "Heartbeats and quorum joins over gRPC, or as signed UDP datagrams: with udp the "
           "lighthouse serves them on its bind port number as well, and learners use them when "
           "their lighthouse does (else gRPC, with a warning). Set it alike for the whole job. "
           "gRPC holds about 1,000 learners on a 2-core lighthouse (round decisions under 50 ms "
           "at p99); use udp above that (10,000 measured on 2 vCPUs shared with the simulated "
           "learners: p99 43.4-48.4 ms across 4 runs, a third of a core; see "
           "docs/benchmarks.md)."),
      Int("sync_period_steps", &C::sync_period_steps, 1, 1000000,
          "H: inner steps between outer rounds."),
      Bool("token_weighted_merge", &C::token_weighted_merge,
           "Weight pseudo-gradients by tokens processed (uniform when off)."),
      Real("outer_lr", &C::outer_lr, 0, 100, "Outer Nesterov learning rate (eta)."),
      Real("outer_momentum", &C::outer_momentum, 0, 0.9999, "Outer Nesterov momentum (mu)."),
      Int("outer_warmup_steps", &C::outer_warmup_steps, 0, 1000000000,
          "Outer warm-up: a round whose boundary step is at most this averages the learners' "
          "parameters (outer "
          "lr 1) and leaves the outer momentum at zero, so that the first steps' fast descent does "
          "not enter it; "
          "the outer Nesterov step takes over after. 0: off; set it to 0 for a job of a few "
          "rounds, above all a concurrent one whose rounds take most of H steps (a warm-up round "
          "has no provisional step, so applied late it is a stale average: docs/tuning.md)."),
      Int("fragments", &C::fragments, 1, 1024, "P: streaming fragments (layer l -> l mod P)."),
      Bool("concurrent_outer_step", &C::concurrent_outer_step,
           "Exchange in the background while inner steps continue (false: synchronous)."),
      Int("overlap_steps", &C::overlap_steps, 0, 1000,
          "tau: the most inner steps a round's result may arrive late; applied when it arrives "
          "(a group: at tau), waited for at tau. 0: the cap, rounds_in_flight x H / fragments - "
          "1, for a learner of one rank; for a group, tuned: ceil(1.25 x round time / inner-step "
          "time) + 1, capped."),
      Int("rounds_in_flight", &C::rounds_in_flight, 0, 1024,
          "The most concurrent rounds in flight at once, each of another fragment: a fragment's "
          "round may be applied up to H - 1 steps after its boundary while the other fragments' "
          "rounds run. 1: one at a time (tau below H / fragments). 0: as many as fragments."),
      Int("total_steps", &C::total_steps, 0, 1000000000000,
          "The job's length in inner steps; 0: unknown. Known, a concurrent job launches no round "
          "in its last "
          "rounds_in_flight x H / fragments steps: that round's result could only be taken up "
          "after "
          "the last step, "
          "so every learner would wait for it at shutdown. Every learner that reaches it ends with "
          "the final merge "
          "(final_merge). 0 in mend train (and mend demo) means --steps."),
      Bool("final_merge", &C::final_merge,
           "With total_steps known: at shutdown after the last step, one more round per fragment "
           "whose last round "
           "was before it averages the members' models (token-weighted, fp32, outer lr 1, momentum "
           "untouched), so "
           "every learner ends with the same final model, holding every learner's steps up to the "
           "end. false: each "
           "learner keeps its own last parameters."),
      Bool("train_through_lighthouse_outage", &C::train_through_lighthouse_outage,
           "Concurrent mode: do not wait at tau for a round while the lighthouse is unreachable "
           "(a round at its rendezvous ends); train on and join when it is back (learners drift "
           "apart meanwhile)."),
      Enum("outer_apply", &C::outer_apply, {"eager", "exact", "mix"},
           "How a late update meets local progress. eager: at the boundary the learner takes the "
           "outer step with its own pseudo-gradient for the average, then the round's result "
           "replaces it, keeping what was trained since exactly once; exact: no provisional "
           "step; mix: theta_i <- alpha theta_i + (1 - alpha) theta_g."),
      Real("mixing_alpha", &C::mixing_alpha, 0, 1,
           "alpha for outer_apply = mix: theta_i <- alpha theta_i + (1 - alpha) theta_g."),
      Bool("sync_buffers", &C::sync_buffers,
           "Python: keep the model's buffers (BatchNorm's running statistics) the same on every "
           "learner: at every round the state_dict's floating-point buffers are averaged over the "
           "members with the round's weights and integer ones taken from its first member (as DDP "
           "broadcasts them); non-persistent buffers (derived, such as inv_freq) are left alone."),
      Bool("exchange_frozen_parameters", &C::exchange_frozen_parameters,
           "Front ends: also exchange, merge and checkpoint the parameters that do not require "
           "grad when mend_init runs (a LoRA model's base weights, frozen embeddings); by "
           "default they are left out: each learner keeps its own, and a round sends only the "
           "trainable ones."),
      Bool("desloc", &C::desloc, "DES-LOC: also average the inner AdamW moments."),
      Bool("heal_inner_optimizer", &C::heal_inner_optimizer,
           "A healing learner also takes its source's inner Adam/AdamW moments and step count "
           "(off by default: docs/tuning.md says why)."),
      Int("momentum_sync_period_steps", &C::momentum_sync_period_steps, 0, 100000000,
          "K_u: first-moment averaging period; 0 means 3 x sync_period_steps. Given without "
          "desloc in one source (file, environment, keywords, --set), it turns DES-LOC on."),
      Int("second_moment_sync_period_steps", &C::second_moment_sync_period_steps, 0, 100000000,
          "K_v: second-moment averaging period; 0 means 6 x sync_period_steps. Turns DES-LOC "
          "on as momentum_sync_period_steps does."),
      Enum("codec", &C::codec, {"fp32", "bf16", "int8", "int4", "topk"},
           "Encoding of pseudo-gradients on the wire."),
      Int("codec_block_size", &C::codec_block_size, 8, 65536,
          "Values per absmax scale for int8 and int4."),
      Int("topk_chunk_size", &C::topk_chunk_size, 64, 1 << 20, "Values per top-k chunk."),
      Int("topk_k", &C::topk_k, 1, 1 << 20, "Values kept per top-k chunk."),
      Real("error_feedback_beta", &C::error_feedback_beta, 0, 1,
           "SparseLoCo error-feedback decay beta."),
      Int("collective_timeout_ms", &C::collective_timeout_ms, 1, kMaxMs,
          "Deadline of every data-plane collective."),
      Int("connect_timeout_ms", &C::connect_timeout_ms, 1, kMaxMs,
          "How long a round's members wait for their connections once all have shown up."),
      Int("round_threads", &C::round_threads, 0, 256,
          "Threads of a round's arithmetic (the boundary snapshot, the outer step and the "
          "parameters' update, in 1 MiB chunks), the calling thread included (a synchronous "
          "round over parameters in place makes its snapshot in its merge, from its own thread); "
          "as many seal and open the secure data plane's pieces, lane by lane. "
          "0: a quarter of the host's processors, 1 to 8."),
      Enum("host_staging", &C::host_staging, {"auto", "always"},
           "Python: which parameters go through float32 host buffers at round boundaries. auto: "
           "those that are "
           "not float32 on the CPU (a GPU's, bfloat16, float16; pinned buffers for a GPU); always: "
           "every one "
           "(CPU float32 parameters are otherwise used in place)."),
      Text("dataplane_host", &C::dataplane_host,
           "Learner: the address the other learners reach its data plane at: an address or name of "
           "this host (checked at the learner's start)."),
      Bool(
          "dataplane_encrypt", &C::dataplane_encrypt,
          "With a job token (always, on a lighthouse's job), every data-plane byte (rounds, heals, "
          "the final merge, a group's own exchange) is authenticated and encrypted with "
          "AES-256-GCM under keys derived from the token for each round and member set. false "
          "sends the data plane in the clear (every learner must agree). See docs/architecture.md, "
          "Security."),
      Int("link_latency_ms", &C::link_latency_ms, 0, 600000,
          "Link emulation: added to every data-plane operation (0: off)."),
      Real("link_rate_mbit", &C::link_rate_mbit, 0, 1e6,
           "Link emulation: each learner's send rate in Mbit/s (0: unlimited)."),
      Text("checkpoint_dir", &C::checkpoint_dir,
           "Directory of the job's checkpoints (global state), named ckpt-<round, 12 digits>.mend; "
           "resume finds "
           "the newest of those (a file of another name: resume_from). Empty turns them off."),
      Int("checkpoint_every_rounds", &C::checkpoint_every_rounds, 0, 1000000,
          "Rank 0 of every round whose id is a multiple of this writes one (0: on demand only)."),
      Int("checkpoint_keep", &C::checkpoint_keep, 1, 1000, "Checkpoints kept in checkpoint_dir."),
      Bool("checkpoint_authenticate", &C::checkpoint_authenticate,
           "With a job token (always, on a lighthouse's job), checkpoints and exported outer "
           "state carry an HMAC-SHA256 under a key derived from the token, and a learner reads "
           "only those its token authenticates: a tampered or foreign one is refused like a "
           "damaged one. false writes and reads them with a SHA-256 only (every learner must "
           "agree). See docs/architecture.md, Security."),
      Text("resume_from", &C::resume_from,
           "At start, resume from this checkpoint file (any name: runtime.save_checkpoint's), or "
           "fail naming it; "
           "takes precedence over checkpoint_dir and resume. Empty: off."),
      Bool("resume", &C::resume,
           "At start, load the newest checkpoint in checkpoint_dir that verifies."),
      Text("diagnostics_dir", &C::diagnostics_dir,
           "Directory for per-step and per-round JSONL; empty turns it off."),
      Enum("log_level", &C::log_level, {"trace", "debug", "info", "warn", "error", "off"},
           "Log verbosity."),
  };
}

}  // namespace

const std::vector<ConfigKey>& ConfigKeys() {
  static const std::vector<ConfigKey>* keys = new std::vector<ConfigKey>(BuildKeys());
  return *keys;
}

}  // namespace mend
