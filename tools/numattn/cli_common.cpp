#include "cli_common.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "numattn/analysis/metrics.h"
#include "numattn/attention/reference.h"
#include "numattn/core/blas.h"

namespace numattn::cli {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= s.size()) {
    std::size_t c = s.find(',', start);
    if (c == std::string::npos) c = s.size();
    std::string item = s.substr(start, c - start);
    if (!item.empty()) out.push_back(item);
    start = c + 1;
  }
  return out;
}

void add_common(CLI::App& app, int* threads, std::string* format) {
  app.add_option("--threads", *threads,
                 fmt::format("threads, 1..{} (default 0: all {} cores)", max_threads(),
                             hardware_threads()))
      ->check(CLI::Range(0, max_threads()));
  if (format)
    app.add_option("--format", *format, "output format: md, csv or json")
        ->check(CLI::IsMember({"md", "csv", "json"}));
}

void ProblemFlags::add_to(CLI::App& app, bool lists) {
  const std::string l = lists ? " (comma-separated list)" : "";
  app.add_option("--batch", batch, "batch size B" + l)->capture_default_str();
  app.add_option("--heads", heads, "query heads Hq" + l)->capture_default_str();
  app.add_option("--kv-heads", kv_heads, "key/value heads Hkv (0 = Hq)" + l)->capture_default_str();
  app.add_option("--n", n, "query tokens Nq" + l)->capture_default_str();
  app.add_option("--n-kv", n_kv, "key tokens Nk (0 = Nq)" + l)->capture_default_str();
  app.add_option("--d", d, "head dimension Dk" + l)->capture_default_str();
  app.add_option("--dv", dv, "value dimension Dv (0 = Dk)" + l)->capture_default_str();
  app.add_option("--causal", causal, "none | top-left | bottom-right" + l)->capture_default_str();
  app.add_option("--scale", scale, "softmax scale (default 1/sqrt(Dk))" + l);
  app.add_option("--seed", seed, "RNG seed of the inputs" + l)->capture_default_str();
  app.add_option("--dist", dist, "input distribution: gaussian | spiky | uniform" + l)
      ->capture_default_str();
  app.add_option("--logit-scale", logit_scale, "multiply q (so the logits) by X" + l)
      ->capture_default_str();
  app.add_option("--layout", layout, "memory layout of q/k/v/out: bhnd | bnhd" + l)
      ->capture_default_str();
  app.add_option("--window-left", window_left, "sliding window, keys left of the diagonal (-1 = all)" + l)
      ->capture_default_str();
  app.add_option("--window-right", window_right, "sliding window, keys right of the diagonal (-1 = all)" + l)
      ->capture_default_str();
}

namespace {
template <class T, class F>
std::vector<T> parse_list(const std::string& flag, const std::string& s, F conv) {
  std::vector<T> out;
  for (const std::string& item : split_list(s)) {
    try {
      std::size_t pos = 0;
      out.push_back(conv(item, &pos));
      if (pos != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw Error(fmt::format("--{}: '{}' is not a valid number", flag, item));
    }
  }
  NUMATTN_CHECK(!out.empty(), "--{} needs at least one value", flag);
  return out;
}
std::vector<long long> ints(const std::string& flag, const std::string& s) {
  return parse_list<long long>(flag, s, [](const std::string& x, std::size_t* p) { return std::stoll(x, p); });
}
std::vector<double> reals(const std::string& flag, const std::string& s) {
  return parse_list<double>(flag, s, [](const std::string& x, std::size_t* p) { return std::stod(x, p); });
}
}  // namespace

std::vector<ProblemConfig> ProblemFlags::expand() const {
  auto B = ints("batch", batch), H = ints("heads", heads), Hk = ints("kv-heads", kv_heads),
       N = ints("n", n), Nk = ints("n-kv", n_kv), D = ints("d", d), Dv = ints("dv", dv),
       S = ints("seed", seed), WL = ints("window-left", window_left),
       WR = ints("window-right", window_right);
  auto LS = reals("logit-scale", logit_scale);
  std::vector<double> SC;
  if (!scale.empty()) SC = reals("scale", scale);
  else SC = {std::nan("")};
  std::vector<Causal> C;
  for (auto& c : split_list(causal)) C.push_back(parse_causal(c));
  std::vector<Dist> DI;
  for (auto& x : split_list(dist)) DI.push_back(parse_dist(x));
  std::vector<Layout> LA;
  for (auto& x : split_list(layout)) {
    if (x == "bhnd") LA.push_back(Layout::kBHND);
    else if (x == "bnhd") LA.push_back(Layout::kBNHD);
    else throw Error(fmt::format("--layout: unknown layout '{}' (valid: bhnd, bnhd)", x));
  }
  std::vector<ProblemConfig> out;
  for (auto b : B) for (auto h : H) for (auto hk : Hk) for (auto n_ : N) for (auto nk : Nk)
  for (auto d_ : D) for (auto dv_ : Dv) for (auto c : C) for (auto sc : SC) for (auto s : S)
  for (auto di : DI) for (auto ls : LS) for (auto la : LA) for (auto wl : WL) for (auto wr : WR) {
    ProblemConfig cfg;
    cfg.batch = b; cfg.heads = h; cfg.kv_heads = hk; cfg.n = n_; cfg.n_kv = nk; cfg.d = d_;
    cfg.dv = dv_; cfg.causal = c;
    if (!std::isnan(sc)) cfg.scale = sc;
    NUMATTN_CHECK(s >= 0, "--seed must be >= 0");
    cfg.seed = static_cast<std::uint64_t>(s); cfg.dist = di; cfg.logit_scale = ls; cfg.layout = la;
    cfg.window_left = wl; cfg.window_right = wr;
    out.push_back(cfg);
  }
  return out;
}

double time_median_ms(int reps, const std::function<void()>& fn) {
  fn();  // warm-up: page faults, caches, lazy allocations
  std::vector<double> t;
  for (int r = 0; r < std::max(1, reps); ++r) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(std::move(t));
}

double median(std::vector<double> v) {
  NUMATTN_ASSERT(!v.empty());
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

index_t rows_to_check(const AttentionProblem& p, long long requested) {
  const index_t total = p.batch() * p.heads() * p.n_q();
  if (requested < 0) return total <= 4096 ? total : 1024;
  return std::min<index_t>(requested, total);
}

Row run_method_row(const AttentionMethod& method, RandomProblem& prob, const ExecContext& ctx,
                   int reps, long long check_rows) {
  const AttentionProblem& p = prob.problem();
  const ProblemConfig& c = prob.config();
  Row row;
  row["method"] = method.spec();
  row["batch"] = c.batch;
  row["heads"] = c.heads;
  row["kv_heads"] = c.eff_kv_heads();
  row["n"] = c.n;
  row["n_kv"] = c.eff_n_kv();
  row["d"] = c.d;
  row["dv"] = c.eff_dv();
  row["causal"] = to_string(c.causal);
  row["seed"] = c.seed;
  row["threads"] = ctx.num_threads();
  Status st = method.can_run(p);
  if (!st.is_ok()) {
    row["status"] = "skipped: " + st.reason();
    return row;
  }
  double ms = 0;
  try {
    ms = time_median_ms(reps, [&] { method.run(p, ctx); });
  } catch (const Error& e) {
    // A problem the method refuses at run time (problem.h edges) fails its row, not the sweep.
    row["status"] = std::string("failed: ") + e.what();
    return row;
  }
  row["time_ms"] = ms;
  row["gflops"] = attention_flops(p) / (ms * 1e-3) * 1e-9;
  const std::string status =
      add_error_columns(row, p, method.target(), rows_to_check(p, check_rows),
                        c.seed ^ 0x9e3779b97f4a7c15ull, ctx);
  row["workspace_bytes"] = method.workspace_bytes(p, ctx);
  row["status"] = status;
  return row;
}

std::string add_error_columns(Row& row, const AttentionProblem& p, const Target& target, index_t k,
                              std::uint64_t seed, const ExecContext& ctx) {
  row["target"] = target.name();
  for (const char* c : {"target_rel_fro_error", "rel_fro_error", "max_abs_error", "lse_max_abs_error", "nmse"})
    row[c] = nullptr;
  row["rows_checked"] = k;
  if (k <= 0) return "ok";
  const ErrorMetrics m = compare_with_reference(p, reference_sample(p, k, seed, ctx));
  const double target_error =
      target.is_softmax() ? m.rel_fro_error
                          : compare_with_reference(p, reference_sample(p, k, seed, ctx, target)).rel_fro_error;
  row["target_rel_fro_error"] = target_error;
  row["rel_fro_error"] = m.rel_fro_error;
  row["max_abs_error"] = m.max_abs_error;
  row["lse_max_abs_error"] = m.lse_max_abs_error;  // NaN (null) when the method gives no LSE
  row["nmse"] = m.nmse;
  std::string why;
  if (!std::isfinite(m.rel_fro_error) || !std::isfinite(m.max_abs_error) || !std::isfinite(m.nmse) ||
      !std::isfinite(target_error))
    why = "rel_fro_error, max_abs_error and nmse are not finite: the output has NaN or Inf";
  if (!p.lse.empty() && !std::isfinite(m.lse_max_abs_error))
    why += std::string(why.empty() ? "" : "; ") +
           "lse_max_abs_error is not finite: an LSE is NaN, or ±inf where the reference's is not";
  return why.empty() ? "ok" : "failed: " + why;
}

}  // namespace numattn::cli
