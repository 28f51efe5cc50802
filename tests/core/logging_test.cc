#include "mend/logging.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "spdlog/spdlog.h"

namespace mend {
namespace {

// Two ranks of one learner start on threads of one process, each setting the
// default logger with the same tag while the other logs. The logger replaced
// must stay alive (another thread may hold it by raw pointer inside
// spdlog::info), and the default logger must never be missing. One logger
// is kept per tag: a tag seen before gets its own back, at the new level.
TEST(LoggingTest, AReplacedLoggerStaysAliveAndTheDefaultIsNeverMissing) {
  ASSERT_TRUE(InitLogging(LogLevel::kError, "same").ok());
  const std::weak_ptr<spdlog::logger> first = spdlog::default_logger();
  ASSERT_TRUE(InitLogging(LogLevel::kWarn, "other").ok());
  EXPECT_FALSE(first.expired()) << "the replaced logger was destroyed";
  EXPECT_NE(spdlog::default_logger().get(), first.lock().get());
  EXPECT_EQ(spdlog::default_logger()->name(), "mend-other");
  ASSERT_TRUE(InitLogging(LogLevel::kInfo, "same").ok());
  EXPECT_EQ(spdlog::default_logger().get(), first.lock().get()) << "a second logger for one tag";
  EXPECT_EQ(spdlog::default_logger()->name(), "mend-same");
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::info);
  ASSERT_TRUE(InitLogging(LogLevel::kError, "same").ok());
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::err);

  std::atomic<bool> done{false};
  std::atomic<int> missing{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) (void)InitLogging(LogLevel::kError, "same");
    });
  }
  std::thread reader([&] {
    while (!done.load()) {
      spdlog::logger* logger = spdlog::default_logger_raw();
      if (logger == nullptr) {
        ++missing;
      } else {
        logger->info("not shown at level error");
      }
    }
  });
  for (std::thread& thread : threads) thread.join();
  done = true;
  reader.join();
  EXPECT_EQ(missing.load(), 0);
  EXPECT_EQ(spdlog::default_logger().get(), first.lock().get());
}

TEST(LoggingTest, AnUnknownLevelIsRefusedNamingTheKey) {
  const Status bad = InitLogging(std::string_view("loud"), "x");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.message()).find("log_level"), std::string::npos) << bad.message();
}

}  // namespace
}  // namespace mend
