#include <cmath>
#include <iostream>
#include <memory>

#include "cli_common.h"
#include "commands.h"
#include "numattn/analysis/metrics.h"
#include "dist_cli.h"
#include "numattn/attention/registry.h"
#include "numattn/core/blas.h"
#include "numattn/model/bench_model.h"
#include "qkv_source.h"

namespace numattn::cli {

namespace {
struct BenchOptions {
  std::vector<std::string> methods;
  ProblemFlags pf;
  int threads = 0;
  std::string format = "md";
  int reps = 5;
  long long check_rows = 256;
  EstimateFlags est;
  long long recall_k = 0;
  long long gemm_size = 2048;
  bool all = false;
  std::string qkv, layers, sweep;
};

// "name=v1,v2,...": the parameter and its values.
std::pair<std::string, std::vector<std::string>> parse_sweep(const std::string& s) {
  const std::size_t eq = s.find('=');
  NUMATTN_CHECK_OPTION(eq != std::string::npos && eq > 0, "sweep",
                       "expected PARAM=v1,v2,..., got '{}'", s);
  std::string name = s.substr(0, eq);
  const std::string list = s.substr(eq + 1);
  NUMATTN_CHECK_OPTION(list.find_first_not_of(" \t") != std::string::npos, "sweep", "'{}' has no values", s);
  // A value may be a nested spec (auto.causal's inner=...), whose own commas are not separators.
  return {name, split_spec_option("sweep", list)};
}

// The specs of a sweep: `spec` with parameter `name` set to each value in turn. The parameter
// must be in the method's schema (the error lists the valid ones); values are checked by the
// registry as any spec's are.
std::vector<std::string> sweep_specs(const std::string& spec, const std::string& name,
                                     const std::vector<std::string>& values) {
  const ParsedSpec ps = parse_spec(spec);
  const MethodInfo* info = find_method(ps.name);
  NUMATTN_CHECK_OPTION(info != nullptr, "method", "unknown method '{}' (see `numattn methods`)", ps.name);
  bool known = false;
  std::string valid;
  for (const ParamSpec& p : info->params) {
    known |= p.name == name;
    valid += (valid.empty() ? "" : ", ") + p.name;
  }
  NUMATTN_CHECK_OPTION(known, "sweep", "{} has no parameter '{}'; its parameters: {}", ps.name,
                       name, valid.empty() ? "(none)" : valid);
  std::vector<std::string> out;
  for (const std::string& v : values) {
    std::string args;
    bool set = false;
    for (const auto& [k, x] : ps.params) {
      args += (args.empty() ? "" : ",") + k + "=" + (k == name ? v : x);
      set |= k == name;
    }
    if (!set) args += (args.empty() ? "" : ",") + name + "=" + v;
    out.push_back(ps.name + "(" + args + ")");
  }
  return out;
}

// One problem of the sweep, random or read from a capture, behind the same few calls.
struct BenchProblem {
  std::unique_ptr<RandomProblem> random;
  std::unique_ptr<FileProblem> file;
  std::string source;
  AttentionProblem& problem() { return random ? random->problem() : file->problem(); }
  void set_lse(bool on) { random ? random->set_lse(on) : file->set_lse(on); }
  Row seed() const { return random ? Row(random->config().seed) : Row(); }
  std::uint64_t check_seed() const {
    return (random ? random->config().seed : 0) ^ 0x9e3779b97f4a7c15ull;
  }
};
}  // namespace

void add_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  o->pf.n = "4096";
  auto* sub = app.add_subcommand(
      "bench", "time methods × shapes; every row carries its error, its efficiency against the "
               "same-run BLAS sgemm, speedup_vs_exact: the time of exact.flash on the same "
               "problem, measured once per problem in the same run, over the row's time, and "
               "model_ms / model_ratio: the time the method's own cost model predicts (its FLOPs at "
               "the same-run sgemm rate, its bytes at the same-run read bandwidth (read_gbytes_per_s "
               "of the blas.sgemm row), the "
               "larger) and the measured time over it");
  sub->add_option(
      "--method", o->methods,
      "method spec (repeatable, or a comma-separated list: commas inside a spec's parentheses are "
      "its own); default: all exact methods but the reference and dist.* "
      "(under mpirun: dist.ring and dist.ulysses)");
  sub->add_flag("--all", o->all, "every registered method (default parameters)");
  o->pf.add_to(*sub, true);
  add_common(*sub, &o->threads, &o->format);
  sub->add_option("--reps", o->reps, "timed repetitions per row (median reported)")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  sub->add_option("--check-rows", o->check_rows,
                  "query rows sampled for the float64 check (-1 = all up to 4096 rows, else 1024; "
                  "0 = none)")
      ->check(CLI::Range(-1LL, 1000000000LL))
      ->capture_default_str();
  o->est.add_to(*sub);
  sub->add_option("--recall", o->recall_k,
                  "K: add `topk_recall`, the mean top-K recall of each method's attention rows "
                  "(first head, --check-rows rows, probe V = I; Nk ≤ 8192; 0 = off)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--gemm-size", o->gemm_size, "size of the sgemm baseline (m = n = k)")
      ->check(CLI::Range(1LL, 32768LL))
      ->capture_default_str();
  sub->add_option("--qkv", o->qkv,
                  "a `numattn capture` directory: the problems are the captured q/k/v of --layer "
                  "(shape flags are refused; --causal, --scale, --logit-scale, --layout, "
                  "--window-* apply)");
  sub->add_option("--layer", o->layers, "captured layers to run with --qkv (comma-separated list)");
  sub->add_option("--sweep", o->sweep,
                  "PARAM=v1,v2,...: one row per value of the parameter PARAM of the one --method "
                  "(error against time)");
  sub->callback([o] {
    ExecContext ctx{o->threads};
    // A --method value may be a list: "lowrank.nystrom(landmarks=64,iters=2),exact.flash".
    std::vector<std::string> specs = split_spec_option("method", o->methods);
    std::string sweep_param;
    std::vector<std::string> sweep_values;
    if (!o->sweep.empty()) {
      NUMATTN_CHECK_OPTION(specs.size() == 1 && !o->all, "sweep",
                           "needs exactly one --method (got {}{})", specs.size(),
                           o->all ? " and --all" : "");
      std::tie(sweep_param, sweep_values) = parse_sweep(o->sweep);
      specs = sweep_specs(specs[0], sweep_param, sweep_values);
    }
    if (specs.empty()) {
      for (const MethodInfo* m : list_methods())
        // dist.* on one rank is exact.flash with extra copies: benched under mpirun instead.
        if (o->all || (m->caps.exact && m->name != "exact.reference" && m->family != "dist")) specs.push_back(m->name);
    }
    std::vector<std::unique_ptr<AttentionMethod>> methods;
    for (auto& s : specs) {
      try {
        methods.push_back(create_method(s));
      } catch (const OptionError&) {
        throw;
      } catch (const Error& e) {
        if (sweep_param.empty()) throw;
        throw OptionError("sweep", e.what());
      }
    }
    NUMATTN_CHECK_OPTION(o->qkv.empty() == o->layers.empty(), o->qkv.empty() ? "layer" : "qkv",
                         "--qkv DIR and --layer L1,L2,... go together");
    const auto cfgs = o->pf.expand();
    std::vector<CapturedLayer> captures;
    if (!o->qkv.empty()) {
      refuse_flags(o->pf, ProblemFlags::input_flags(), "--qkv", "the capture fixes the inputs and their shape");
      for (const std::string& l : split_list(o->layers)) {
        std::size_t pos = 0;
        long long v = -1;
        try {
          v = std::stoll(l, &pos);
        } catch (const std::exception&) {
          pos = 0;
        }
        NUMATTN_CHECK_OPTION(pos == l.size() && pos > 0 && v >= 0, "layer", "'{}' is not a layer index", l);
        captures.push_back(read_capture(o->qkv, v));
      }
    }
    if (distributed_launch()) {
      // Under mpirun: dist.* methods on random shards, one row per (problem, method), rank 0
      // prints (dist_cli.h). No exact.flash baseline: it would need the whole problem.
      NUMATTN_CHECK_OPTION(captures.empty(), "qkv", "is not supported under mpirun");
      if (o->methods.empty() && !o->all) {
        methods.clear();
        for (const char* s : {"dist.ring", "dist.ulysses"}) methods.push_back(create_method(s));
      }
      for (const auto& m : methods) check_dist_method(*m);
      const double sgemm = blas::measure_sgemm_gflops(o->gemm_size, std::max(3, o->reps), ctx.num_threads());
      std::vector<Row> rows;
      for (const ProblemConfig& c : cfgs)
        for (const auto& m : methods) {
          ProblemConfig cm = c;
          cm.want_lse = m->info().caps.lse;
          Row r = run_distributed(*m, cm, nullptr, ctx, o->reps, o->check_rows, "", "");
          // Efficiency against this rank's sgemm: the job's rate over R ranks' GEMM rates.
          r["efficiency"] = r["gflops"].get<double>() / (sgemm * r["ranks"].get<double>());
          rows.push_back(r);
        }
      if (dist_rank() == 0) print_table(std::cout, rows, parse_format(o->format));
      return;
    }
    const auto flash = create_method("exact.flash");

    const double sgemm = blas::measure_sgemm_gflops(o->gemm_size, std::max(3, o->reps), ctx.num_threads());
    // The memory side of each method's model: streaming reads from a buffer well beyond the
    // last-level cache (4 × its size, at least 64 MiB), same run, same threads.
    const std::uint64_t bw_bytes = std::max<std::uint64_t>(64ull << 20, 4 * last_level_cache_bytes());
    const double bandwidth = measure_read_bandwidth(bw_bytes, std::max(3, o->reps), ctx);
    std::vector<Row> rows;
    Row g;
    g["method"] = "blas.sgemm";
    g["n"] = o->gemm_size;
    g["threads"] = ctx.num_threads();
    g["gflops"] = sgemm;
    g["efficiency"] = 1.0;
    // The machine's two rates of the run, on the one baseline row: sgemm and streaming reads.
    g["read_gbytes_per_s"] = bandwidth * 1e-9;
    g["status"] = fmt::format("ok: {}; streaming read of {} MiB", blas::library_name(), bw_bytes >> 20);
    rows.push_back(g);
    std::size_t done = 0;
    const std::size_t n_inputs = captures.empty() ? 1 : captures.size();
    const std::size_t total = n_inputs * cfgs.size() * methods.size();
    for (std::size_t in = 0; in < n_inputs; ++in) {
      for (const ProblemConfig& c : cfgs) {
        BenchProblem prob;
        if (captures.empty()) {
          prob.random = std::make_unique<RandomProblem>(c);
          prob.source = random_source(c);
        } else {
          const CapturedLayer& cl = captures[in];
          prob.file = std::make_unique<FileProblem>(cl.q, std::array<index_t, 4>{1, cl.heads, cl.n, cl.d},
                                                    cl.k, std::array<index_t, 4>{1, cl.kv_heads, cl.n, cl.d},
                                                    cl.v, std::array<index_t, 4>{1, cl.kv_heads, cl.n, cl.d}, c);
          prob.source = cl.source();
        }
        AttentionProblem& p = prob.problem();
        const std::size_t first = rows.size();
        double flash_ms = std::nan("");
        for (std::size_t mi = 0; mi < methods.size(); ++mi) {
          const auto& m = methods[mi];
          prob.set_lse(m->info().caps.lse);
          std::fprintf(stderr, "\r[%zu/%zu] %s n=%lld d=%lld ...", ++done, total, m->spec().c_str(),
                       static_cast<long long>(p.n_q()), static_cast<long long>(p.d_qk()));
          Row r = run_method_row(*m, p, problem_row(*m, p, ctx, prob.seed(), prob.source), ctx,
                                 o->reps, o->check_rows, prob.check_seed(), o->est);
          if (r.contains("gflops")) r["efficiency"] = r["gflops"].get<double>() / sgemm;
          if (r.contains("time_ms")) {
            // The method's own model (method.h, cost): FLOPs at the sgemm rate, bytes at the read
            // bandwidth, the larger; model_ratio > 2 is a slow implementation or a wrong model.
            const CostModel cm = m->cost(p);
            const double tf = cm.flops / (sgemm * 1e9), tb = cm.bytes / bandwidth;
            r["model_flops"] = cm.flops;
            r["model_bytes"] = cm.bytes;
            r["model_ms"] = 1e3 * std::max(tf, tb);
            r["model_bound"] = tf >= tb ? "flops" : "bytes";
            r["model_ratio"] = r["time_ms"].get<double>() / (1e3 * std::max(tf, tb));
          }
          if (o->recall_k > 0 && o->check_rows > 0 && r["status"].get<std::string>().rfind("ok", 0) == 0) {
            try {
              const RecallMetrics rm = topk_recall(*m, p, o->recall_k, o->check_rows, prob.check_seed(), ctx);
              r["topk_recall"] = rm.recall;
              r["recall_k"] = o->recall_k;
            } catch (const Error& e) {
              r["topk_recall"] = nullptr;
              r["recall_status"] = std::string("failed: ") + e.what();
            }
          }
          if (!sweep_param.empty()) {
            r["sweep_param"] = sweep_param;
            r["sweep_value"] = sweep_values[mi];
          }
          // exact.flash at its defaults is the baseline itself: its time is reused.
          if (m->spec() == flash->spec() && r.contains("time_ms")) flash_ms = r["time_ms"].get<double>();
          rows.push_back(r);
        }
        if (std::isnan(flash_ms)) {
          // The baseline, timed once for this problem as its own row would be.
          prob.set_lse(flash->info().caps.lse);
          std::fprintf(stderr, "\r[baseline] %s n=%lld ...", flash->spec().c_str(),
                       static_cast<long long>(p.n_q()));
          if (flash->can_run(p).is_ok()) {
            try {
              flash_ms = time_median_ms(o->reps, [&] { flash->run(p, ctx); });
            } catch (const Error&) {
              // No baseline for this problem: speedup_vs_exact stays null.
            }
          }
        }
        for (std::size_t i = first; i < rows.size(); ++i) {
          Row& r = rows[i];
          r["speedup_vs_exact"] = r.contains("time_ms") && !std::isnan(flash_ms)
                                      ? Row(flash_ms / r["time_ms"].get<double>())
                                      : Row();
        }
      }
    }
    std::fprintf(stderr, "\r%60s\r", "");
    print_table(std::cout, rows, parse_format(o->format));
  });
}

NUMATTN_COMMAND(30, add_bench);

}  // namespace numattn::cli
