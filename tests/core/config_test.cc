#include "mend/config.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mend {
namespace {

using ::testing::HasSubstr;

// A null-terminated environ array built from strings.
class Env {
 public:
  explicit Env(std::vector<std::string> entries) : entries_(std::move(entries)) {
    for (auto& e : entries_) pointers_.push_back(e.c_str());
    pointers_.push_back(nullptr);
  }
  const char* const* get() const { return pointers_.data(); }

 private:
  std::vector<std::string> entries_;
  std::vector<const char*> pointers_;
};

std::string WriteTemp(const std::string& text) {
  char path[] = "/tmp/mend_config_test_XXXXXX";
  int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  close(fd);
  return path;
}

TEST(ConfigTest, DefaultsPassEveryCheck) { EXPECT_TRUE(CheckConfig(Config{}).ok()); }

TEST(ConfigTest, EveryKeyRoundTripsThroughItsText) {
  Config config;
  for (const ConfigKey& key : ConfigKeys()) {
    Config copy;
    ASSERT_TRUE(SetConfigValue(copy, key.name, FormatConfigValue(config, key), "test").ok())
        << key.name;
    EXPECT_EQ(FormatConfigValue(copy, key), FormatConfigValue(config, key)) << key.name;
  }
}

TEST(ConfigTest, OutOfRangeValueNamesKeyValueRangeAndSource) {
  Config config;
  Status status = SetConfigValue(config, "grace_window_ms", "-5", "flag --grace-window-ms");
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("grace_window_ms = \"-5\""));
  EXPECT_THAT(std::string(status.message()), HasSubstr("[0, 600000]"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("flag --grace-window-ms"));
  EXPECT_EQ(config.grace_window_ms, 2000);
}

TEST(ConfigTest, NonNumbersAreRefused) {
  Config config;
  EXPECT_FALSE(SetConfigValue(config, "heartbeat_ms", "100ms", "t").ok());
  EXPECT_FALSE(SetConfigValue(config, "heartbeat_ms", "", "t").ok());
  EXPECT_FALSE(SetConfigValue(config, "outer_lr", "nan", "t").ok());
  EXPECT_FALSE(SetConfigValue(config, "outer_lr", "inf", "t").ok());
  EXPECT_FALSE(SetConfigValue(config, "rack_aware", "maybe", "t").ok());
  EXPECT_TRUE(SetConfigValue(config, "rack_aware", "yes", "t").ok());
  EXPECT_TRUE(config.rack_aware);
}

TEST(ConfigTest, EnumListsItsChoices) {
  Config config;
  Status status = SetConfigValue(config, "codec", "fp16", "t");
  EXPECT_THAT(std::string(status.message()), HasSubstr("fp32 | bf16 | int8 | int4 | topk"));
  EXPECT_TRUE(SetConfigValue(config, "codec", "int4", "t").ok());
  EXPECT_EQ(config.codec, CodecKind::kInt4);
}

TEST(ConfigTest, UnknownKeySuggestsClosestKey) {
  Config config;
  Status status = SetConfigValue(config, "grace_window", "10", "a.toml:2");
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("did you mean 'grace_window_ms'?"));
  EXPECT_EQ(SuggestConfigKey("quorum_min_learner"), "quorum_min_learners");
  EXPECT_EQ(SuggestConfigKey("hearbeat_ms"), "heartbeat_ms");
  EXPECT_EQ(SuggestConfigKey("completely_unrelated_thing"), "");
}

TEST(ConfigTest, CrossKeyRulesAreChecked) {
  Config config;
  config.heartbeat_ms = 1000;
  config.heartbeat_timeout_ms = 1500;
  EXPECT_THAT(std::string(CheckConfig(config).message()),
              HasSubstr("heartbeat_timeout_ms = 1500: must be at least 2 x heartbeat_ms"));
  config = Config{};
  config.grace_window_ms = 10;
  config.grace_window_min_ms = 20;
  EXPECT_FALSE(CheckConfig(config).ok());
  config = Config{};
  config.tls_cert_file = "cert.pem";
  EXPECT_THAT(std::string(CheckConfig(config).message()), HasSubstr("tls_key_file"));
  config = Config{};
  config.bind = "localhost";
  EXPECT_THAT(std::string(CheckConfig(config).message()), HasSubstr("expected HOST:PORT"));
  config.bind = "localhost:70000";
  EXPECT_THAT(std::string(CheckConfig(config).message()), HasSubstr("[0, 65535]"));
}

// The rules the round driver used to find only after the learner registered.
// A ValidConfig is only made from a configuration that passes the check;
// it reads as the Config it holds.
TEST(ConfigTest, AValidConfigIsOnlyMadeFromOneThatPasses) {
  Config config;
  config.heartbeat_timeout_ms = config.heartbeat_ms;
  StatusOr<ValidConfig> refused = ValidConfig::Check(config);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("heartbeat_timeout_ms"));
  config.heartbeat_timeout_ms = 4 * config.heartbeat_ms;
  config.job_id = "valid";
  StatusOr<ValidConfig> valid = ValidConfig::Check(config);
  ASSERT_TRUE(valid.ok()) << valid.status();
  EXPECT_EQ((*valid)->job_id, "valid");
  const Config& read = *valid;
  EXPECT_EQ(read.heartbeat_timeout_ms, 4 * config.heartbeat_ms);
}

TEST(ConfigTest, FragmentAndDeslocRulesAreCheckedWithTheConfig) {
  Config config;
  config.sync_period_steps = 4;
  config.fragments = 5;
  config.rounds_in_flight = 1;
  EXPECT_THAT(std::string(CheckConfig(config).message()),
              HasSubstr("fragments = 5: must be in [1, sync_period_steps = 4]"));
  config = Config{};
  config.desloc = true;
  config.fragments = 2;
  config.rounds_in_flight = 1;
  EXPECT_THAT(std::string(CheckConfig(config).message()),
              HasSubstr("desloc = true with fragments = 2: DES-LOC runs with one fragment"));
  config = Config{};
  config.desloc = true;
  config.sync_period_steps = 10;
  config.overlap_steps = 1;
  config.momentum_sync_period_steps = 25;
  EXPECT_THAT(std::string(CheckConfig(config).message()),
              HasSubstr("momentum_sync_period_steps = 25: must be a multiple of sync_period_steps "
                        "= 10"));
  config.momentum_sync_period_steps = 30;
  config.second_moment_sync_period_steps = 15;
  EXPECT_THAT(std::string(CheckConfig(config).message()),
              HasSubstr("second_moment_sync_period_steps = 15"));
  config.second_moment_sync_period_steps = 60;
  EXPECT_TRUE(CheckConfig(config).ok()) << CheckConfig(config);
  config.desloc = false;  // (the periods mean nothing without it)
  config.momentum_sync_period_steps = 25;
  EXPECT_TRUE(CheckConfig(config).ok()) << CheckConfig(config);
}

TEST(ConfigTest, JobIdAndRackMustBeIdentifiersTheLighthouseAccepts) {
  Config config;
  config.job_id = "my job";
  EXPECT_THAT(std::string(CheckConfig(config).message()), HasSubstr("job_id"));
  config = Config{};
  config.rack = "rack/1";
  EXPECT_THAT(std::string(CheckConfig(config).message()), HasSubstr("rack"));
  config.rack = "zone-a:rack-1";
  EXPECT_TRUE(CheckConfig(config).ok());
}

TEST(ConfigTest, TomlFileIsApplied) {
  Config config;
  Status status = ApplyConfigToml(config,
                                  "quorum_min_learners = 3\n"
                                  "outer_lr = 1\n"
                                  "codec = \"int8\"\n"
                                  "rack_aware = true\n",
                                  "job.toml");
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(config.quorum_min_learners, 3);
  EXPECT_DOUBLE_EQ(config.outer_lr, 1.0);
  EXPECT_EQ(config.codec, CodecKind::kInt8);
  EXPECT_TRUE(config.rack_aware);
}

TEST(ConfigTest, TomlTypeMismatchNamesFileAndLine) {
  Config config;
  Status status =
      ApplyConfigToml(config, "job_id = \"x\"\nquorum_min_learners = \"3\"\n", "job.toml");
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("job.toml:2"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("expected an integer"));
  // A float is named as one, also when it is a whole number.
  status = ApplyConfigToml(config, "sync_period_steps = 5.0\n", "job.toml");
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("sync_period_steps = \"5.0\" (from job.toml:1): expected an integer"));
  // An integer past 64 bits is out of the key's range, not "not an integer".
  status = SetConfigValue(config, "total_steps", "100000000000000000000", "keyword total_steps");
  EXPECT_THAT(
      std::string(status.message()),
      HasSubstr("total_steps = \"100000000000000000000\" (from keyword total_steps): must be in "
                "[0, 1000000000000]"));
}

TEST(ConfigTest, TomlSyntaxErrorNamesPosition) {
  Config config;
  Status status = ApplyConfigToml(config, "quorum_min_learners = = 3\n", "bad.toml");
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("bad.toml:1"));
}

TEST(ConfigTest, TomlUnknownKeySuggests) {
  Config config;
  Status status = ApplyConfigToml(config, "\n\nsync_period = 10\n", "job.toml");
  EXPECT_THAT(std::string(status.message()), HasSubstr("job.toml:3"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("sync_period_steps"));
}

TEST(ConfigTest, LayersApplyInOrderFileEnvironmentFlags) {
  std::string path = WriteTemp("grace_window_ms = 100\nheartbeat_ms = 50\njob_id = \"file\"\n");
  Env env({"MEND_GRACE_WINDOW_MS=200", "MEND_JOB_ID=env", "PATH=/bin"});
  ConfigSources sources;
  sources.file = path;
  sources.environ = env.get();
  sources.overrides.push_back({"job_id", "flag", "flag --job-id"});
  auto config = LoadConfig(sources);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ((*config)->heartbeat_ms, 50);      // file
  EXPECT_EQ((*config)->grace_window_ms, 200);  // env beats file
  EXPECT_EQ((*config)->job_id, "flag");        // flag beats env
  std::remove(path.c_str());
}

// A DES-LOC moment period given without desloc in one source turns DES-LOC
// on, in every source alike; desloc given beside it (in the same source)
// wins, and so does a later source's desloc.
TEST(ConfigTest, AMomentPeriodWithoutDeslocTurnsItOnInEverySource) {
  Config toml;
  ASSERT_TRUE(ApplyConfigToml(toml, "momentum_sync_period_steps = 300\n", "job.toml").ok());
  EXPECT_TRUE(toml.desloc);
  Config toml_off;
  ASSERT_TRUE(ApplyConfigToml(toml_off, "second_moment_sync_period_steps = 600\ndesloc = false\n",
                              "job.toml")
                  .ok());
  EXPECT_FALSE(toml_off.desloc);
  Config untouched;
  ASSERT_TRUE(ApplyConfigToml(untouched, "outer_lr = 0.5\n", "job.toml").ok());
  EXPECT_FALSE(untouched.desloc);

  Env env({"MEND_SECOND_MOMENT_SYNC_PERIOD_STEPS=600"});
  Config from_env;
  ASSERT_TRUE(ApplyConfigEnvironment(from_env, env.get()).ok());
  EXPECT_TRUE(from_env.desloc);

  ConfigSources flags;
  flags.overrides.push_back(SetFlagOverride("momentum_sync_period_steps=300"));
  auto loaded = LoadConfig(flags);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE((*loaded)->desloc);
  // The environment turns it on, a flag turns it off again.
  std::string path = WriteTemp("momentum_sync_period_steps = 300\n");
  ConfigSources layered;
  layered.file = path;
  layered.overrides.push_back(SetFlagOverride("desloc=false"));
  auto off = LoadConfig(layered);
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE((*off)->desloc);
  std::remove(path.c_str());
}

TEST(ConfigTest, UnknownEnvironmentVariableIsAnErrorWithSuggestion) {
  Env env({"MEND_GRACE_WINDOW=200"});
  ConfigSources sources;
  sources.environ = env.get();
  auto config = LoadConfig(sources);
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("MEND_GRACE_WINDOW_MS"));
}

// udp_control (the lighthouse's) and control_transport (the learners') became
// one key; the old names say what to set instead, from every source.
TEST(ConfigTest, ReplacedKeysNameTheirReplacement) {
  Config config;
  for (const char* old_name : {"udp_control", "control_transport"}) {
    Status status = SetConfigValue(config, old_name, "udp", "a.toml:4");
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), HasSubstr(old_name));
    EXPECT_THAT(std::string(status.message()), HasSubstr("replaced by control_plane"));
    EXPECT_THAT(std::string(status.message()), HasSubstr("a.toml:4"));
  }
  Env env({"MEND_CONTROL_TRANSPORT=udp"});
  ConfigSources sources;
  sources.environ = env.get();
  auto loaded = LoadConfig(sources);
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("replaced by control_plane"));
  ASSERT_TRUE(SetConfigValue(config, "control_plane", "udp", "test").ok());
  EXPECT_EQ(config.control_plane, ControlPlane::kUdp);
}

TEST(ConfigTest, MissingFileIsNamed) {
  ConfigSources sources;
  sources.file = "/nonexistent/mend.toml";
  auto config = LoadConfig(sources);
  EXPECT_EQ(config.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("/nonexistent/mend.toml"));
}

TEST(ConfigTest, ConfigToTomlRoundTrips) {
  Config config;
  config.job_id = "a \"quoted\" job";
  config.outer_lr = 0.25;
  config.fragments = 4;
  Config parsed;
  Status status = ApplyConfigToml(parsed, ConfigToToml(config), "dump");
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(ConfigToToml(parsed), ConfigToToml(config));
}

TEST(ConfigTest, MarkdownTableListsEveryKey) {
  std::string table = ConfigMarkdownTable();
  for (const ConfigKey& key : ConfigKeys()) {
    EXPECT_THAT(table, HasSubstr("`" + std::string(key.name) + "`"));
  }
}

TEST(ConfigTest, JobTokenComesFromEnvironmentBeforeFile) {
  std::string path = WriteTemp("file-token-123\n");
  Config config;
  config.token_file = path;
  auto from_file = ReadJobToken(config, Env({}).get());
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  EXPECT_EQ(*from_file, "file-token-123");
  auto from_env = ReadJobToken(config, Env({"MEND_JOB_TOKEN=env-token-456"}).get());
  ASSERT_TRUE(from_env.ok());
  EXPECT_EQ(*from_env, "env-token-456");
  std::remove(path.c_str());
}

TEST(ConfigTest, JobTokenMustExistAndBeLongEnough) {
  Config config;
  EXPECT_EQ(ReadJobToken(config, Env({}).get()).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReadJobToken(config, Env({"MEND_JOB_TOKEN=short"}).get()).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadJobToken(config, Env({"MEND_JOB_TOKEN=has space inside"}).get()).status().code(),
            StatusCode::kInvalidArgument);
  config.token_file = "/nonexistent/token";
  EXPECT_EQ(ReadJobToken(config, Env({}).get()).status().code(), StatusCode::kNotFound);
}

// The settings a learner registers: every name a key, sorted, the codec's
// and DES-LOC's own keys only when they are in use.
TEST(ConfigTest, SharedSettingsAreTheKeysThatShapeTheRounds) {
  Config config;
  std::vector<std::string> settings = SharedSettings(config);
  // Every one of the 15 names it always lists is a key (one that is not
  // would be left out, and the count would fall short).
  EXPECT_EQ(settings.size(), 15u);
  EXPECT_THAT(settings, ::testing::Contains("dataplane_encrypt=true"));
  EXPECT_TRUE(std::is_sorted(settings.begin(), settings.end()));
  EXPECT_THAT(settings, ::testing::Contains("sync_period_steps=100"));
  EXPECT_THAT(settings, ::testing::Contains("codec=fp32"));
  for (const std::string& setting : settings) {
    const std::string key = setting.substr(0, setting.find('='));
    EXPECT_NE(FindConfigKey(key), nullptr) << key;
    EXPECT_NE(key, "codec_block_size");
    EXPECT_NE(key, "momentum_sync_period_steps");
    EXPECT_NE(key, "concurrent_outer_step");
  }
  config.codec = CodecKind::kInt8;
  config.desloc = true;
  settings = SharedSettings(config);
  EXPECT_THAT(settings, ::testing::Contains("codec_block_size=64"));
  EXPECT_THAT(settings, ::testing::Contains("momentum_sync_period_steps=0"));
  EXPECT_EQ(settings.size(), 18u);
  EXPECT_TRUE(std::is_sorted(settings.begin(), settings.end()));
}

}  // namespace
}  // namespace mend
