/* Two learners of one job, driven through the C ABI alone (mend/mend.h), on
 * raw float buffers, in one thread: each step that waits for a round
 * returns MEND_PENDING and the program steps the other learner meanwhile.
 * Checks that after every synchronous round both learners hold bit-identical
 * parameters and global state, that errors name what was wrong, and that the
 * exported outer state imports back. Exit status 0 when all holds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mend/mend.h"

#define CHECK(call)                                                                                \
  do {                                                                                             \
    mend_status status_ = (call);                                                                  \
    if (status_ != MEND_OK) {                                                                      \
      fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call, mend_status_name(status_), \
              mend_last_error());                                                                  \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)
#define EXPECT(condition)                                                      \
  do {                                                                         \
    if (!(condition)) {                                                        \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #condition); \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

enum { kLearners = 2, kSteps = 12, kPeriod = 4, kW = 16, kB = 4, kC = 7 };
static const char kToken[] = "c-abi-test-token-0123456789";

typedef struct {
  float w[kW], b[kB], c[kC];
  mend_learner* learner;
} Learner;

static void Set(mend_config* config, const char* key, const char* value) {
  CHECK(mend_config_set(config, key, value, "two_learners.c"));
}

/* An inner step: every value moves towards a target of its own learner. */
static void Train(Learner* l, int seed) {
  float* parts[3] = {l->w, l->b, l->c};
  const int sizes[3] = {kW, kB, kC};
  for (int p = 0; p < 3; ++p) {
    for (int i = 0; i < sizes[p]; ++i)
      parts[p][i] -= 0.1f * (parts[p][i] - (float)(seed * (i + 1 + p)));
  }
}

static void CheckErrors(void) {
  mend_config* config = NULL;
  CHECK(mend_config_new(&config));
  EXPECT(mend_config_set(config, "grace_window", "5", NULL) == MEND_NOT_FOUND);
  EXPECT(strstr(mend_last_error(), "grace_window_ms") != NULL);
  /* A job setting: a word that is no configuration key, and not too long. */
  EXPECT(mend_config_add_job_setting(config, "outer_lr", "1") == MEND_INVALID_ARGUMENT);
  EXPECT(strstr(mend_last_error(), "'outer_lr'") != NULL);
  EXPECT(mend_config_add_job_setting(config, "a=b", "1") == MEND_INVALID_ARGUMENT);
  EXPECT(mend_config_add_job_setting(config, "", "1") == MEND_INVALID_ARGUMENT);
  EXPECT(mend_config_add_job_setting(config, "data_version", NULL) == MEND_INVALID_ARGUMENT);
  char long_value[600];
  memset(long_value, 'x', sizeof long_value - 1);
  long_value[sizeof long_value - 1] = '\0';
  EXPECT(mend_config_add_job_setting(config, "data_version", long_value) == MEND_INVALID_ARGUMENT);
  EXPECT(strstr(mend_last_error(), "above 500") != NULL);
  CHECK(mend_config_add_job_setting(config, "data_version", "3"));
  EXPECT(mend_config_set(config, "grace_window_ms", "-5", NULL) == MEND_INVALID_ARGUMENT);
  EXPECT(strstr(mend_last_error(), "grace_window_ms") != NULL);
  char* value = NULL;
  CHECK(mend_config_get(config, "grace_window_ms", &value));
  EXPECT(strcmp(value, "2000") == 0); /* the default, untouched by the refused value */
  mend_string_free(value);
  /* Many keys at once: all or nothing, the key named. */
  EXPECT(mend_config_set_json(config, "{\"grace_window_ms\": \"300\", \"outer_lr\": \"-1\"}",
                              "test") == MEND_INVALID_ARGUMENT);
  EXPECT(strstr(mend_last_error(), "test outer_lr") != NULL);
  EXPECT(mend_config_set_json(config, "{\"grace_window_ms\": 300}", NULL) == MEND_INVALID_ARGUMENT);
  EXPECT(mend_config_set_json(config, "[1]", NULL) == MEND_INVALID_ARGUMENT);
  EXPECT(mend_config_set_json(config, "{\"grace_windw_ms\": \"1\"}", NULL) == MEND_NOT_FOUND);
  char* all = NULL;
  CHECK(mend_config_to_json(config, &all));
  EXPECT(strstr(all, "\"grace_window_ms\":\"2000\"") != NULL); /* untouched */
  mend_string_free(all);
  CHECK(
      mend_config_set_json(config, "{\"grace_window_ms\": \"300\", \"codec\": \"int8\"}", "test"));
  CHECK(mend_config_to_json(config, &all));
  EXPECT(strstr(all, "\"grace_window_ms\":\"300\"") != NULL &&
         strstr(all, "\"codec\":\"int8\"") != NULL);
  mend_string_free(all);
  char* keys = NULL;
  CHECK(mend_config_keys_json(&keys));
  EXPECT(strstr(keys, "\"host_staging\"") != NULL);
  mend_string_free(keys);
  mend_learner* none = NULL;
  EXPECT(mend_learner_create(config, kToken, "x", NULL, 0, 0, &none) == MEND_INVALID_ARGUMENT);
  EXPECT(none == NULL);
  mend_config_free(config);
}

int main(void) {
  EXPECT(mend_abi_version() == MEND_ABI_VERSION);
  CheckErrors();

  mend_config* config = NULL;
  CHECK(mend_config_new(&config));
  Set(config, "bind", "127.0.0.1:0");
  Set(config, "http", "");
  Set(config, "quorum_min_learners", "2");
  Set(config, "sync_period_steps", "4");
  Set(config, "concurrent_outer_step", "false");
  Set(config, "heartbeat_ms", "50");
  Set(config, "heartbeat_timeout_ms", "2000");
  Set(config, "log_level", "warn");
  mend_lighthouse* lighthouse = NULL;
  CHECK(mend_lighthouse_start(config, kToken, &lighthouse));
  Set(config, "lighthouse", mend_lighthouse_address(lighthouse));
  CHECK(mend_config_add_job_setting(config, "data_version", "3"));

  Learner learners[kLearners];
  for (int k = 0; k < kLearners; ++k) {
    Learner* l = &learners[k];
    for (int i = 0; i < kW; ++i) l->w[i] = (float)(k + 1) * 0.5f + (float)i;
    for (int i = 0; i < kB; ++i) l->b[i] = (float)(k * 3 - i);
    for (int i = 0; i < kC; ++i) l->c[i] = 0.25f * (float)(i - k);
    const int64_t w_shape[2] = {4, 4};
    const mend_buffer buffers[3] = {{"layer.weight", l->w, kW, w_shape, 2},
                                    {"layer.bias", l->b, kB, NULL, 0},
                                    {"head", l->c, kC, NULL, 0}};
    char id[32];
    snprintf(id, sizeof id, "c-learner-%d", k);
    CHECK(mend_learner_create(config, kToken, id, buffers, 3, 0, &l->learner));
  }
  { /* A learner whose job setting differs is refused, naming it. */
    mend_config* other = NULL;
    CHECK(mend_config_copy(config, &other));
    CHECK(mend_config_add_job_setting(other, "data_version", "4")); /* (replaces 3) */
    float w[kW] = {0};
    const mend_buffer buffers[1] = {{"w", w, kW, NULL, 0}};
    mend_learner* refused = NULL;
    EXPECT(mend_learner_create(other, kToken, "c-other", buffers, 1, 0, &refused) ==
           MEND_INVALID_ARGUMENT);
    EXPECT(strstr(mend_last_error(), "data_version = 4 (this job's learners have 3)") != NULL);
    mend_config_free(other);
  }

  for (int step = 1; step <= kSteps; ++step) {
    mend_status status[kLearners];
    for (int k = 0; k < kLearners; ++k) {
      Train(&learners[k], k + 1);
      const uint32_t plan = mend_learner_plan_step(learners[k].learner);
      EXPECT(((plan & MEND_STEP_MAY_WAIT) != 0) == (step % kPeriod == 0));
      /* synchronous: a boundary's step writes the round's result */
      EXPECT(((plan & MEND_STEP_MAY_WRITE) != 0) == (step % kPeriod == 0));
      status[k] = mend_learner_step(learners[k].learner, 100 + (uint64_t)k, 0);
      EXPECT(status[k] == MEND_OK || status[k] == MEND_PENDING);
    }
    for (int k = 0; k < kLearners; ++k) {
      while (status[k] == MEND_PENDING) status[k] = mend_learner_wait(learners[k].learner, 20);
      CHECK(status[k]);
      EXPECT(((mend_learner_last_flags(learners[k].learner) & MEND_STEP_WROTE) != 0) ==
             (step % kPeriod == 0));
    }
    if (step % kPeriod == 0) { /* synchronous rounds: every learner holds the global state */
      EXPECT(memcmp(learners[0].w, learners[1].w, sizeof learners[0].w) == 0);
      EXPECT(memcmp(learners[0].b, learners[1].b, sizeof learners[0].b) == 0);
      EXPECT(memcmp(learners[0].c, learners[1].c, sizeof learners[0].c) == 0);
    }
  }

  float global[kLearners][kW + kB + kC];
  for (int k = 0; k < kLearners; ++k) {
    mend_stats stats;
    CHECK(mend_learner_stats(learners[k].learner, &stats));
    EXPECT(stats.rounds == kSteps / kPeriod && stats.failed_rounds == 0 && stats.steps == kSteps);
    EXPECT(mend_learner_fragments(learners[k].learner) == 1);
    uint64_t count = 0;
    CHECK(mend_learner_global_state(learners[k].learner, 0, NULL, 0, &count));
    EXPECT(count == kW + kB + kC);
    CHECK(mend_learner_global_state(learners[k].learner, 0, global[k], count, &count));
  }
  EXPECT(memcmp(global[0], global[1], sizeof global[0]) == 0);

  /* The outer state out and back in: the parameters become the global state. */
  void* state = NULL;
  uint64_t size = 0;
  CHECK(mend_learner_export_state(learners[0].learner, &state, &size));
  EXPECT(size > 0);
  Train(&learners[0], 9);
  CHECK(mend_learner_import_state(learners[0].learner, state, size, 0));
  EXPECT(mend_learner_last_flags(learners[0].learner) & MEND_STEP_WROTE);
  EXPECT(memcmp(learners[0].w, global[0], sizeof learners[0].w) == 0);
  EXPECT(mend_learner_import_state(learners[0].learner, state, size / 2, 0) == MEND_DATA_LOSS);
  /* Keeping the parameters: they stay as they are, the learner's step comes back. */
  Train(&learners[0], 9);
  float trained[kW];
  memcpy(trained, learners[0].w, sizeof trained);
  CHECK(mend_learner_import_state(learners[0].learner, state, size, MEND_IMPORT_KEEP_PARAMETERS));
  EXPECT((mend_learner_last_flags(learners[0].learner) & MEND_STEP_WROTE) == 0);
  EXPECT(memcmp(learners[0].w, trained, sizeof trained) == 0);
  mend_stats after;
  CHECK(mend_learner_stats(learners[0].learner, &after));
  EXPECT(after.steps == kSteps && after.last_round_id > 0);
  mend_bytes_free(state);

  char* document = NULL;
  CHECK(mend_lighthouse_status_json(lighthouse, 0, 0, &document));
  EXPECT(strstr(document, "c-learner-1") != NULL);
  mend_string_free(document);

  for (int k = 0; k < kLearners; ++k) {
    CHECK(mend_learner_shutdown(learners[k].learner));
    EXPECT(mend_learner_step(learners[k].learner, 1, 0) == MEND_FAILED_PRECONDITION);
    mend_learner_free(learners[k].learner);
  }
  mend_lighthouse_stop(lighthouse);
  mend_config_free(config);
  printf("two_learners: %d rounds, bit-identical; %s\n", kSteps / kPeriod, mend_version());
  return 0;
}
