// Codec throughput on one core (Google Benchmark): encode, decode, and
// decode-accumulate of 16 Mi values (64 MiB of fp32), reported as fp32 bytes
// per second, plus encode+decode together (the round trip a reduction pays
// per byte at the owner).
//
//   mend_codec_bench [--benchmark_filter=...]
// prints the table and writes bench-results/codecs.csv unless
// --benchmark_out=FILE is given.
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
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
