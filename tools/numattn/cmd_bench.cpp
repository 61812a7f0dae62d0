#include <iostream>
#include <memory>

#include "cli_common.h"
#include "commands.h"
#include "numattn/attention/registry.h"
#include "numattn/core/blas.h"

namespace numattn::cli {

namespace {
struct BenchOptions {
  std::vector<std::string> methods;
  ProblemFlags pf;
  int threads = 0;
  std::string format = "md";
  int reps = 5;
  long long check_rows = 256;
  long long gemm_size = 2048;
  bool all = false;
};
}  // namespace

void add_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  o->pf.n = "4096";
  auto* sub = app.add_subcommand(
      "bench", "time methods × shapes; every row carries its error and its efficiency against "
               "the same-run BLAS sgemm");
  sub->add_option("--method", o->methods, "method spec (repeatable); default: all exact methods but the reference");
  sub->add_flag("--all", o->all, "every registered method (default parameters)");
  o->pf.add_to(*sub, true);
  add_common(*sub, &o->threads, &o->format);
  sub->add_option("--reps", o->reps, "timed repetitions per row (median reported)")->capture_default_str();
  sub->add_option("--check-rows", o->check_rows, "query rows sampled for the float64 check (0 = none)")
      ->capture_default_str();
  sub->add_option("--gemm-size", o->gemm_size, "size of the sgemm baseline (m = n = k)")->capture_default_str();
  sub->callback([o] {
    ExecContext ctx{o->threads};
    std::vector<std::string> specs = o->methods;
    if (specs.empty()) {
      for (const MethodInfo* m : list_methods())
        if (o->all || (m->caps.exact && m->name != "exact.reference")) specs.push_back(m->name);
    }
    std::vector<std::unique_ptr<AttentionMethod>> methods;
    for (auto& s : specs) methods.push_back(create_method(s));
    const auto cfgs = o->pf.expand();

    const double sgemm = blas::measure_sgemm_gflops(o->gemm_size, std::max(3, o->reps), ctx.num_threads());
    std::vector<Row> rows;
    Row g;
    g["method"] = "blas.sgemm";
    g["n"] = o->gemm_size;
    g["threads"] = ctx.num_threads();
    g["gflops"] = sgemm;
    g["efficiency"] = 1.0;
    g["status"] = std::string("ok: ") + blas::library_name();
    rows.push_back(g);
    std::size_t done = 0;
    const std::size_t total = cfgs.size() * methods.size();
    for (const ProblemConfig& c0 : cfgs) {
      const ProblemConfig& c = c0;
      RandomProblem prob(c);
      for (auto& m : methods) {
        prob.set_lse(m->info().caps.lse);
        std::fprintf(stderr, "\r[%zu/%zu] %s n=%lld d=%lld ...", ++done, total, m->spec().c_str(),
                     static_cast<long long>(c.n), static_cast<long long>(c.d));
        Row r = run_method_row(*m, prob, ctx, o->reps, o->check_rows);
        if (r.contains("gflops")) r["efficiency"] = r["gflops"].get<double>() / sgemm;
        rows.push_back(r);
      }
    }
    std::fprintf(stderr, "\r%60s\r", "");
    print_table(std::cout, rows, parse_format(o->format));
  });
}

NUMATTN_COMMAND(30, add_bench);

}  // namespace numattn::cli
