// Google Benchmark programs registered from the method registry: one benchmark per
// registered method × shape, with GFLOP/s (attention FLOP model) and the error against the
// float64 reference attached as counters. A new method appears here by itself.
#include <benchmark/benchmark.h>

#include "numattn/analysis/metrics.h"
#include "numattn/attention/random_problem.h"
#include "numattn/attention/reference.h"
#include "numattn/attention/registry.h"
#include "numattn/core/blas_restart.h"
#include "numattn/core/blas.h"

namespace {

using namespace numattn;

void bench_sgemm(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  std::vector<float> a(static_cast<std::size_t>(n * n), 1.f), b(a), c(a);
  for (auto _ : state)
    blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
  state.counters["GFLOPS"] = benchmark::Counter(2.0 * n * n * n, benchmark::Counter::kIsIterationInvariantRate);
}

void register_all() {
  benchmark::RegisterBenchmark("blas.sgemm/threads:1", bench_sgemm)->Arg(512)->Arg(1024)->Unit(benchmark::kMillisecond);
  for (const MethodInfo* info : list_methods()) {
    if (info->name == "exact.reference") continue;  // float64 oracle: too slow to time usefully
    for (index_t n : {256, 1024, 4096})
      for (index_t d : {64, 128})
        for (Causal c : {Causal::kNone, Causal::kTopLeft}) {
          const std::string name = fmt::format("{}/n:{}/d:{}/causal:{}", info->name, n, d, to_string(c));
          benchmark::RegisterBenchmark(name.c_str(), [info, n, d, c](benchmark::State& state) {
            auto method = create_method(info->name);
            ProblemConfig cfg;
            cfg.heads = 8;
            cfg.n = n;
            cfg.d = d;
            cfg.causal = c;
            cfg.want_lse = info->caps.lse;
            RandomProblem prob(cfg);
            const AttentionProblem& p = prob.problem();
            if (Status s = method->can_run(p); !s) {
              state.SkipWithError(s.reason().c_str());
              return;
            }
            ExecContext ctx{1};
            // run, not forward: a causal problem of a method with a non-causal kernel goes through
            // the causal recursion there (method.h).
            for (auto _ : state) method->run(p, ctx);
            const CostModel cost = method->cost(p);
            state.counters["GFLOPS"] = benchmark::Counter(cost.flops, benchmark::Counter::kIsIterationInvariantRate);
            state.counters["model_GBps"] = benchmark::Counter(cost.bytes, benchmark::Counter::kIsIterationInvariantRate);
            ErrorMetrics m = compare_with_reference(p, reference_sample(p, 64, 7, ExecContext{1}));
            state.counters["rel_fro_error"] = m.rel_fro_error;
            state.counters["workspace_bytes"] = static_cast<double>(method->workspace_bytes(p, ctx));
          })->Unit(benchmark::kMillisecond);
        }
  }
}

}  // namespace

int main(int argc, char** argv) {
  restart_with_fast_blas_kernels(argv);
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
