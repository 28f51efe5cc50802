// Multi-process fixture: a `mend lighthouse` process and `mend sim-learner`
// processes on loopback (port 0), a client to read the lighthouse's status,
// and waits on conditions of that status.
#pragma once

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/lighthouse_line.h"
#include "core/subprocess.h"
#include "gtest/gtest.h"
#include "mend/lighthouse_client.h"
#include "nlohmann/json.hpp"
#include "test_util/wait.h"

namespace mend::testing_util {

inline constexpr char kJobToken[] = "process-test-token-0123456789";

class ProcessFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    ASSERT_FALSE(dir_.empty());
    token_file_ = dir_ + "/token";
    std::ofstream(token_file_) << kJobToken << "\n";
  }

  void TearDown() override {
    learners_.clear();  // SIGKILLs what still runs
    lighthouse_.reset();
    if (HasFailure()) DumpLogs();
    std::filesystem::remove_all(dir_);
  }

  // Starts the lighthouse; `bind` defaults to port 0. Extra flags follow.
  void StartLighthouse(std::vector<std::string> flags, const std::string& bind = "127.0.0.1:0") {
    std::vector<std::string> argv = {MEND_BINARY, "lighthouse",  "--bind",       bind,
                                     "--http",    "127.0.0.1:0", "--token-file", token_file_};
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto child = Subprocess::Spawn({argv, {}, "pipe", dir_ + "/lighthouse.log", false});
    ASSERT_TRUE(child.ok()) << child.status();
    lighthouse_ = std::move(*child);
    auto address = AwaitLighthouseAddress(*lighthouse_, 30 * kMicrosPerSecond);
    ASSERT_TRUE(address.ok()) << address.status();
    grpc_address_ = *address;
    LighthouseClientOptions options{grpc_address_, kJobToken, "", 5 * kMicrosPerSecond};
    client_ = std::move(*LighthouseClient::Connect(options));
  }

  // Starts `mend sim-learner --id ID` with the given extra flags.
  Subprocess& StartLearner(const std::string& id, std::vector<std::string> flags = {},
                           const std::string& token_file = "") {
    std::vector<std::string> argv = {MEND_BINARY,    "sim-learner",
                                     "--id",         id,
                                     "--lighthouse", grpc_address_,
                                     "--token-file", token_file.empty() ? token_file_ : token_file};
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto child =
        Subprocess::Spawn({argv, {}, dir_ + "/" + id + ".out", dir_ + "/" + id + ".log", false});
    EXPECT_TRUE(child.ok()) << child.status();
    learners_[id] = std::move(*child);
    return *learners_[id];
  }

  // The lighthouse's status document (null when unreachable).
  nlohmann::json Status() {
    auto json = client_->StatusJson(1000, 200);
    return json.ok() ? nlohmann::json::parse(*json) : nlohmann::json();
  }

  // Waits until `predicate(status)` holds; fails the test with the last status if not.
  bool AwaitStatus(Micros timeout, const std::function<bool(const nlohmann::json&)>& predicate,
                   const std::string& what) {
    nlohmann::json last;
    bool ok = WaitFor(timeout, [&]() {
      last = Status();
      return !last.is_null() && predicate(last);
    });
    EXPECT_TRUE(ok) << "timed out waiting for: " << what << "\nlast status: " << last.dump(1);
    return ok;
  }

  static const nlohmann::json* FindLearner(const nlohmann::json& status, const std::string& id) {
    for (const auto& learner : status["learners"]) {
      if (learner["id"] == id) return &learner;
    }
    return nullptr;
  }

  static std::vector<std::string> Members(const nlohmann::json& round) {
    return round["members"].get<std::vector<std::string>>();
  }

  // A round after `after_id` with exactly `members`, or null.
  static const nlohmann::json* FindRound(const nlohmann::json& status,
                                         const std::vector<std::string>& members,
                                         uint64_t after_id = 0) {
    for (const auto& round : status["rounds"]) {
      if (round["id"].get<uint64_t>() > after_id && Members(round) == members) return &round;
    }
    return nullptr;
  }

  static bool HasEvent(const nlohmann::json& status, const std::string& kind,
                       const std::string& learner) {
    for (const auto& event : status["events"]) {
      if (event["kind"] == kind && event["learner"] == learner) return true;
    }
    return false;
  }

  void DumpLogs() {
    for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
      if (entry.path().extension() != ".log" && entry.path().extension() != ".out") continue;
      std::ifstream in(entry.path());
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (text.size() > 4000) text = "..." + text.substr(text.size() - 4000);
      std::cerr << "==== " << entry.path().filename().string() << " ====\n" << text << "\n";
    }
  }

  std::string dir_;
  std::string token_file_;
  std::string grpc_address_;
  std::unique_ptr<Subprocess> lighthouse_;
  std::unique_ptr<LighthouseClient> client_;
  std::map<std::string, std::unique_ptr<Subprocess>> learners_;
};

}  // namespace mend::testing_util
