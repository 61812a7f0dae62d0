// Google Benchmark: the decode kernels of quant_gemv (quant/qgemv.h) against the machine's
// streaming-read bandwidth measured in the same run, so each row says what fraction of the
// memory roofline a kernel can reach at all (docs/model-runner.md quotes the ratios):
//   BM_qgemv/<type>/<MiB>/<threads>/<activations>/<path>
// type: Q4_1, Q8_0, Q4_0 (SmolLM2's layer and output encodings and the plain 4-bit one), Q4_K,
// Q5_K, Q6_K, Q5_0, Q5_1 (Gemma 3's Q4_K_M file mixes Q5_0, Q4_K, Q6_K and Q8_0); rows of 576
// values for Q4_1/Q8_0/Q4_0, 640 for Q5_0/Q5_1, 2048 for the K-quants (SmolLM2's and Gemma 3
// 270M's widths); MiB: 1 (the matrix stays in the last-level cache: the kernel's own ceiling)
// or 64 (read from DRAM: what a decode step sees); threads: the rows split in equal contiguous
// halves, one quant_gemv per thread (what quant_linear does when it splits); activations: 0 =
// float32, 1 = 8-bit (ActivationsQ8, quantized once outside the timed loop as quant_linear does
// it once per product); path: 0 portable, 1 avx2, 2 avx512, 3 avx512vnni (those this CPU runs).
// Counters: GB/s of matrix bytes, and read_fraction = that ÷ the same-run streaming read of a
// 256 MiB buffer with the same thread count (bench_model.h).
//   BM_dequant/<type>/<KiB>/<path>
// The prefill's panel dequantizer (QuantMatrix::dequantize_rows) of a matrix of <KiB> of blocks
// (64: in L2; 65536: from DRAM), panel by panel into one 256 KiB float32 tile (it stays in L2);
// path as above, where portable is dequantize_row itself (no path has a vector dequantizer for
// every type: those without one are dequantize_row too). Counters: GB/s of blocks read and
// Gvalues/s written.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "numattn/core/exec.h"
#include "numattn/model/bench_model.h"
#include "numattn/quant/ggml_types.h"
#include "numattn/quant/qgemv.h"
#include "numattn/quant/quant.h"

namespace {

using namespace numattn;

constexpr GgmlType kTypes[] = {GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K,
                               GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q5_0, GgmlType::Q5_1};
constexpr CpuPath kPaths[] = {CpuPath::kPortable, CpuPath::kAvx2, CpuPath::kAvx512, CpuPath::kAvx512Vnni};

std::int64_t cols_of(GgmlType t) {
  if (ggml_type_info(t).block_elems == 256) return 2048;
  return t == GgmlType::Q5_0 || t == GgmlType::Q5_1 ? 640 : 576;
}

void put_half(std::uint8_t* p, float v) {
  const std::uint16_t h = fp32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

// One row of `type`: N(0, 1) values quantized where the library has a quantizer, otherwise random
// bytes with every scale field a plausible fp16 (the kernels' speed does not depend on the values).
std::vector<std::uint8_t> bench_row(GgmlType type, std::int64_t cols, std::mt19937& g) {
  const GgmlTypeInfo& ti = ggml_type_info(type);
  if (ti.quantizable) {
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> row(static_cast<std::size_t>(cols));
    for (auto& v : row) v = nd(g);
    return quantize(type, row.data(), cols);
  }
  std::vector<std::uint8_t> b(static_cast<std::size_t>(ggml_row_bytes(type, cols)));
  for (auto& v : b) v = static_cast<std::uint8_t>(g());
  for (std::int64_t k = 0; k < cols / ti.block_elems; ++k) {
    std::uint8_t* p = b.data() + k * ti.block_bytes;
    switch (type) {
      case GgmlType::Q5_0: put_half(p, 0.05f); break;
      case GgmlType::Q5_1: put_half(p, 0.1f); put_half(p + 2, -1.5f); break;
      case GgmlType::Q4_K: case GgmlType::Q5_K: put_half(p, 0.002f); put_half(p + 2, 0.001f); break;
      case GgmlType::Q6_K: put_half(p + 208, 0.0005f); break;
      default: break;
    }
  }
  return b;
}

// About `bytes` bytes (whole groups of 16 rows, at least one) of the bench row repeated.
std::vector<std::uint8_t> bench_matrix(GgmlType type, std::int64_t bytes, std::int64_t& rows) {
  std::mt19937 g(7);
  const std::vector<std::uint8_t> one = bench_row(type, cols_of(type), g);
  const auto row_bytes = static_cast<std::int64_t>(one.size());
  rows = std::max<std::int64_t>(16, bytes / row_bytes / 16 * 16);
  std::vector<std::uint8_t> data(static_cast<std::size_t>(rows * row_bytes));
  for (std::int64_t r = 0; r < rows; ++r) std::copy(one.begin(), one.end(), data.begin() + r * row_bytes);
  return data;
}

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
  const CpuPath path = kPaths[state.range(4)];
  const std::int64_t cols = cols_of(type);
  const double bw = read_bandwidth(threads);
  std::int64_t rows = 0;
  const std::vector<std::uint8_t> data = bench_matrix(type, mib << 20, rows);
  const std::int64_t row_bytes = ggml_row_bytes(type, cols);
  std::mt19937 g(8);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(static_cast<std::size_t>(cols));
  for (auto& v : x) v = nd(g);
  QuantMatrix w;
  w.cols = cols;
  w.parts.push_back({type, data.data(), rows, row_bytes});
  ActivationsQ8 xq;
  xq.quantize(x.data(), 1, cols, cols);
  std::vector<float> y(static_cast<std::size_t>(rows));
  const ExecContext ctx{threads};
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    parallel_for(ctx, threads, [&](std::int64_t p) {
      const std::int64_t a = rows / 16 * p / threads * 16, b = rows / 16 * (p + 1) / threads * 16;
      if (q8) {
        quant_gemv(w, a, b, xq, y.data(), rows, false, path);
      } else {
        quant_gemv(w, a, b, x.data(), 1, cols, y.data(), rows, false, path);
      }
    });
    benchmark::DoNotOptimize(y.data());
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                      static_cast<double>(std::max<benchmark::IterationCount>(1, state.iterations()));
  const double bytes = static_cast<double>(rows * row_bytes);
  state.SetLabel(std::string(ggml_type_name(type)) + (q8 ? " q8 " : " f32 ") + cpu_path_name(path));
  state.counters["GBps"] = bytes / secs * 1e-9;
  state.counters["read_GBps"] = bw * 1e-9;
  state.counters["read_fraction"] = bytes / secs / bw;
}

void args(benchmark::internal::Benchmark* b) {
  const int hw = hardware_threads();
  for (int t = 0; t < static_cast<int>(std::size(kTypes)); ++t)
    for (int mib : {1, 64})
      for (int th : {1, 2})
        for (int q8 : {0, 1})
          for (int p = 0; p < static_cast<int>(std::size(kPaths)); ++p)
            if (th <= hw && cpu_path_available(kPaths[p])) b->Args({t, mib, th, q8, p});
}

BENCHMARK(BM_qgemv)->Apply(args)->UseRealTime()->MinTime(0.3);

void BM_dequant(benchmark::State& state) {
  const GgmlType type = kTypes[state.range(0)];
  const std::int64_t kib = state.range(1);
  const CpuPath path = kPaths[state.range(2)];
  const std::int64_t cols = cols_of(type);
  std::int64_t rows = 0;
  const std::vector<std::uint8_t> data = bench_matrix(type, kib << 10, rows);
  const std::int64_t row_bytes = ggml_row_bytes(type, cols);
  QuantMatrix w;
  w.cols = cols;
  w.parts.push_back({type, data.data(), rows, row_bytes});
  const std::int64_t panel = std::max<std::int64_t>(1, (std::int64_t{256} << 10) / 4 / cols);
  std::vector<float> tile(static_cast<std::size_t>(panel * cols));
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    for (std::int64_t r = 0; r < rows; r += panel) {
      const std::int64_t e = std::min(rows, r + panel);
      if (path == CpuPath::kPortable) {
        dequantize_row(type, data.data() + r * row_bytes, tile.data(), (e - r) * cols);
      } else {
        w.dequantize_rows(r, e, tile.data(), path);
      }
      benchmark::DoNotOptimize(tile.data());
      benchmark::ClobberMemory();
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                      static_cast<double>(std::max<benchmark::IterationCount>(1, state.iterations()));
  state.SetLabel(std::string(ggml_type_name(type)) + " " +
                 (path == CpuPath::kPortable ? std::string("dequantize_row") : cpu_path_name(path)));
  state.counters["GBps"] = static_cast<double>(rows * row_bytes) / secs * 1e-9;
  state.counters["Gvalues"] = static_cast<double>(rows * cols) / secs * 1e-9;
}

void deq_args(benchmark::internal::Benchmark* b) {
  for (int t = 0; t < static_cast<int>(std::size(kTypes)); ++t)
    for (int kib : {64, 65536})
      for (int p = 0; p < static_cast<int>(std::size(kPaths)); ++p)
        if (cpu_path_available(kPaths[p])) b->Args({t, kib, p});
}

BENCHMARK(BM_dequant)->Apply(deq_args)->UseRealTime()->MinTime(0.2);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
