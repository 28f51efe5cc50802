#include "store/kv_store.h"

#include <optional>

#include "gtest/gtest.h"

namespace mend::store {
namespace {

struct WaitResult {
  std::optional<Status> status;
  std::vector<std::string> values;
};

KvStore::WaitCallback Capture(WaitResult* result) {
  return [result](Status status, std::vector<std::string> values) {
    result->status = status;
    result->values = std::move(values);
  };
}

void RunAll(Completions& done) {
  for (auto& f : done) f();
  done.clear();
}

TEST(KvStoreTest, SetThenGet) {
  KvStore store;
  Completions done;
  ASSERT_TRUE(store.Set("a", "1", &done).ok());
  EXPECT_EQ(store.Get("a"), "1");
  EXPECT_FALSE(store.Get("b").has_value());
}

TEST(KvStoreTest, WaitCompletesWhenTheLastKeyArrives) {
  KvStore store;
  Completions done;
  WaitResult result;
  store.Wait({"x", "y"}, 1000, Capture(&result), &done);
  RunAll(done);
  EXPECT_FALSE(result.status);
  ASSERT_TRUE(store.Set("x", "1", &done).ok());
  RunAll(done);
  EXPECT_FALSE(result.status);
  ASSERT_TRUE(store.Set("y", "2", &done).ok());
  RunAll(done);
  ASSERT_TRUE(result.status);
  EXPECT_TRUE(result.status->ok());
  EXPECT_EQ(result.values, (std::vector<std::string>{"1", "2"}));
  EXPECT_EQ(store.waiter_count(), 0u);
}

TEST(KvStoreTest, WaitOnPresentKeysCompletesAtOnce) {
  KvStore store;
  Completions done;
  ASSERT_TRUE(store.Set("x", "v", &done).ok());
  WaitResult result;
  store.Wait({"x"}, 1000, Capture(&result), &done);
  RunAll(done);
  ASSERT_TRUE(result.status);
  EXPECT_EQ(result.values[0], "v");
}

TEST(KvStoreTest, WaitTimesOutNamingMissingKeys) {
  KvStore store;
  Completions done;
  WaitResult result;
  ASSERT_TRUE(store.Set("x", "v", &done).ok());
  store.Wait({"x", "missing"}, 1000, Capture(&result), &done);
  EXPECT_EQ(store.NextDeadline(), 1000);
  store.ExpireWaits(999, &done);
  RunAll(done);
  EXPECT_FALSE(result.status);
  store.ExpireWaits(1000, &done);
  RunAll(done);
  ASSERT_TRUE(result.status);
  EXPECT_EQ(result.status->code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(std::string(result.status->message()).find("'missing'"), std::string::npos);
  EXPECT_EQ(std::string(result.status->message()).find("'x'"), std::string::npos);
}

TEST(KvStoreTest, CancelCompletesOnce) {
  KvStore store;
  Completions done;
  WaitResult result;
  uint64_t id = store.Wait({"x"}, 1000, Capture(&result), &done);
  store.Cancel(id, &done);
  RunAll(done);
  EXPECT_EQ(result.status->code(), StatusCode::kCancelled);
  store.Cancel(id, &done);
  store.ExpireWaits(5000, &done);
  EXPECT_TRUE(done.empty());
}

TEST(KvStoreTest, AddCountsAndRefusesNonIntegers) {
  KvStore store;
  Completions done;
  EXPECT_EQ(*store.Add("n", 2, &done), 2);
  EXPECT_EQ(*store.Add("n", 3, &done), 5);
  EXPECT_EQ(store.Get("n"), "5");
  ASSERT_TRUE(store.Set("s", "abc", &done).ok());
  EXPECT_EQ(store.Add("s", 1, &done).status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store.Set("big", std::to_string(INT64_MAX), &done).ok());
  EXPECT_EQ(store.Add("big", 1, &done).status().code(), StatusCode::kOutOfRange);
}

TEST(KvStoreTest, DeleteByPrefixLeavesOthers) {
  KvStore store;
  Completions done;
  for (const char* key : {"job/round/1/a", "job/round/1/b", "job/round/10/a", "job/round/2/a"}) {
    ASSERT_TRUE(store.Set(key, "v", &done).ok());
  }
  EXPECT_EQ(store.Delete("job/round/1/", true), 2u);
  EXPECT_EQ(store.key_count(), 2u);
  EXPECT_EQ(store.Delete("job/round/10/a", false), 1u);
  EXPECT_EQ(store.Delete("nope", false), 0u);
  EXPECT_EQ(store.total_bytes(), std::string("job/round/2/a").size() + 1);
}

TEST(KvStoreTest, ByteBudgetIsEnforced) {
  KvStore store(KvStoreLimits{512, 1024, 100});
  Completions done;
  EXPECT_TRUE(store.Set("k", std::string(90, 'x'), &done).ok());
  EXPECT_EQ(store.Set("j", std::string(20, 'x'), &done).code(), StatusCode::kResourceExhausted);
  // Replacing a value counts only the difference.
  EXPECT_TRUE(store.Set("k", std::string(95, 'x'), &done).ok());
}

}  // namespace
}  // namespace mend::store
