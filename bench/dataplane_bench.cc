// The data plane against plain Gloo, and the codecs on a link.
//
//   mend_dataplane_bench [--members 2,4] [--sizes-mib 1,4,16,64,256] [--iters 5]
//                        [--codecs fp32,bf16,int8,int4,topk] [--codec-mib 64]
//                        [--link-rate-mbit 0] [--hosts A,B] [--netns A,B] [--secure]
//                        [--csv-prefix bench-results/dataplane]
//
// One run starts a lighthouse (its store is the rendezvous) and N worker
// processes (this binary with --worker). Each worker builds a mend
// communicator and a plain Gloo context over the same members, then, size by
// size, times mend's fp32 weighted all-reduce and Gloo's ring all-reduce
// (gloo::allreduce, algorithm RING) alternately on the same data, each
// iteration after a barrier; then each codec's reduction of --codec-mib.
// Rank 0 prints the results; the driver prints the tables and writes:
//   <prefix>_compare.csv  members, bytes, median seconds and bus bandwidth of
//                         both, ratio mend/gloo of the medians and of the best
//                         iterations (bus bandwidth = 2(n-1)/n x bytes / s)
//   <prefix>_codecs.csv   codec, bytes on the wire per member, seconds, and the
//                         effective bandwidth (fp32 bytes reduced per second)
// With --netns A,B the lighthouse and the even ranks run in namespace A and
// the odd ranks in B (scripts/racks.sh makes them and passes the addresses
// as --hosts); the link's rate, for the "fraction of the link" column, is
// --link-rate-mbit. With --secure each codec also runs on a secure data
// plane (a second communicator, sealed with the job token: AES-256-GCM),
// iteration by iteration beside the plain one; its rows are "<codec>+aead".
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <thread>

#include "CLI/CLI.hpp"
#include "core/lighthouse_line.h"
#include "core/status_format.h"
#include "core/subprocess.h"
#include "dataplane/gloo_store.h"
#include "fmt/format.h"
#include "gloo/allreduce.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/device.h"
#include "learner/lighthouse_rendezvous.h"
#include "mend/communicator.h"
#include "mend/lighthouse_client.h"
#include "nlohmann/json.hpp"

namespace mend::bench {
namespace {

using json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;
constexpr char kToken[] = "dataplane-bench-token-0123456789";
constexpr Micros kTimeout = 120 * kMicrosPerSecond;

struct WorkerArgs {
  std::string lighthouse;
  std::string host = "127.0.0.1";
  int rank = 0;
  int size = 2;
  std::vector<int> sizes_mib;
  int iters = 5;
  std::vector<std::string> codecs;
  int codec_mib = 64;
  int segment_kib = 0;  // 0: the communicator's default
  bool secure = false;
};

double Seconds(SteadyClock::duration d) { return std::chrono::duration<double>(d).count(); }

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0 : values[values.size() / 2];
}

// ---------------------------------------------------------------- worker --

// Codec `name`'s reduction of args.codec_mib, timed on each plane (the
// plain one first; with --secure the sealed one, as "<name>+aead"),
// iteration by iteration; a row each into `results`. False on an error
// (printed).
bool RunCodec(const WorkerArgs& args, const std::string& name,
              const std::vector<Communicator*>& planes, const std::function<Status()>& barrier,
              json* results) {
  auto kind = ParseCodecKind(name);
  if (!kind.ok()) {
    fmt::print(stderr, "{}\n", kind.status());
    return false;
  }
  auto codec = MakeCodec({*kind});
  size_t n = static_cast<size_t>(args.codec_mib) * (1 << 20) / sizeof(float);
  std::vector<float> data(n), out(n);
  std::mt19937 random(args.rank);
  std::normal_distribution<float> normal(0, 1);
  for (float& v : data) v = normal(random);
  std::vector<std::byte> payload((*codec)->EncodedBytes(n));
  std::vector<std::vector<double>> seconds(planes.size());
  std::vector<uint64_t> sent(planes.size(), 0);
  for (int i = 0; i <= args.iters; ++i) {
    for (size_t k = 0; k < planes.size(); ++k) {
      // Alternate which plane goes first, so neither always runs on a warmer cache.
      const size_t p = i % 2 == 0 ? k : planes.size() - 1 - k;
      Communicator& plane = *planes[p];
      if (!barrier().ok()) return false;
      const uint64_t sent_before = plane.stats().bytes_sent;
      auto t0 = SteadyClock::now();
      Status status;
      if ((*codec)->dense()) {
        status = plane.WeightedAllReduce(data, 1.0, codec->get());
      } else {
        (*codec)->Encode(data, payload);  // counted: a learner encodes every round
        status = plane.WeightedAllGatherDecode(payload, 1.0, **codec, out);
      }
      auto t1 = SteadyClock::now();
      if (!status.ok()) {
        fmt::print(stderr, "worker {}: {}\n", args.rank, status);
        return false;
      }
      if (i > 0) seconds[p].push_back(Seconds(t1 - t0));
      sent[p] = plane.stats().bytes_sent - sent_before;
    }
  }
  for (size_t p = 0; p < planes.size(); ++p) {
    results->push_back({{"kind", "codec"},
                        {"codec", p == 0 ? name : name + "+aead"},
                        {"bytes", n * sizeof(float)},
                        {"sent", sent[p]},
                        {"seconds", Median(seconds[p])}});
  }
  return true;
}

// mend's all-reduce against plain Gloo's ring of the same `mib` MiB,
// iteration by iteration after a barrier: a row of medians and minimums.
StatusOr<json> CompareWithGloo(const WorkerArgs& args, Communicator& comm,
                               const std::shared_ptr<gloo::rendezvous::Context>& gloo_context,
                               const std::function<Status()>& barrier, int mib) {
  const auto timeout = std::chrono::milliseconds(kTimeout / kMicrosPerMilli);
  size_t n = static_cast<size_t>(mib) * (1 << 20) / sizeof(float);
  std::vector<float> data(n), gloo_data(n);
  std::mt19937 random(args.rank);
  std::uniform_real_distribution<float> uniform(-1, 1);
  for (float& v : data) v = uniform(random);
  std::vector<double> mend_s, gloo_s;
  gloo::AllreduceOptions::Func sum =
      static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>);
  auto run_mend = [&]() -> StatusOr<double> {
    MEND_RETURN_IF_ERROR(barrier());
    auto t0 = SteadyClock::now();
    MEND_RETURN_IF_ERROR(comm.WeightedAllReduce(data, 1.0));
    return Seconds(SteadyClock::now() - t0);
  };
  auto run_gloo = [&](int i) -> StatusOr<double> {
    MEND_RETURN_IF_ERROR(barrier());
    std::copy(data.begin(), data.end(), gloo_data.begin());
    gloo::AllreduceOptions gloo_options(gloo_context);
    gloo_options.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    gloo_options.setOutput(gloo_data.data(), n);
    gloo_options.setReduceFunction(sum);
    gloo_options.setTag(static_cast<uint32_t>(i));
    gloo_options.setTimeout(timeout);
    auto t0 = SteadyClock::now();
    gloo::allreduce(gloo_options);
    return Seconds(SteadyClock::now() - t0);
  };
  for (int i = 0; i <= args.iters; ++i) {  // iteration 0 warms up
    // Alternate which goes first, so neither always runs on a warmer cache.
    StatusOr<double> first = i % 2 == 0 ? run_mend() : run_gloo(i);
    StatusOr<double> second = i % 2 == 0 ? run_gloo(i) : run_mend();
    MEND_RETURN_IF_ERROR(first.status());
    MEND_RETURN_IF_ERROR(second.status());
    if (i > 0) {
      mend_s.push_back(i % 2 == 0 ? *first : *second);
      gloo_s.push_back(i % 2 == 0 ? *second : *first);
    }
  }
  return json{{"kind", "compare"},
              {"bytes", n * sizeof(float)},
              {"mend_s", Median(mend_s)},
              {"gloo_s", Median(gloo_s)},
              {"mend_min_s", *std::min_element(mend_s.begin(), mend_s.end())},
              {"gloo_min_s", *std::min_element(gloo_s.begin(), gloo_s.end())}};
}

// Plain Gloo over the same members, rendezvoused the same way.
std::shared_ptr<gloo::rendezvous::Context> ConnectGloo(const WorkerArgs& args,
                                                       RendezvousStore& store) {
  const auto timeout = std::chrono::milliseconds(kTimeout / kMicrosPerMilli);
  dataplane::GlooStore gloo_store(store, "bench/gloo/", timeout);
  gloo::transport::tcp::attr attr;
  attr.hostname = args.host;
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto gloo_context = std::make_shared<gloo::rendezvous::Context>(args.rank, args.size);
  gloo_context->setTimeout(timeout);
  gloo_context->connectFullMesh(gloo_store, device);
  return gloo_context;
}

int RunWorker(const WorkerArgs& args) {
  auto client = LighthouseClient::Connect({args.lighthouse, kToken, "", 30 * kMicrosPerSecond});
  if (!client.ok()) {
    fmt::print(stderr, "worker {}: {}\n", args.rank, client.status());
    return 1;
  }
  LighthouseRendezvousStore store(**client, *RealClock());
  CommunicatorOptions options;
  options.prefix = "bench/mend/";
  options.rank = args.rank;
  options.world_size = args.size;
  options.bind_host = args.host;
  options.timeout = kTimeout;
  if (args.segment_kib > 0) options.segment_bytes = static_cast<size_t>(args.segment_kib) << 10;
  auto comm = Communicator::Connect(store, options);
  if (!comm.ok()) {
    fmt::print(stderr, "worker {}: {}\n", args.rank, comm.status());
    return 1;
  }
  // The planes the codecs run on: the plain one, and with --secure a sealed one.
  std::unique_ptr<Communicator> secured;
  if (args.secure) {
    options.prefix = "bench/mend-secure/";
    options.secret = kToken;
    auto sealed = Communicator::Connect(store, options);
    if (!sealed.ok()) {
      fmt::print(stderr, "worker {}: {}\n", args.rank, sealed.status());
      return 1;
    }
    secured = std::move(*sealed);
  }
  auto gloo_context = ConnectGloo(args, store);

  std::vector<std::byte> token(1), tokens(args.size);
  std::function<Status()> barrier = [&]() { return (*comm)->AllGather(token, tokens); };
  json results = json::array();
  for (int mib : args.sizes_mib) {
    StatusOr<json> row = CompareWithGloo(args, **comm, gloo_context, barrier, mib);
    if (!row.ok()) {
      fmt::print(stderr, "worker {}: {}\n", args.rank, row.status());
      return 1;
    }
    results.push_back(std::move(*row));
  }
  for (const std::string& name : args.codecs) {
    std::vector<Communicator*> planes = {comm->get()};
    if (secured) planes.push_back(secured.get());
    if (!RunCodec(args, name, planes, barrier, &results)) return 1;
  }
  if (args.rank == 0) fmt::print("{}\n", results.dump());
  std::fflush(stdout);
  return barrier().ok() ? 0 : 1;
}

// ---------------------------------------------------------------- driver --

struct DriverArgs {
  std::vector<int> members = {2, 4};
  std::vector<int> sizes_mib = {1, 4, 16, 64, 256};
  int iters = 5;
  std::vector<std::string> codecs = {"fp32", "bf16", "int8", "int4", "topk"};
  int codec_mib = 64;
  int segment_kib = 0;
  double link_rate_mbit = 0;
  std::vector<std::string> hosts;  // per namespace: the address workers bind
  std::vector<std::string> netns;  // namespace names (empty: this one)
  std::string csv_prefix = "bench-results/dataplane";
  bool secure = false;
};

std::vector<std::string> InNamespace(const DriverArgs& args, size_t which,
                                     std::vector<std::string> argv) {
  if (args.netns.empty()) return argv;
  // env finds `ip` on PATH (Subprocess runs argv[0] as a path).
  argv.insert(argv.begin(),
              {"/usr/bin/env", "ip", "netns", "exec", args.netns[which % args.netns.size()]});
  return argv;
}

std::string Join(const std::vector<int>& values) {
  std::string text;
  for (int v : values) text += (text.empty() ? "" : ",") + std::to_string(v);
  return text;
}

StatusOr<json> RunMembers(const DriverArgs& args, int members, const std::string& mend,
                          const std::string& self, const std::vector<int>& sizes,
                          const std::vector<std::string>& codecs) {
  std::string dir = std::filesystem::temp_directory_path() / "mend-dataplane-bench";
  std::filesystem::create_directories(dir);
  std::string token_file = dir + "/token";
  std::ofstream(token_file) << kToken << "\n";
  std::string host0 = args.hosts.empty() ? "127.0.0.1" : args.hosts[0];
  MEND_ASSIGN_OR_RETURN(
      auto lighthouse,
      Subprocess::Spawn({InNamespace(args, 0,
                                     {mend, "--bind", host0 + ":0", "--http", "", "--token-file",
                                      token_file, "--log-level", "warn"}),
                         {},
                         "pipe",
                         dir + "/lighthouse.log",
                         false}));
  MEND_ASSIGN_OR_RETURN(const std::string address,
                        AwaitLighthouseAddress(*lighthouse, 30 * kMicrosPerSecond));
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int rank = 0; rank < members; ++rank) {
    std::string host = args.hosts.empty() ? "127.0.0.1" : args.hosts[rank % args.hosts.size()];
    std::string codec_list;
    for (const auto& c : codecs) codec_list += (codec_list.empty() ? "" : ",") + c;
    std::vector<std::string> argv = {self,
                                     "--worker",
                                     "--lighthouse",
                                     address,
                                     "--host",
                                     host,
                                     "--rank",
                                     std::to_string(rank),
                                     "--size",
                                     std::to_string(members),
                                     "--iters",
                                     std::to_string(args.iters),
                                     "--codec-mib",
                                     std::to_string(args.codec_mib),
                                     "--segment-kib",
                                     std::to_string(args.segment_kib)};
    argv.insert(argv.end(), {"--sizes-mib", sizes.empty() ? "0" : Join(sizes)});
    argv.insert(argv.end(), {"--codecs", codec_list.empty() ? "none" : codec_list});
    if (args.secure) argv.push_back("--secure");
    MEND_ASSIGN_OR_RETURN(auto worker, Subprocess::Spawn({InNamespace(args, rank, argv),
                                                          {},
                                                          rank == 0 ? "pipe" : dir + "/worker.log",
                                                          dir + "/worker.log",
                                                          false}));
    workers.push_back(std::move(worker));
  }
  auto output = workers[0]->ReadLine(3600 * kMicrosPerSecond);
  for (auto& worker : workers) (void)worker->Wait(60 * kMicrosPerSecond);
  (void)lighthouse->Signal(SIGTERM);
  (void)lighthouse->Wait(10 * kMicrosPerSecond);
  if (!output.ok()) {
    return InternalError(fmt::format("{} members: rank 0 printed no result ({}); see {}/worker.log",
                                     members, output.status(), dir));
  }
  return json::parse(*output);
}

// The comparisons with Gloo of one run: a table's rows and the CSV's.
void PrintComparisons(const json& rows, int members, const std::string& where,
                      std::ofstream& compare) {
  double factor = 2.0 * (members - 1) / members;
  bool header = false;
  for (const json& row : rows) {
    if (row["kind"] == "compare") {
      if (!header) {
        fmt::print("{:>8} {:>10} {:>10} {:>10} {:>14} {:>14} {:>10} {:>10}\n", "members", "MiB",
                   "mend ms", "gloo ms", "mend busbw", "gloo busbw", "mend/gloo", "(best)");
        header = true;
      }
      double bytes = row["bytes"];
      double mend_s = row["mend_s"], gloo_s = row["gloo_s"];
      double best = row["gloo_min_s"].get<double>() / row["mend_min_s"].get<double>();
      double mend_bw = factor * bytes / mend_s / 1e9 * 8,
             gloo_bw = factor * bytes / gloo_s / 1e9 * 8;
      fmt::print(
          "{:>8} {:>10.0f} {:>10.2f} {:>10.2f} {:>9.2f} Gb/s {:>9.2f} Gb/s {:>10.3f} {:>10.3f}\n",
          members, bytes / (1 << 20), mend_s * 1e3, gloo_s * 1e3, mend_bw, gloo_bw, gloo_s / mend_s,
          best);
      compare << fmt::format("{},{},{:.0f},{:.6f},{:.6f},{:.3f},{:.3f},{:.4f},{:.4f}\n", where,
                             members, bytes, mend_s, gloo_s, mend_bw, gloo_bw, gloo_s / mend_s,
                             best);
    }
  }
}

// The codecs' reductions of one run (`link_rate_mbit` > 0: the share of
// the link each took).
void PrintCodecs(const json& rows, int members, const std::string& where, double link_rate_mbit,
                 std::ofstream& codecs) {
  bool header = false;
  double fp32_seconds = 0;
  for (const json& row : rows) {
    if (row["kind"] != "codec") continue;
    if (!header) {
      fmt::print("\n{:>8} {:>6} {:>10} {:>14} {:>10} {:>16} {:>10} {:>10}\n", "members", "codec",
                 "MiB fp32", "MiB sent/memb", "ms", "effective", "vs fp32", "of link");
      header = true;
    }
    double bytes = row["bytes"], sent = row["sent"], seconds = row["seconds"];
    if (row["codec"] == "fp32") fp32_seconds = seconds;
    double effective = bytes / seconds * 8 / 1e9;
    double speedup = fp32_seconds > 0 ? fp32_seconds / seconds : 0;
    // The link carries each member's sends: fraction = their rate / link rate.
    double fraction = link_rate_mbit > 0 ? sent / seconds * 8 / (link_rate_mbit * 1e6) : 0;
    fmt::print("{:>8} {:>6} {:>10.0f} {:>14.2f} {:>10.1f} {:>11.3f} Gb/s {:>9.2f}x {:>10}\n",
               members, row["codec"].get<std::string>(), bytes / (1 << 20), sent / (1 << 20),
               seconds * 1e3, effective, speedup,
               link_rate_mbit > 0 ? fmt::format("{:.3f}", fraction) : "-");
    codecs << fmt::format("{},{},{},{:.0f},{:.0f},{:.6f},{:.4f},{:.3f},{:.4f}\n", where, members,
                          row["codec"].get<std::string>(), bytes, sent, seconds, effective, speedup,
                          fraction);
  }
}

int RunDriver(const DriverArgs& args) {
  std::string self = SelfExecutable();
  std::string mend =
      (std::filesystem::path(self).parent_path().parent_path() / "mend-lighthouse").string();
  std::filesystem::create_directories(std::filesystem::path(args.csv_prefix).parent_path());
  std::string where = args.netns.empty()
                          ? "loopback"
                          : fmt::format("netns {}+{} veth", args.netns.front(), args.netns.back());
  fmt::print("data plane bench: {} processes per run, {}, {} cores, median of {} iterations\n\n",
             fmt::format("{}", Join(args.members)), where, std::thread::hardware_concurrency(),
             args.iters);
  std::ofstream compare(args.csv_prefix + "_compare.csv");
  compare << "where,members,bytes,mend_s,gloo_s,mend_busbw_gbps,gloo_busbw_gbps,ratio,"
             "ratio_of_best\n";
  std::ofstream codecs(args.csv_prefix + "_codecs.csv");
  codecs << "where,members,codec,fp32_bytes,wire_bytes_per_member,seconds,effective_gbps,"
            "speedup_vs_fp32,link_fraction\n";
  int exit_code = 0;
  for (int members : args.members) {
    auto result = RunMembers(args, members, mend, self, args.sizes_mib, args.codecs);
    if (!result.ok()) {
      fmt::print(stderr, "{}\n", result.status());
      exit_code = 1;
      continue;
    }
    PrintComparisons(*result, members, where, compare);
    PrintCodecs(*result, members, where, args.link_rate_mbit, codecs);
    fmt::print("\n");
  }
  fmt::print("CSV: {}_compare.csv, {}_codecs.csv\n", args.csv_prefix, args.csv_prefix);
  return exit_code;
}

}  // namespace
}  // namespace mend::bench

int main(int argc, char** argv) {
  CLI::App app{"mend data plane benchmark: mend's reductions against plain Gloo, codecs on a link"};
  bool worker = false;
  mend::bench::WorkerArgs w;
  mend::bench::DriverArgs d;
  app.add_flag("--worker", worker, "Run as one member (used by the driver)");
  app.add_option("--lighthouse", w.lighthouse);
  app.add_option("--host", w.host);
  app.add_option("--rank", w.rank);
  app.add_option("--size", w.size);
  app.add_option("--members", d.members, "Members per run")->delimiter(',')->capture_default_str();
  app.add_option("--sizes-mib", d.sizes_mib, "Buffer sizes compared with Gloo (MiB)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--iters", d.iters, "Timed iterations (the median is reported)")
      ->capture_default_str();
  app.add_option("--codecs", d.codecs, "Codecs to measure (empty: none)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--codec-mib", d.codec_mib, "Buffer size for the codec runs (MiB of fp32)")
      ->capture_default_str();
  app.add_option("--segment-kib", d.segment_kib,
                 "Pipelining segment of mend's reductions (0: default)")
      ->capture_default_str();
  app.add_option("--link-rate-mbit", d.link_rate_mbit,
                 "Rate of the shaped link, for the fraction-of-link column")
      ->capture_default_str();
  app.add_option("--hosts", d.hosts, "Addresses by namespace (with --netns)")->delimiter(',');
  app.add_option("--netns", d.netns, "Network namespaces to place members in")->delimiter(',');
  app.add_option("--csv-prefix", d.csv_prefix)->capture_default_str();
  app.add_flag("--secure", d.secure,
               "Also run each codec on a secure data plane (AES-256-GCM), beside the plain one");
  CLI11_PARSE(app, argc, argv);
  // "--sizes-mib 0" skips the comparison with Gloo, "--codecs none" the codecs.
  std::erase_if(d.sizes_mib, [](int mib) { return mib <= 0; });
  std::erase_if(d.codecs, [](const std::string& name) { return name == "none"; });
  if (worker) {
    w.sizes_mib = d.sizes_mib;
    w.iters = d.iters;
    w.codecs = d.codecs;
    w.codec_mib = d.codec_mib;
    w.segment_kib = d.segment_kib;
    w.secure = d.secure;
    try {
      return mend::bench::RunWorker(w);
    } catch (const std::exception& error) {
      fmt::print(stderr, "worker {}: {}\n", w.rank, error.what());
      return 1;
    }
  }
  return mend::bench::RunDriver(d);
}
