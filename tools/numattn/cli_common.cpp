#include "cli_common.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "numattn/analysis/estimate.h"
#include "numattn/analysis/metrics.h"
#include "numattn/attention/reference.h"
#include "numattn/attention/registry.h"
#include "numattn/core/blas.h"
#include "numattn/core/timing.h"
#include "numattn/model/llama.h"

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

std::vector<std::string> split_spec_option(const std::string& option,
                                           const std::string& value,
                                           std::string_view separators) {
  try {
    return split_specs(value, separators);
  } catch (const Error& e) {
    throw OptionError(option, e.what());
  }
}

std::vector<std::string> split_spec_option(const std::string& option,
                                           const std::vector<std::string>& values,
                                           std::string_view separators) {
  std::vector<std::string> out;
  for (const std::string& v : values) {
    std::vector<std::string> part = split_spec_option(option, v, separators);
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

void check_output_options(const CLI::App& app,
                          const std::vector<OutputOption>& outputs,
                          const std::vector<NamedPath>& inputs) {
  std::vector<NamedPath> given;
  for (const OutputOption& o : outputs)
    if (app.count(o.flag) > 0) given.push_back({o.flag, o.path});
  // An output that is an input is the more telling error (it names both), so it comes first.
  check_outputs_distinct(given, inputs);
  for (const OutputOption& o : outputs)
    if (app.count(o.flag) > 0) check_output_option(o.flag, o.path, o.kind);
}

void check_output_option(const std::string& flag, const std::string& path, OutputKind kind) {
  try {
    check_output_path(path, flag, kind);
  } catch (const Error& e) {
    // check_output_path's message starts with the flag, which main prints from the option.
    std::string detail = e.what();
    const std::string prefix = flag + ": ";
    if (detail.rfind(prefix, 0) == 0) detail = detail.substr(prefix.size());
    throw OptionError(flag.substr(2), detail);
  }
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

void add_activations_option(CLI::App& app, std::string* activations, bool list) {
  app.add_option("--activations", *activations,
                 std::string("activations of the products with in-place weights: f32 (float32, "
                             "the default) or q8 (rounded to int8 per block of 32 as llama.cpp "
                             "does; integer kernels for Q8_0/Q4_0/Q4_1 decode products; needs "
                             "--weights gguf)") +
                     (list ? "; a comma-separated list measures each, interleaved" : ""))
      ->capture_default_str();
}

std::vector<Activations> check_activations_option(const std::string& activations,
                                                  const std::string& weights) {
  std::vector<Activations> out;
  for (const std::string& a : split_list(activations)) {
    try {
      out.push_back(parse_activations(a));
    } catch (const Error& e) {
      throw OptionError("activations", e.what());
    }
    NUMATTN_CHECK_OPTION(out.back() == Activations::kF32 || weights != "f32", "activations",
                         "q8 needs weights in their GGUF encoding (--weights gguf): float32 "
                         "weights (--weights f32) are the exactness reference and always take "
                         "float32 activations");
  }
  NUMATTN_CHECK_OPTION(!out.empty(), "activations", "is empty");
  return out;
}

void ProblemFlags::add_to(CLI::App& app, bool lists) {
  const std::string l = lists ? " (comma-separated list)" : "";
  options_.push_back(app.add_option("--batch", batch, "batch size B" + l)->capture_default_str());
  options_.push_back(app.add_option("--heads", heads, "query heads Hq" + l)->capture_default_str());
  options_.push_back(app.add_option("--kv-heads", kv_heads, "key/value heads Hkv (0 = Hq)" + l)->capture_default_str());
  options_.push_back(app.add_option("--n", n, "query tokens Nq" + l)->capture_default_str());
  options_.push_back(app.add_option("--n-kv", n_kv, "key tokens Nk (0 = Nq)" + l)->capture_default_str());
  options_.push_back(app.add_option("--d", d, "head dimension Dk" + l)->capture_default_str());
  options_.push_back(app.add_option("--dv", dv, "value dimension Dv (0 = Dk)" + l)->capture_default_str());
  options_.push_back(app.add_option("--causal", causal, "none | top-left | bottom-right" + l)->capture_default_str());
  options_.push_back(app.add_option("--scale", scale, "softmax scale (default 1/sqrt(Dk))" + l));
  options_.push_back(app.add_option("--seed", seed, "RNG seed of the inputs" + l)->capture_default_str());
  options_.push_back(app.add_option("--dist", dist, "input distribution: gaussian | spiky | uniform" + l)
      ->capture_default_str());
  options_.push_back(app.add_option("--logit-scale", logit_scale, "multiply q (so the logits) by X" + l)
      ->capture_default_str());
  options_.push_back(app.add_option("--layout", layout, "memory layout of q/k/v/out: bhnd | bnhd" + l)
      ->capture_default_str());
  options_.push_back(app.add_option("--window-left", window_left, "sliding window, keys left of the diagonal (-1 = all)" + l)
      ->capture_default_str());
  options_.push_back(app.add_option("--window-right", window_right, "sliding window, keys right of the diagonal (-1 = all)" + l)
      ->capture_default_str());
}

std::vector<std::string> ProblemFlags::given(const std::vector<std::string>& flags) const {
  std::vector<std::string> out;
  for (const std::string& f : flags)
    for (const CLI::Option* opt : options_)
      if (opt->check_lname(f.substr(2)) && opt->count() > 0) out.push_back(f);
  return out;
}

const std::vector<std::string>& ProblemFlags::input_flags() {
  static const std::vector<std::string> f{"--batch", "--heads", "--kv-heads", "--n", "--n-kv",
                                          "--d",     "--dv",    "--seed",     "--dist"};
  return f;
}

void refuse_flags(const ProblemFlags& pf, const std::vector<std::string>& flags, const std::string& with,
                  const std::string& why) {
  const auto g = pf.given(flags);
  if (!g.empty())
    throw OptionError(g[0].substr(2), fmt::format("cannot be combined with {}: {}", with, why));
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
// Finite values only: NaN stands for "no --scale" below, and an infinity would poison q.
std::vector<double> reals(const std::string& flag, const std::string& s) {
  std::vector<double> out =
      parse_list<double>(flag, s, [](const std::string& x, std::size_t* p) { return std::stod(x, p); });
  for (double v : out) NUMATTN_CHECK(std::isfinite(v), "--{}: {} is not a finite number", flag, v);
  return out;
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
  for (auto& x : split_list(layout)) LA.push_back(parse_layout(x));
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
  return 1e3 * median_seconds(reps, fn);
}

index_t rows_to_check(const AttentionProblem& p, long long requested) {
  const index_t total = p.batch() * p.heads() * p.n_q();
  if (requested < 0) return total <= 4096 ? total : 1024;
  return std::min<index_t>(requested, total);
}

Row problem_row(const AttentionMethod& method, const AttentionProblem& p, const ExecContext& ctx,
                const Row& seed, const std::string& source) {
  Row row;
  row["method"] = method.spec();
  row["batch"] = p.batch();
  row["heads"] = p.heads();
  row["kv_heads"] = p.kv_heads();
  row["n"] = p.n_q();
  row["n_kv"] = p.n_kv();
  row["d"] = p.d_qk();
  row["dv"] = p.d_v();
  row["causal"] = to_string(p.causal);
  row["seed"] = seed;
  row["source"] = source;
  row["threads"] = ctx.num_threads();
  return row;
}

std::string random_source(const ProblemConfig& c) { return std::string("random ") + to_string(c.dist); }

void EstimateFlags::add_to(CLI::App& app) {
  app.add_option("--est-rows", rows,
                 "rows computed exactly in float64 for the a-posteriori error estimate "
                 "(est_rel_error, its upper bound est_rel_error_hi at --est-level; sampled across "
                 "heads and row positions; -1 = automatic: max(32, sqrt(B*Hq*Nq)); 0 = off)")
      ->check(CLI::Range(-1LL, 1000000000LL))
      ->capture_default_str();
  app.add_option("--est-seed", seed,
                 "seed of the estimate's row design (-1 = derived from the problem: the same rows for "
                 "every method on it)")
      ->check(CLI::Range(-1LL, 9223372036854775807LL))
      ->capture_default_str();
  app.add_option("--est-level", level, "one-sided confidence level of est_rel_error_hi")
      ->check(CLI::Range(0.5, 0.999999))
      ->capture_default_str();
}

void add_estimate_columns(Row& row, const AttentionProblem& p, const EstimateFlags& f,
                          std::uint64_t seed, const ExecContext& ctx) {
  if (f.rows == 0) return;
  ErrorEstimate e;
  try {
    const std::uint64_t s = f.seed >= 0 ? static_cast<std::uint64_t>(f.seed) : seed ^ 0xe5717a7e5ull;
    e = estimate_error(p, {std::max(0LL, f.rows), f.level, s}, ctx);
  } catch (const NonFiniteInput&) {
    // A sampled row reads an input the method did not (a key outside its window): no estimate.
    e.rel_error = e.rel_error_hi = std::nan("");
    e.level = f.level;
  }
  row["est_rel_error"] = e.rel_error;  // NaN / inf print as null (report.h)
  row["est_rel_error_hi"] = e.rel_error_hi;
  row["est_rows"] = e.rows;
  row["est_level"] = e.level;
}

Row run_method_row(const AttentionMethod& method, const AttentionProblem& p, Row row,
                   const ExecContext& ctx, int reps, long long check_rows, std::uint64_t check_seed,
                   const EstimateFlags& est) {
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
  row["gflops"] = method.flops(p) / (ms * 1e-3) * 1e-9;
  const std::string status =
      add_error_columns(row, p, method.target(), rows_to_check(p, check_rows), check_seed, ctx);
  add_estimate_columns(row, p, est, check_seed, ctx);
  row["workspace_bytes"] = method.workspace_bytes(p, ctx);
  row["status"] = status;
  return row;
}

Row run_method_row(const AttentionMethod& method, RandomProblem& prob, const ExecContext& ctx,
                   int reps, long long check_rows, const EstimateFlags& est) {
  const ProblemConfig& c = prob.config();
  return run_method_row(method, prob.problem(),
                        problem_row(method, prob.problem(), ctx, c.seed, random_source(c)), ctx,
                        reps, check_rows, c.seed ^ 0x9e3779b97f4a7c15ull, est);
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

void check_model_attention(const std::string& option, const std::string& specs, const ModelHParams& hp,
                           index_t n_q, index_t n_kv, const std::string& what) {
  AttentionMethods methods;
  try {
    methods = make_attention_methods(specs, hp.n_layer, hp.local_layers);
  } catch (const OptionError&) {
    throw;
  } catch (const Error& e) {
    throw OptionError(option, e.what());
  }
  const index_t heads = hp.n_head, kv_heads = hp.n_head_kv, head_dim = hp.head_dim;
  std::vector<float> q(static_cast<std::size_t>(heads * n_q * head_dim)),
      kv(static_cast<std::size_t>(kv_heads * n_kv * head_dim)),
      out(static_cast<std::size_t>(heads * n_q * head_dim));
  AttentionProblem p;
  p.q = TensorView<const float>::contiguous(q.data(), {1, heads, n_q, head_dim});
  p.k = TensorView<const float>::contiguous(kv.data(), {1, kv_heads, n_kv, head_dim});
  p.v = p.k;
  p.out = TensorView<float>::contiguous(out.data(), {1, heads, n_q, head_dim});
  p.causal = Causal::kBottomRight;  // as the forward pass (model/llama.h)
  if (hp.attn_scale > 0) p.scale = hp.attn_scale;
  const bool one = split_spec_list(specs).size() == 1;
  for (std::size_t l = 0; l < methods.size(); ++l) {
    const bool local = hp.is_local(static_cast<std::int64_t>(l));
    p.window_left = local ? hp.sliding_window - 1 : -1;
    const Status st = methods[l]->can_run(p);
    if (st.is_ok()) continue;
    const std::string layer =
        one ? fmt::format("{} of the model (the spec applies to all {} layers)",
                          hp.local_layers.empty() ? "any layer" : fmt::format("layer {}", l), hp.n_layer)
            : fmt::format("layer {} of the model", l);
    const std::string window =
        local ? fmt::format(", the layer's sliding window of {} keys (window_left = {}); `global:SPEC` replaces the "
                            "global layers only",
                            hp.sliding_window, hp.sliding_window - 1)
              : "";
    throw OptionError(
        option, fmt::format("{} cannot run {}: {} (the {} attention problem: causal bottom-right, "
                            "{} query heads over {} KV heads, head dim {}, {} queries over {} keys{})",
                            methods[l]->spec(), layer, st.reason(), what, heads, kv_heads,
                            head_dim, n_q, n_kv, window));
  }
}

}  // namespace numattn::cli
