// mend::Config: every knob of a mend job, with its default, its allowed range
// and where it came from.
//
// Values are layered, later sources winning:
//   defaults < config file (TOML) < environment (MEND_<KEY>) < command-line flags.
// Every value is checked when it is set; a bad one is an error that names the
// key, the value, the allowed range and the source. An unknown key is an error
// that suggests the closest known key.
//
// Thread-safety: Config is a plain value. The key table is immutable.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "mend/agent_options.h"
#include "mend/config_enums.h"
#include "mend/status.h"

namespace mend {

struct Config {
  // Job and security.
  std::string job_id = "mend";
  std::string token_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_ca_file;

  // Lighthouse (coordinator).
  std::string lighthouse = "127.0.0.1:29510";
  std::string bind = "127.0.0.1:29510";
  std::string http = "127.0.0.1:29511";
  int64_t quorum_min_learners = 2;
  int64_t grace_window_ms = 2000;
  bool grace_window_adaptive = true;
  int64_t grace_window_min_ms = 50;
  int64_t heartbeat_ms = 100;
  int64_t heartbeat_timeout_ms = 2000;
  int64_t quorum_timeout_ms = 60000;
  int64_t rpc_timeout_ms = 5000;
  // How long a learner's start waits for the lighthouse to answer (0: not).
  int64_t lighthouse_wait_ms = 30000;
  double failslow_zscore_threshold = 3.5;
  int64_t failslow_window_steps = 16;
  bool rack_aware = false;
  std::string rack;
  // A learner as a group of ranks (one per host of a rack): how many, and
  // which one this process is; group rank 0 speaks for the group.
  int64_t group_size = 1;
  int64_t group_rank = 0;
  int64_t group_generation = 0;
  // The group's own store (HOST:PORT, served by group rank 0): where its
  // ranks share round decisions and meet. Empty: the lighthouse's store.
  std::string group_store;
  ControlPlane control_plane = ControlPlane::kGrpc;

  // Outer synchronizer.
  int64_t sync_period_steps = 100;
  bool token_weighted_merge = true;
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  // Rounds whose boundary step is at most this average the learners'
  // parameters (outer lr 1) and leave the outer momentum at zero; 0: off.
  int64_t outer_warmup_steps = 150;
  int64_t fragments = 1;
  bool concurrent_outer_step = true;
  int64_t overlap_steps = 0;  // 0: tuned from the measured round and step times
  // The most rounds in flight at once, of different fragments; 0: one per
  // fragment (tau then reaches H - 1 instead of H / fragments - 1).
  int64_t rounds_in_flight = 0;
  int64_t round_threads = 0;  // 0: ThreadPool::DefaultThreads()
  // The job's length in inner steps (0: unknown). Known, a concurrent job
  // launches no round in its last fragment period, whose result could only
  // be taken up after the last step, and the job ends with a final merge.
  int64_t total_steps = 0;
  // With total_steps known: a last round at shutdown averages the members' models.
  bool final_merge = true;
  bool train_through_lighthouse_outage = false;
  OuterApply outer_apply = OuterApply::kEager;
  double mixing_alpha = 0.5;
  // Front ends: the model's buffers kept the same on every learner at every round.
  bool sync_buffers = true;
  // Front ends: parameters with requires_grad = false at mend_init (a LoRA
  // model's base weights, frozen embeddings) exchanged too (else left out).
  bool exchange_frozen_parameters = false;
  bool desloc = false;
  bool heal_inner_optimizer = false;
  int64_t momentum_sync_period_steps = 0;
  int64_t second_moment_sync_period_steps = 0;

  // Codec and data plane.
  CodecKind codec = CodecKind::kFp32;
  int64_t codec_block_size = 64;
  int64_t topk_chunk_size = 4096;
  int64_t topk_k = 64;
  double error_feedback_beta = 0.95;
  int64_t collective_timeout_ms = 30000;
  int64_t connect_timeout_ms = 5000;
  // Front ends: which parameters go through host buffers (auto: those that
  // are not CPU float32; always: all).
  HostStaging host_staging = HostStaging::kAuto;
  std::string dataplane_host = "127.0.0.1";
  // With a job token, every data-plane byte is sealed (AES-256-GCM under
  // keys derived from the token); false sends it in the clear.
  bool dataplane_encrypt = true;
  int64_t link_latency_ms = 0;
  double link_rate_mbit = 0;

  // Checkpoints.
  std::string checkpoint_dir;
  int64_t checkpoint_every_rounds = 0;
  int64_t checkpoint_keep = 3;
  // With a job token, checkpoints carry an HMAC-SHA256 keyed from it and a
  // learner reads only those its token authenticates; false: SHA-256 only.
  bool checkpoint_authenticate = true;
  bool resume = true;
  // A checkpoint file to resume from (any name), before checkpoint_dir.
  std::string resume_from;

  // Diagnostics.
  std::string diagnostics_dir;
  LogLevel log_level = LogLevel::kInfo;
};

enum class ConfigType { kInt, kDouble, kBool, kString, kEnum };

// One row of the key table.
struct ConfigKey {
  std::string_view name;
  ConfigType type;
  std::string_view help;
  // Inclusive bounds for kInt and kDouble.
  double min = 0;
  double max = 0;
  // Allowed values for kEnum, in the order of the enum's values.
  std::vector<std::string_view> choices;
  // An enum key's member, as the index of its value in `choices`.
  struct EnumField {
    std::function<int(const Config&)> get;
    std::function<void(Config&, int)> set;
  };
  std::variant<int64_t Config::*, double Config::*, bool Config::*, std::string Config::*,
               EnumField>
      field;
};

// Every known key, in documentation order.
const std::vector<ConfigKey>& ConfigKeys();

// nullptr when `name` is not a key.
const ConfigKey* FindConfigKey(std::string_view name);

// The known key closest to `unknown` by edit distance, or "" when none is close.
std::string SuggestConfigKey(std::string_view unknown);
// A key that was replaced by another: setting it is refused with a message
// that names what to set instead (udp_control and control_transport).
bool IsRetiredConfigKey(std::string_view name);

// Parses `text` for `key` and stores it in `config`. `source` names where the
// text came from ("flag --min-learners", "env MEND_HEARTBEAT_MS", "a.toml:3")
// and appears in the error.
[[nodiscard]] Status SetConfigValue(Config& config, std::string_view key, std::string_view text,
                                    std::string_view source);

// The value of `key` in `config` as the text SetConfigValue would accept.
std::string FormatConfigValue(const Config& config, const ConfigKey& key);

// "key=value" of every key the learners of one job must agree on, sorted
// by key: what shapes the rounds (sync_period_steps, fragments,
// total_steps, final_merge), what they exchange and how (the codec and the
// parameters its choice reads, exchange_frozen_parameters, sync_buffers,
// rack_aware, DES-LOC's periods when it is on) and the outer step that
// every member applies to the same global state (token_weighted_merge,
// outer_lr, outer_momentum, outer_warmup_steps). A learner registers them;
// the lighthouse refuses one whose settings differ from the alive
// learners', naming the keys. Keys that only pace a learner
// (concurrent_outer_step, overlap_steps, round_threads, ...) may differ.
std::vector<std::string> SharedSettings(const Config& config);

// Checks every value's range and the rules that tie keys together
// (e.g. heartbeat_timeout_ms >= 2 * heartbeat_ms). Its one caller is
// ValidConfig::Check.
[[nodiscard]] Status CheckConfig(const Config& config);

// A configuration that passed CheckConfig, and that nothing changes after:
// what the parts take (LighthouseServer::Start, LearnerAgent::Start, the
// round driver), so that a configuration is checked once, where a front end
// loads or builds it (LoadConfig, the C ABI's learner and lighthouse, mend
// train's job), not again by each part it reaches. It reads as the Config
// it holds. The parts' overloads that take a plain Config check it first.
class ValidConfig {
 public:
  // INVALID_ARGUMENT naming the key and the rule, as CheckConfig says.
  [[nodiscard]] static StatusOr<ValidConfig> Check(Config config);

  const Config* operator->() const { return &config_; }
  operator const Config&() const { return config_; }  // NOLINT: reads as the Config

 private:
  explicit ValidConfig(Config config) : config_(std::move(config)) {}
  Config config_;
};

// The keys a learner's agent, its group's ranks and its group's store read
// (mend/agent_options.h), of a checked configuration.
AgentOptions AgentOptionsOf(const ValidConfig& config);

// The rule that ties keys given together: a source (a TOML file, the
// environment, a set of keywords or --set flags) that gives a DES-LOC moment
// period (momentum_sync_period_steps, second_moment_sync_period_steps)
// without desloc turns DES-LOC on, since the periods mean nothing without
// it. `given` says whether the source gave a key. Each source's Apply*
// below calls it, as does the C ABI's mend_config_set_json.
void ImplyFromGivenKeys(Config& config, const std::function<bool(std::string_view)>& given);

// Applies the top-level keys of a TOML document to `config`.
[[nodiscard]] Status ApplyConfigToml(Config& config, std::string_view toml_text,
                                     std::string_view source_name);

// Applies every MEND_<KEY> variable of `environ` (a null-terminated array of
// "NAME=value"); an unknown MEND_ variable is an error, except the reserved
// MEND_JOB_TOKEN, MEND_LEARNER_ID and MEND_LIBRARY.
[[nodiscard]] Status ApplyConfigEnvironment(Config& config, const char* const* environ);

struct ConfigSources {
  std::string file;                      // TOML file; empty for none.
  const char* const* environ = nullptr;  // nullptr skips the environment.
  // From command-line flags, applied last: (key, text, source).
  struct Override {
    std::string key;
    std::string text;
    std::string source;
  };
  std::vector<Override> overrides;
};

// "KEY=VALUE" as --set gives it (no '=': an empty value, which the key's
// check refuses), its source "flag --set KEY=VALUE".
ConfigSources::Override SetFlagOverride(const std::string& item);

// defaults < file < environment < overrides, then checked.
[[nodiscard]] StatusOr<ValidConfig> LoadConfig(const ConfigSources& sources);

// The effective configuration as a TOML document that ApplyConfigToml accepts.
std::string ConfigToToml(const Config& config);

// The key table as Markdown (key, type, default, range, meaning) for the README.
std::string ConfigMarkdownTable();

// The environment variable that holds the job token.
inline constexpr std::string_view kJobTokenVariable = "MEND_JOB_TOKEN";

// The job token: MEND_JOB_TOKEN when set, else the contents of token_file
// (trailing newline stripped). Never from argv. Errors when neither is set or
// the token is shorter than 8 characters.
[[nodiscard]] StatusOr<std::string> ReadJobToken(const Config& config, const char* const* environ);

}  // namespace mend
