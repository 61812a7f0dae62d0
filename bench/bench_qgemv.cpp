// Google Benchmark: the decode kernels of quant_gemv (quant/qgemv.h) against the machine's
// streaming-read bandwidth measured in the same run, so each row says what fraction of the
// memory roofline a kernel can reach at all (docs/model-runner.md quotes the ratios):
//   BM_qgemv/<type>/<MiB>/<threads>/<activations>
// type: Q4_1, Q8_0, Q4_0 (SmolLM2's layer and output encodings and the plain 4-bit one);
// MiB: 1 (the matrix stays in the last-level cache: the kernel's own ceiling) or 64 (read from
// DRAM: what a decode step sees); threads: the rows split in equal contiguous halves, one
// quant_gemv per thread (what quant_linear does when it splits); activations: 0 = float32,
// 1 = 8-bit (ActivationsQ8, quantized once outside the timed loop as quant_linear does it once
// per product). Counters: GB/s of matrix bytes, and read_fraction = that ÷ the same-run
// streaming read of a 256 MiB buffer with the same thread count (bench_model.h).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <random>
#include <vector>

#include "numattn/core/exec.h"
#include "numattn/model/bench_model.h"
#include "numattn/quant/ggml_types.h"
#include "numattn/quant/qgemv.h"
#include "numattn/quant/quant.h"

namespace {

using namespace numattn;

constexpr GgmlType kTypes[] = {GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_0};
constexpr std::int64_t kCols = 576;  // SmolLM2's embedding width

double read_bandwidth(int threads) {
  static std::map<int, double> cache;
  auto it = cache.find(threads);
  if (it == cache.end()) it = cache.emplace(threads, measure_read_bandwidth(std::uint64_t{256} << 20, 5, ExecContext{threads})).first;
  return it->second;
}

void BM_qgemv(benchmark::State& state) {
  const GgmlType type = kTypes[state.range(0)];
  const std::int64_t mib = state.range(1);
  const int threads = static_cast<int>(state.range(2));
  const bool q8 = state.range(3) != 0;
  const double bw = read_bandwidth(threads);
  // Rows quantized from N(0, 1) values: one row quantized, its bytes repeated (the kernels'
  // speed does not depend on the values).
  std::mt19937 g(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> row(kCols), x(kCols);
  for (auto& v : row) v = nd(g);
  for (auto& v : x) v = nd(g);
  const std::vector<std::uint8_t> one = quantize(type, row.data(), kCols);
  const auto row_bytes = static_cast<std::int64_t>(one.size());
  const std::int64_t rows = (mib << 20) / row_bytes / 16 * 16;
  std::vector<std::uint8_t> data(static_cast<std::size_t>(rows * row_bytes));
  for (std::int64_t r = 0; r < rows; ++r) std::copy(one.begin(), one.end(), data.begin() + r * row_bytes);
  QuantMatrix w;
  w.cols = kCols;
  w.parts.push_back({type, data.data(), rows, row_bytes});
  ActivationsQ8 xq;
  xq.quantize(x.data(), 1, kCols, kCols);
  std::vector<float> y(static_cast<std::size_t>(rows));
  const CpuPath path = default_cpu_path();
  const ExecContext ctx{threads};
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    parallel_for(ctx, threads, [&](std::int64_t p) {
      const std::int64_t a = rows / 16 * p / threads * 16, b = rows / 16 * (p + 1) / threads * 16;
      if (q8) {
        quant_gemv(w, a, b, xq, y.data(), rows, false, path);
      } else {
        quant_gemv(w, a, b, x.data(), 1, kCols, y.data(), rows, false, path);
      }
    });
    benchmark::DoNotOptimize(y.data());
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                      static_cast<double>(std::max<benchmark::IterationCount>(1, state.iterations()));
  const double bytes = static_cast<double>(rows * row_bytes);
  state.SetLabel(std::string(ggml_type_name(type)) + (q8 ? " q8" : " f32") + " " + cpu_path_name(path));
  state.counters["GBps"] = bytes / secs * 1e-9;
  state.counters["read_GBps"] = bw * 1e-9;
  state.counters["read_fraction"] = bytes / secs / bw;
}

void args(benchmark::internal::Benchmark* b) {
  const int hw = hardware_threads();
  for (int t = 0; t < 3; ++t)
    for (int mib : {1, 64})
      for (int th : {1, 2})
        for (int q8 : {0, 1})
          if (th <= hw) b->Args({t, mib, th, q8});
}

BENCHMARK(BM_qgemv)->Apply(args)->UseRealTime()->MinTime(0.3);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
