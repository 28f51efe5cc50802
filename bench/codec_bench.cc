// Codec throughput on one core (Google Benchmark): encode, decode, and
// decode-accumulate of 16 Mi values (64 MiB of fp32), reported as fp32 bytes
// per second, plus encode+decode together (the round trip a reduction pays
// per byte at the owner). Beside them, the secure data plane's AEAD
// (AES-256-GCM, src/dataplane/sealing.h): sealing and opening the same
// 64 MiB in pieces of 1 MiB (a round's segment), bytes per second.
//
//   mend_codec_bench [--benchmark_filter=...]
// prints the table and writes bench-results/codecs.csv unless
// --benchmark_out=FILE is given.
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "dataplane/sealing.h"
#include "mend/codec.h"

namespace mend::bench {
namespace {

constexpr size_t kValues = 16 << 20;

const std::vector<float>& Input() {
  static const std::vector<float> values = [] {
    std::vector<float> v(kValues);
    std::mt19937 random(1);
    std::normal_distribution<float> normal(0, 1);
    for (float& x : v) x = normal(random);
    return v;
  }();
  return values;
}

std::unique_ptr<Codec> Make(CodecKind kind) { return std::move(*MakeCodec({kind})); }

// Runs `body(codec, encoded, decoded)` per iteration with the input encoded
// once beforehand, and reports fp32 bytes per second.
template <typename Body>
void RunCodec(benchmark::State& state, Body body) {
  auto codec = Make(static_cast<CodecKind>(state.range(0)));
  std::vector<std::byte> encoded(codec->EncodedBytes(kValues));
  codec->Encode(Input(), encoded);
  std::vector<float> decoded(kValues, 0.0f);
  for (auto _ : state) {
    body(*codec, encoded, decoded);
    benchmark::DoNotOptimize(encoded.data());
    benchmark::DoNotOptimize(decoded.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kValues * sizeof(float));
  state.SetLabel(std::string(CodecName(codec->kind())));
}

void BM_Encode(benchmark::State& state) {
  RunCodec(state, [](const Codec& c, auto& encoded, auto&) { c.Encode(Input(), encoded); });
}

void BM_Decode(benchmark::State& state) {
  RunCodec(state, [](const Codec& c, auto& encoded, auto& decoded) { c.Decode(encoded, decoded); });
}

void BM_DecodeAccumulate(benchmark::State& state) {
  RunCodec(state, [](const Codec& c, auto& encoded, auto& decoded) {
    c.DecodeAccumulate(encoded, 0.5f, decoded);
  });
}

void BM_EncodeDecode(benchmark::State& state) {
  RunCodec(state, [](const Codec& c, auto& encoded, auto& decoded) {
    c.Encode(Input(), encoded);
    c.Decode(encoded, decoded);
  });
}

void Codecs(benchmark::internal::Benchmark* b) {
  for (CodecKind kind :
       {CodecKind::kFp32, CodecKind::kBf16, CodecKind::kInt8, CodecKind::kInt4, CodecKind::kTopK}) {
    b->Arg(static_cast<int>(kind));
  }
  b->Unit(benchmark::kMillisecond)->MinTime(0.5);
}

BENCHMARK(BM_Encode)->Apply(Codecs);
BENCHMARK(BM_Decode)->Apply(Codecs);
BENCHMARK(BM_DecodeAccumulate)->Apply(Codecs);
BENCHMARK(BM_EncodeDecode)->Apply(Codecs);

constexpr size_t kPieceBytes = 1 << 20;

// Seals (or, with `open`, opens) the input in pieces of kPieceBytes, each
// piece's lanes on state.range(0) threads.
void RunSeal(benchmark::State& state, bool open) {
  const size_t sealed = dataplane::SealedBytes(kPieceBytes);
  const std::vector<std::byte> randoms(32, std::byte{1});
  auto key = dataplane::DeriveKey("bench-token-0123456789",
                                  dataplane::Transcript("bench/", 1, 2, {"a", "b"}, randoms));
  auto sealer = std::move(*dataplane::Sealer::Make(*key, static_cast<int>(state.range(0))));
  const auto* input = reinterpret_cast<const std::byte*>(Input().data());
  const size_t pieces = kValues * sizeof(float) / kPieceBytes;
  std::vector<std::byte> wire(pieces * sealed);
  std::vector<std::byte> plain(kValues * sizeof(float));
  auto piece = [&](size_t i) { return std::span<std::byte>(wire.data() + i * sealed, sealed); };
  for (size_t i = 0; i < pieces; ++i) {
    (void)sealer->Seal({1, 1, i, 0, 1}, {input + i * kPieceBytes, kPieceBytes}, piece(i));
  }
  std::vector<std::byte> opened(sealed);
  for (auto _ : state) {
    for (size_t i = 0; i < pieces; ++i) {
      if (open) {
        std::copy(piece(i).begin(), piece(i).end(), opened.begin());  // (Open decrypts in place)
        if (!sealer->Open({1, 1, i, 0, 1}, opened, {plain.data() + i * kPieceBytes, kPieceBytes}))
          state.SkipWithError("a piece did not open");
      } else {
        (void)sealer->Seal({1, 1, i, 0, 1}, {input + i * kPieceBytes, kPieceBytes}, piece(i));
      }
    }
    benchmark::DoNotOptimize(wire.data());
    benchmark::DoNotOptimize(plain.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kValues * sizeof(float));
  state.SetLabel("aes-256-gcm, " + std::to_string(state.range(0)) + " thread(s)");
}

void BM_Seal(benchmark::State& state) { RunSeal(state, false); }
// (Includes the copy of each piece that its receive buffer would hold.)
void BM_Open(benchmark::State& state) { RunSeal(state, true); }

// On 1 and 2 threads, by the wall clock.
void OnThreads(benchmark::internal::Benchmark* b) {
  b->ArgName("threads")->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
}
BENCHMARK(BM_Seal)->Apply(OnThreads);
BENCHMARK(BM_Open)->Apply(OnThreads);

}  // namespace
}  // namespace mend::bench

int main(int argc, char** argv) {
  std::vector<char*> args(argv, argv + argc);
  bool has_out = false;
  for (int i = 1; i < argc; ++i) has_out |= std::strncmp(argv[i], "--benchmark_out=", 16) == 0;
  std::string out = "--benchmark_out=bench-results/codecs.csv";
  std::string format = "--benchmark_out_format=csv";
  if (!has_out) {
    args.push_back(out.data());
    args.push_back(format.data());
  }
  int count = static_cast<int>(args.size());
  benchmark::Initialize(&count, args.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
