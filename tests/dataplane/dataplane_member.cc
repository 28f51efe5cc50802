// One data-plane member in its own process, for the fault tests: connects
// through the lighthouse's store, runs fp32 weighted all-reduces back to
// back and reports each on stdout:
//   ok <i>
//   error <CODE> <elapsed_ms> <message>      (the operation that failed)
// After an error, a survivor (--survivors lists the ranks that live on)
// builds a fresh communicator for the next round with the survivors only,
// reduces once and prints
//   next ok <checksum>                       (or: next error <status>)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "core/status_format.h"
#include "fmt/format.h"
#include "learner/lighthouse_rendezvous.h"
#include "mend/communicator.h"
#include "mend/lighthouse_client.h"

namespace {

void Say(const std::string& line) {
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

// Every member shows up (under <job>/here/) before the first round's
// rendezvous, whose timeout is the operations' short one: the processes
// start apart, more so under a sanitizer on a loaded machine. A lighthouse
// not reachable yet is tried again.
mend::Status AwaitMembers(mend::RendezvousStore& store, const std::string& job, int rank,
                          int size) {
  const mend::Clock& clock = *mend::RealClock();
  const mend::Micros deadline = clock.NowMicros() + 120 * mend::kMicrosPerSecond;
  const auto here = [&](int r) { return fmt::format("{}/here/{}", job, r); };
  const auto retry = [&](const mend::Status& status) {
    if (status.code() != absl::StatusCode::kUnavailable || clock.NowMicros() >= deadline)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return true;
  };
  mend::Status set;
  while (!(set = store.Set(here(rank), "1")).ok()) {
    if (!retry(set)) return set;
  }
  for (int r = 0; r < size; ++r) {
    while (true) {
      auto value = store.Get(here(r), std::max<mend::Micros>(1, deadline - clock.NowMicros()));
      if (value.ok()) break;
      if (!retry(value.status())) return value.status();
    }
  }
  return mend::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"data-plane member for the fault tests"};
  std::string lighthouse, token_file, job = "job";
  int rank = 0, size = 2, ops = 1000, timeout_ms = 5000;
  size_t values = 1 << 20;
  std::vector<int> survivors;
  app.add_option("--lighthouse", lighthouse)->required();
  app.add_option("--token-file", token_file)->required();
  app.add_option("--job", job);
  app.add_option("--rank", rank);
  app.add_option("--size", size);
  app.add_option("--values", values);
  app.add_option("--ops", ops);
  app.add_option("--timeout-ms", timeout_ms);
  app.add_option("--survivors", survivors)->delimiter(',');
  CLI11_PARSE(app, argc, argv);

  std::string token;
  std::ifstream(token_file) >> token;
  auto client =
      mend::LighthouseClient::Connect({lighthouse, token, "", 10 * mend::kMicrosPerSecond});
  if (!client.ok()) {
    Say(fmt::format("fatal {}", client.status()));
    return 1;
  }
  mend::LighthouseRendezvousStore store(**client, *mend::RealClock());
  auto options = [&](int round, int my_rank, int world, int round_timeout_ms) {
    mend::CommunicatorOptions o;
    o.prefix = fmt::format("{}/round/{}/", job, round);
    o.round_id = static_cast<uint64_t>(round);
    o.rank = my_rank;
    o.world_size = world;
    o.timeout = round_timeout_ms * mend::kMicrosPerMilli;
    o.connect_timeout = 30 * mend::kMicrosPerSecond;  // (slack for a loaded machine)
    for (int r = 0; r < world; ++r) o.member_ids.push_back(fmt::format("m{}", r));
    return o;
  };
  if (mend::Status here = AwaitMembers(store, job, rank, size); !here.ok()) {
    Say(fmt::format("fatal {}", here));
    return 1;
  }
  auto comm = mend::Communicator::Connect(store, options(1, rank, size, timeout_ms));
  if (!comm.ok()) {
    Say(fmt::format("fatal {}", comm.status()));
    return 1;
  }
  std::vector<float> data(values, static_cast<float>(rank + 1));
  for (int i = 0; i < ops; ++i) {
    auto start = std::chrono::steady_clock::now();
    mend::Status status = (*comm)->WeightedAllReduce(data, 1.0);
    if (status.ok()) {
      Say(fmt::format("ok {}", i));
      continue;
    }
    auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - start);
    Say(fmt::format("error {} {} {}", absl::StatusCodeToString(status.code()), elapsed.count(),
                    mend::StatusMessage(status)));
    comm->reset();  // discard the failed communicator: sockets closed, threads joined
    auto me = std::find(survivors.begin(), survivors.end(), rank);
    if (me == survivors.end()) return 0;
    int new_rank = static_cast<int>(me - survivors.begin());
    // The survivors give up on round 1 at different times (one at its
    // deadline, the other when that one leaves, after tearing down), so the
    // fresh round waits longer for them to meet than one operation may take.
    auto next = mend::Communicator::Connect(
        store,
        options(2, new_rank, static_cast<int>(survivors.size()), std::max(timeout_ms, 30'000)));
    if (!next.ok()) {
      Say(fmt::format("next error {}", next.status()));
      return 0;
    }
    std::vector<float> fresh(values, static_cast<float>(rank + 1));
    mend::Status again = (*next)->WeightedAllReduce(fresh, 1.0);
    if (!again.ok()) {
      Say(fmt::format("next error {}", again));
      return 0;
    }
    double checksum = std::accumulate(fresh.begin(), fresh.end(), 0.0);
    Say(fmt::format("next ok {:.1f}", checksum));
    return 0;
  }
  Say("done");
  return 0;
}
