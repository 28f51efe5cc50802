// A lighthouse that a test takes down once while learners train, and starts
// again on the same address once a condition holds (the learners trained
// on), so that the test can check what they did meanwhile.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "gtest/gtest.h"
#include "mend/config.h"
#include "mend/lighthouse.h"
#include "nlohmann/json.hpp"
#include "test_util/wait.h"

namespace mend::testing_util {

class LighthouseOutage {
 public:
  // `config.bind` picks the address (port 0: any); `config.lighthouse` is
  // set to the one it got, for the learners.
  LighthouseOutage(Config& config, std::string token) : token_(std::move(token)) {
    auto server = LighthouseServer::Start(config, token_, *RealClock());
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) server_ = std::move(*server);
    config.lighthouse = server_ ? server_->grpc_address() : "";
    config_ = config;
  }
  ~LighthouseOutage() { Join(); }

  LighthouseOutage(const LighthouseOutage&) = delete;
  LighthouseOutage& operator=(const LighthouseOutage&) = delete;

  // Runs `f` on the lighthouse up now (nullptr while it is down).
  template <typename F>
  auto WithServer(F f) {
    std::lock_guard lock(mu_);
    return f(server_.get());
  }

  // The latest round id of the lighthouse up now (0 while it is down).
  uint64_t LatestRoundId() {
    return WithServer([](LighthouseServer* server) -> uint64_t {
      if (!server) return 0;
      return nlohmann::json::parse(server->StatusJson())["summary"]["latest_round_id"]
          .get<uint64_t>();
    });
  }

  // The first call takes the lighthouse down (after noting its latest round)
  // and starts it again in a thread once `back_when` holds, or after 60 s
  // (trained_on() tells which); later calls do nothing.
  void TakeDown(std::function<bool()> back_when) {
    std::lock_guard lock(mu_);
    if (down_ || !server_) return;
    last_round_before_ =
        nlohmann::json::parse(server_->StatusJson())["summary"]["latest_round_id"].get<uint64_t>();
    const std::string address = server_->grpc_address();
    server_->Shutdown(0);
    server_.reset();
    down_ = true;
    restarter_ = std::thread([this, address, back_when = std::move(back_when)]() {
      trained_on_ = WaitFor(60 * kMicrosPerSecond, back_when);
      Config again = config_;
      again.bind = address;
      auto restarted = LighthouseServer::Start(again, token_, *RealClock());
      EXPECT_TRUE(restarted.ok()) << restarted.status();
      std::lock_guard relock(mu_);
      if (restarted.ok()) server_ = std::move(*restarted);
      up_again_ = true;
    });
  }

  // Waits for the restart (if there was an outage).
  void Join() {
    if (restarter_.joinable()) restarter_.join();
  }

  bool taken_down() {
    std::lock_guard lock(mu_);
    return down_;
  }
  bool up_again() const { return up_again_.load(); }
  // Whether `back_when` held before the lighthouse came back (not the 60 s).
  bool trained_on() const { return trained_on_.load(); }
  uint64_t last_round_before() {
    std::lock_guard lock(mu_);
    return last_round_before_;
  }

 private:
  const std::string token_;
  Config config_;
  std::mutex mu_;
  std::unique_ptr<LighthouseServer> server_;
  bool down_ = false;
  uint64_t last_round_before_ = 0;
  std::atomic<bool> trained_on_{false};
  std::atomic<bool> up_again_{false};
  std::thread restarter_;
};

}  // namespace mend::testing_util
