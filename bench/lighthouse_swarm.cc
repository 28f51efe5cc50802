#include "lighthouse_swarm.h"

#include <signal.h>

#include <atomic>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "core/status_format.h"
#include "core/text.h"
#include "fmt/format.h"
#include "learner/control_proto.h"
#include "learner/datagram_client.h"
#include "mend/lighthouse_client.h"
#include "nlohmann/json.hpp"

namespace mend::bench {
namespace {

constexpr Micros kHeartbeatPeriod = 100 * kMicrosPerMilli;
// Learners per gRPC connection. Over UDP the whole process shares one
// socket (one receiving thread), as a process multiplexing learners would.
constexpr size_t kLearnersPerChannel = 250;
constexpr Micros kJoinResend = 500 * kMicrosPerMilli;

struct SimLearner {
  std::string id;
  LearnerRef ref;
  size_t channel = 0;
  std::unique_ptr<HeartbeatStream> stream;  // gRPC transport
  // Guarded by Swarm::mu_.
  uint64_t last_round = 0;
  uint64_t step = 0;
  Micros next_join = 0;
  bool in_flight = false;
  int joins = 0;
  uint64_t join_id = 0;
  Micros joined_at = 0;
  Micros sent_at = 0;
};

struct Sample {
  uint64_t round_id;
  Micros joined;
  Micros replied;
};

class Swarm {
 public:
  explicit Swarm(const SwarmOptions& options)
      : options_(options), random_(options.seed), learners_(static_cast<size_t>(options.count)) {}

  int Run() {
    sigset_t go;
    sigemptyset(&go);
    sigaddset(&go, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &go, nullptr);
    if (Status ready = Connect(); !ready.ok()) {
      fmt::print(stderr, "swarm: {}\n", ready);
      return 1;
    }
    fmt::print("ready\n");
    std::fflush(stdout);
    Micros next_beat = RealClock()->NowMicros();
    size_t cursor = 0;
    while (true) {  // heartbeat until the driver's go
      timespec wait{0, 2'000'000};
      if (sigtimedwait(&go, nullptr, &wait) == SIGUSR1) break;
      Heartbeat(RealClock()->NowMicros(), next_beat, cursor);
    }
    start_ = RealClock()->NowMicros();
    // A safety stop, should a round never close.
    end_ = start_ + options_.rounds * (options_.round_interval + 30 * kMicrosPerSecond);
    {
      // Learners finish their first inner steps at slightly different times,
      // as in every later round (interval x [0.95, 1.05]), not all at once.
      std::lock_guard lock(mu_);
      std::uniform_real_distribution<double> spread(0, 0.1);
      for (size_t i = 0; i < learners_.size(); ++i) {
        learners_[i].next_join =
            start_ +
            static_cast<Micros>(static_cast<double>(options_.round_interval) * spread(random_));
        schedule_.emplace(learners_[i].next_join, i);
      }
    }
    while (true) {
      Micros now = RealClock()->NowMicros();
      Heartbeat(now, next_beat, cursor);
      Micros next_event = 0;
      if (!JoinDue(now, &next_event)) break;
      // Sleep to the next heartbeat slice or scheduled join, whichever is first.
      Micros wake = std::min(next_beat, next_event);
      Micros sleep = std::clamp<Micros>(wake - RealClock()->NowMicros(), 0, 20 * kMicrosPerMilli);
      if (sleep > 0) std::this_thread::sleep_for(std::chrono::microseconds(sleep));
    }
    WriteSamples();
    for (auto& learner : learners_) learner.stream.reset();
    fmt::print("done\n");
    std::fflush(stdout);
    return 0;
  }

 private:
  bool udp() const { return options_.transport == "udp"; }

  Status Connect() {
    size_t channels = (learners_.size() + kLearnersPerChannel - 1) / kLearnersPerChannel;
    for (size_t i = 0; i < channels; ++i) {
      MEND_ASSIGN_OR_RETURN(auto client, LighthouseClient::Connect({options_.address, kToken, "",
                                                                    30 * kMicrosPerSecond}));
      clients_.push_back(std::move(client));
    }
    std::atomic<size_t> next{0};
    std::atomic<bool> failed{false};
    std::atomic<int> udp_port{0};
    std::vector<std::thread> registrars;
    for (int t = 0; t < 8; ++t) {
      registrars.emplace_back([&]() {
        for (size_t i = next++; i < learners_.size() && !failed; i = next++) {
          SimLearner& learner = learners_[i];
          learner.id = fmt::format("learner-{:05d}", options_.first + static_cast<int>(i));
          learner.channel = i / kLearnersPerChannel;
          auto registration = clients_[learner.channel]->Register({learner.id, "", "", ""}, 0, 0);
          if (!registration.ok()) {
            fmt::print(stderr, "swarm: register {}: {}\n", learner.id, registration.status());
            failed = true;
            return;
          }
          learner.ref = {learner.id, registration->session_id};
          udp_port = registration->udp_port;
          if (!udp())
            learner.stream =
                clients_[learner.channel]->OpenHeartbeat(learner.ref, *RealClock(), nullptr);
        }
      });
    }
    for (auto& thread : registrars) thread.join();
    if (failed) return InternalError("registration failed");
    if (!udp()) return OkStatus();
    if (udp_port == 0) return FailedPreconditionError("the lighthouse serves no datagram channel");
    std::string host = SplitHostPort(options_.address).first;
    MEND_ASSIGN_OR_RETURN(socket_, coordinator::DatagramClient::Open(host, udp_port, kToken));
    for (auto& learner : learners_) {
      coordinator::DatagramClient::Callbacks callbacks;
      SimLearner* who = &learner;
      callbacks.on_decision = [this, who](const v1::DatagramDecision& decision) {
        OnDecision(*who, decision);
      };
      socket_->Attach(learner.ref.session_id, std::move(callbacks));
    }
    return OkStatus();
  }

  // Each channel's learners heartbeat together once a period (one burst,
  // which gRPC coalesces into few writes and UDP sends with sendmmsg), the
  // channels staggered evenly over the period.
  void Heartbeat(Micros now, Micros& next_beat, size_t& cursor) {
    size_t channels = clients_.size();
    while (now >= next_beat) {
      size_t begin = cursor * kLearnersPerChannel;
      size_t end = std::min(begin + kLearnersPerChannel, learners_.size());
      std::vector<std::pair<uint64_t, v1::HeartbeatRequest>> beats;
      for (size_t i = begin; i < end; ++i) {
        SimLearner& learner = learners_[i];
        uint64_t step = 0;
        {
          std::lock_guard lock(mu_);
          step = learner.step;
        }
        v1::HeartbeatRequest update;  // (over UDP the session says who)
        update.set_step(step);
        update.set_tokens_total(step * 1024);
        update.add_step_time_us(50'000);
        if (udp()) {
          beats.emplace_back(learner.ref.session_id, std::move(update));
        } else {
          learner.stream->Send(std::move(update));
        }
      }
      if (udp() && !beats.empty()) socket_->SendHeartbeats(beats);
      cursor = (cursor + 1) % channels;
      next_beat += kHeartbeatPeriod / static_cast<Micros>(channels);
    }
  }

  // Starts (and over UDP resends) the joins that are due; sets *next_event to
  // when the next one is. False once the run is over.
  bool JoinDue(Micros now, Micros* next_event) {
    std::vector<SimLearner*> due;
    std::vector<std::pair<uint64_t, v1::DatagramJoin>> joins;
    {
      std::lock_guard lock(mu_);
      if (finished_ == learners_.size() || now >= end_) return false;
      while (!schedule_.empty() && schedule_.begin()->first <= now) {
        SimLearner& learner = learners_[schedule_.begin()->second];
        size_t index = schedule_.begin()->second;
        schedule_.erase(schedule_.begin());
        bool start =
            !learner.in_flight && learner.joins < options_.rounds && now >= learner.next_join;
        bool resend = udp() && learner.in_flight && now - learner.sent_at >= kJoinResend;
        if (udp() && (start || resend)) schedule_.emplace(now + kJoinResend, index);
        if (start) {
          learner.joins++;
          learner.in_flight = true;
          learner.step += 10;
          learner.join_id++;
          learner.joined_at = now;
          ++in_flight_;
          (void)in_flight_;
        }
        if (!start && !resend) continue;
        learner.sent_at = now;
        if (udp()) {
          joins.emplace_back(learner.ref.session_id, v1::DatagramJoin());
          joins.back().second.set_join_id(learner.join_id);
          *joins.back().second.mutable_request() = JoinRequest(learner);
        } else {
          due.push_back(&learner);
        }
      }
    }
    if (!joins.empty()) socket_->SendJoins(joins);
    for (SimLearner* learner : due) JoinOverGrpc(*learner);
    std::lock_guard lock(mu_);
    *next_event = schedule_.empty() ? now + 20 * kMicrosPerMilli : schedule_.begin()->first;
    return true;
  }

  // A join of `learner` (under mu_), without `learner` (a datagram's
  // session says who).
  static v1::QuorumRequest JoinRequest(const SimLearner& learner) {
    v1::QuorumRequest request;
    request.set_last_round_id(learner.last_round);
    request.set_step(learner.step);
    request.set_tokens_since_last_round(10 * 1024);
    SetJoinTimeout(request, 30 * kMicrosPerSecond);
    return request;
  }

  void JoinOverGrpc(SimLearner& learner) {
    v1::QuorumRequest request;
    {
      std::lock_guard lock(mu_);
      request = JoinRequest(learner);
      FillLearnerRef(learner.ref, &request);
    }
    clients_[learner.channel]->QuorumAsync(
        request, uncancelled_, [this, &learner](StatusOr<QuorumResult> result) {
          Complete(learner, result.ok() ? OkStatus() : result.status(),
                   result.ok() ? result->round_id() : 0);
        });
  }

  void OnDecision(SimLearner& learner, const v1::DatagramDecision& decision) {
    {
      std::lock_guard lock(mu_);
      if (!learner.in_flight || decision.join_id() != learner.join_id) return;  // a resend
    }
    Complete(learner,
             decision.code() == 0
                 ? OkStatus()
                 : Status(static_cast<StatusCode>(decision.code()), decision.message()),
             decision.round().round_id());
  }

  void Complete(SimLearner& learner, const Status& status, uint64_t round_id) {
    Micros replied = RealClock()->NowMicros();
    std::lock_guard lock(mu_);
    --in_flight_;
    learner.in_flight = false;
    if (!status.ok()) {
      if (errors_++ < 5) fmt::print(stderr, "swarm: {}: {}\n", learner.id, status);
      learner.next_join = replied + kHeartbeatPeriod;
      learner.joins--;  // try that round again
      schedule_.emplace(learner.next_join, static_cast<size_t>(&learner - learners_.data()));
      return;
    }
    learner.last_round = round_id;
    samples_.push_back({round_id, learner.joined_at, replied});
    if (learner.joins == options_.rounds) finished_++;
    std::uniform_real_distribution<double> jitter(0.95, 1.05);
    learner.next_join = replied + static_cast<Micros>(static_cast<double>(options_.round_interval) *
                                                      jitter(random_));
    schedule_.emplace(learner.next_join, static_cast<size_t>(&learner - learners_.data()));
  }

  void WriteSamples() {
    nlohmann::json out;
    std::lock_guard lock(mu_);
    out["errors"] = errors_;
    out["start"] = start_;
    out["end"] = end_;
    nlohmann::json rows = nlohmann::json::array();
    for (const Sample& s : samples_) rows.push_back({s.round_id, s.joined, s.replied});
    out["samples"] = std::move(rows);
    std::ofstream(options_.out_path) << out.dump();
  }

  const SwarmOptions options_;
  std::vector<std::unique_ptr<LighthouseClient>> clients_;
  CallCanceller uncancelled_;  // the joins', which the swarm never cancels
  std::unique_ptr<coordinator::DatagramClient> socket_;
  Micros start_ = 0;
  Micros end_ = 0;

  std::mutex mu_;
  std::mt19937_64 random_;
  std::vector<SimLearner> learners_;
  std::vector<Sample> samples_;
  int in_flight_ = 0;
  size_t finished_ = 0;
  // When to look at a learner again (start a join, or resend one).
  std::multimap<Micros, size_t> schedule_;
  uint64_t errors_ = 0;
};

}  // namespace

int RunSwarm(const SwarmOptions& options) { return Swarm(options).Run(); }

}  // namespace mend::bench
