// Google Benchmark: the tensor attention forms of tensor_forms.h against their naive / dense
// contractions, in the same run (docs/tensor.md quotes the ratios):
//   hot.modewise vs hot.dense (the N1N2 × N1N2 matrix S1 ⊗ S2 formed and multiplied),
//   multilinear (contraction order) vs multilinear.materialised (the N³ tensor),
//   axial vs hot.dense's size class, TPA from the factorised cache.
// Every form runs single-threaded (BLAS is single-threaded in numattn), so ratios are per core.
#include <benchmark/benchmark.h>

#include <vector>

#include "numattn/core/blas_restart.h"
#include "numattn/attention/tensor_forms.h"
#include "numattn/core/rng.h"

namespace {

using namespace numattn;

std::vector<float> randf(std::size_t n, std::uint64_t stream) {
  std::vector<float> x(n);
  fill_normal(x, 7, stream);
  return x;
}

void bench_hot(benchmark::State& state, bool dense) {
  const index_t n1 = state.range(0), n2 = n1, d = 64, dv = 64;
  const auto sz = static_cast<std::size_t>(n1 * n2);
  const auto q = randf(sz * d, 1), k = randf(sz * d, 2), v = randf(sz * dv, 3);
  std::vector<float> out(sz * dv);
  for (auto _ : state) {
    if (dense) hot_dense_attention(q.data(), k.data(), v.data(), n1, n2, d, dv, out.data());
    else hot_modewise_attention(q.data(), k.data(), v.data(), n1, n2, d, dv, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["tokens"] = static_cast<double>(sz);
}

void bench_axial(benchmark::State& state) {
  const index_t n1 = state.range(0), n2 = n1, d = 64, dv = 64;
  const auto sz = static_cast<std::size_t>(n1 * n2);
  const auto q = randf(sz * d, 1), k = randf(sz * d, 2), v = randf(sz * dv, 3);
  std::vector<float> out(sz * dv);
  for (auto _ : state) axial_attention(q.data(), k.data(), v.data(), n1, n2, d, dv, false, out.data(), ExecContext{1});
}

void bench_multilinear(benchmark::State& state, bool materialised) {
  const index_t n = state.range(0), r = 16, dout = 32;
  std::vector<double> q(static_cast<std::size_t>(n * r)), k(q), v(q), g(static_cast<std::size_t>(r)),
      w(static_cast<std::size_t>(n * n * dout));
  fill_normal(q, 1, 1);
  fill_normal(k, 1, 2);
  fill_normal(v, 1, 3);
  fill_normal(g, 1, 4);
  fill_normal(w, 1, 5);
  for (auto _ : state) {
    auto o = materialised ? multilinear_reference(q.data(), k.data(), v.data(), g.data(), w.data(), n, r, dout)
                          : multilinear_attention(q.data(), k.data(), v.data(), g.data(), w.data(), n, r, dout);
    benchmark::DoNotOptimize(o.data());
  }
}

void bench_tpa(benchmark::State& state) {
  const index_t n = state.range(0), heads = 8, dh = 64, rq = 6, rk = 2, rv = 2;
  const auto qa = randf(static_cast<std::size_t>(n * rq * heads), 1), qb = randf(static_cast<std::size_t>(n * rq * dh), 2);
  const auto ka = randf(static_cast<std::size_t>(n * rk * heads), 3), kb = randf(static_cast<std::size_t>(n * rk * dh), 4);
  const auto va = randf(static_cast<std::size_t>(n * rv * heads), 5), vb = randf(static_cast<std::size_t>(n * rv * dh), 6);
  std::vector<float> out(static_cast<std::size_t>(heads * n * dh));
  for (auto _ : state)
    tpa_attention({qa.data(), qb.data(), rq}, {ka.data(), kb.data(), rk}, {va.data(), vb.data(), rv}, n, heads, dh,
                  true, out.data(), ExecContext{1});
  state.counters["cache_bytes"] = static_cast<double>(tpa_cache_bytes(n, heads, dh, rk, rv));
  state.counters["mha_cache_bytes"] = static_cast<double>(mha_cache_bytes(n, heads, dh));
}

}  // namespace

int main(int argc, char** argv) {
  numattn::restart_with_fast_blas_kernels(argv);
  benchmark::RegisterBenchmark("hot.modewise", bench_hot, false)->Arg(32)->Arg(128)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("hot.dense", bench_hot, true)->Arg(32)->Arg(128)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("axial", bench_axial)->Arg(32)->Arg(128)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("multilinear.contracted", bench_multilinear, false)->Arg(64)->Arg(128)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("multilinear.materialised", bench_multilinear, true)->Arg(64)->Arg(128)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("tpa.factorised_cache", bench_tpa)->Arg(1024)->Arg(4096)->Unit(benchmark::kMillisecond);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
