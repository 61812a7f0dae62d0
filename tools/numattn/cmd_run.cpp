#include <iostream>
#include <map>
#include <memory>

#include "cli_common.h"
#include "commands.h"
#include "dist_cli.h"
#include "numattn/analysis/metrics.h"
#include "numattn/attention/reference.h"
#include "numattn/attention/registry.h"
#include "numattn/core/blas.h"
#include "numattn/core/file_io.h"
#include "numattn/core/npy.h"
#include "qkv_source.h"

namespace numattn::cli {

namespace {

struct RunOptions {
  std::string method = "exact.flash";
  ProblemFlags pf;
  int threads = 0;
  std::string format = "json";
  int reps = 1;
  long long check_rows = -1;
  EstimateFlags est;
  std::string q, k, v, mask, out, lse_out, qkv;
  std::int64_t layer = -1;
  bool no_lse = false;
  /// Whether to request the log-sum-exp from `method`.
  bool want_lse(const AttentionMethod& method) const { return method.info().caps.lse && !no_lse; }
};

// Reads a .npy as a [B, H, N, D] tensor (2-d and 3-d files get leading 1s).
std::array<index_t, 4> shape4(const npy::Array& a, const std::string& what) {
  NUMATTN_CHECK(a.shape.size() >= 2 && a.shape.size() <= 4,
                "--{}: expected a 2-, 3- or 4-d array ([N,D], [H,N,D] or [B,H,N,D]), got {} dims",
                what, a.shape.size());
  std::array<index_t, 4> s{1, 1, 1, 1};
  std::copy(a.shape.begin(), a.shape.end(), s.begin() + (4 - a.shape.size()));
  return s;
}

void write_outputs(const RunOptions& o, const AttentionProblem& p, Layout layout) {
  const auto& s = p.out.shape;
  if (!o.out.empty()) {
    std::vector<float> buf(static_cast<std::size_t>(p.out.numel()));
    std::vector<std::int64_t> shape = layout == Layout::kBHND
                                          ? std::vector<std::int64_t>{s[0], s[1], s[2], s[3]}
                                          : std::vector<std::int64_t>{s[0], s[2], s[1], s[3]};
    auto dst = layout == Layout::kBHND ? TensorView<float>::contiguous(buf.data(), s)
                                       : TensorView<float>::bnhd(buf.data(), s[0], s[1], s[2], s[3]);
    for (index_t b = 0; b < s[0]; ++b)
      for (index_t h = 0; h < s[1]; ++h)
        for (index_t i = 0; i < s[2]; ++i)
          for (index_t d = 0; d < s[3]; ++d) dst(b, h, i, d) = p.out(b, h, i, d);
    npy::write(o.out, shape, buf.data());
  }
  if (!o.lse_out.empty()) {
    std::vector<float> buf(static_cast<std::size_t>(s[0] * s[1] * s[2]));
    for (index_t b = 0; b < s[0]; ++b)
      for (index_t h = 0; h < s[1]; ++h)
        for (index_t i = 0; i < s[2]; ++i) buf[static_cast<std::size_t>((b * s[1] + h) * s[2] + i)] = p.lse(b, h, i, 0);
    npy::write(o.lse_out, {s[0], s[1], s[2]}, buf.data());
  }
}

void run_files(const RunOptions& o, const AttentionMethod& method, const ExecContext& ctx,
               const std::string& source) {
  NUMATTN_CHECK(!o.q.empty() && !o.k.empty() && !o.v.empty(), "--q, --k and --v must be given together");
  const double logit_scale = std::stod(o.pf.logit_scale);
  const Layout layout = parse_layout(o.pf.layout);
  std::map<std::string, std::size_t> rank;  // dims of each input file, to name its elements
  auto load = [&](const std::string& path, const char* what, std::vector<float>& buf) {
    npy::Array a = npy::read(path);
    auto s = shape4(a, what);
    rank[what] = a.shape.size();
    buf = a.as_f32();
    // Files in BNHD order hold [B, N, H, D].
    return layout == Layout::kBHND ? TensorView<const float>::contiguous(buf.data(), s)
                                   : TensorView<const float>(TensorView<float>::bnhd(buf.data(), s[0], s[2], s[1], s[3]));
  };
  std::vector<float> qb, kb, vb, ob, lb, addm;
  std::vector<std::uint8_t> boolm;
  AttentionProblem p;
  p.q = load(o.q, "q", qb);
  if (logit_scale != 1.0)
    for (float& x : qb) x = static_cast<float>(x * logit_scale);
  p.k = load(o.k, "k", kb);
  p.v = load(o.v, "v", vb);
  const std::array<index_t, 4> os{p.q.shape[0], p.q.shape[1], p.q.shape[2], p.v.shape[3]};
  ob.assign(static_cast<std::size_t>(os[0] * os[1] * os[2] * os[3]), 0.f);
  lb.assign(static_cast<std::size_t>(os[0] * os[1] * os[2]), 0.f);
  p.out = layout == Layout::kBHND ? TensorView<float>::contiguous(ob.data(), os)
                                  : TensorView<float>::bnhd(ob.data(), os[0], os[1], os[2], os[3]);
  if (o.want_lse(method)) p.lse = TensorView<float>::contiguous(lb.data(), {os[0], os[1], os[2], 1});
  p.causal = parse_causal(o.pf.causal);
  if (!o.pf.scale.empty()) p.scale = std::stod(o.pf.scale);
  p.window_left = std::stoll(o.pf.window_left);
  p.window_right = std::stoll(o.pf.window_right);
  if (!o.mask.empty()) {
    npy::Array m = npy::read(o.mask);
    NUMATTN_CHECK(m.shape.size() == 2 && m.shape[0] == p.n_q() && m.shape[1] == p.n_kv(),
                  "--mask must be a [Nq, Nk] = [{}, {}] array", p.n_q(), p.n_kv());
    if (m.dtype == npy::DType::kInt64) {
      boolm.resize(m.i64.size());
      for (std::size_t i = 0; i < boolm.size(); ++i) boolm[i] = m.i64[i] != 0;
      p.mask = {MaskKind::kBool, boolm.data(), nullptr, p.n_kv()};
    } else {
      addm = m.as_f32();
      p.mask = {MaskKind::kAdditive, nullptr, addm.data(), p.n_kv()};
    }
  }
  validate(p);
  double ms = 0;
  try {
    ms = time_median_ms(o.reps, [&] { method.run(p, ctx); });
  } catch (const NonFiniteInput& e) {
    // Name the element as the file holds it: its own rank, and [B,N,H,D] order with bnhd.
    std::vector<index_t> at = e.index();
    std::string file = o.mask;
    if (e.tensor() != "mask") {
      file = e.tensor() == "q" ? o.q : e.tensor() == "k" ? o.k : o.v;
      if (layout == Layout::kBNHD) std::swap(at[1], at[2]);
      at.erase(at.begin(), at.begin() + static_cast<std::ptrdiff_t>(4 - rank.at(e.tensor())));
    }
    std::string idx;
    for (index_t x : at) idx += (idx.empty() ? "" : ",") + std::to_string(x);
    throw Error(fmt::format("{} (element [{}] of {})", e.what(), idx, file));
  }
  Row row = problem_row(method, p, ctx, nullptr, source);
  row["time_ms"] = ms;
  row["gflops"] = method.flops(p) / (ms * 1e-3) * 1e-9;
  const std::string status = add_error_columns(row, p, method.target(), rows_to_check(p, o.check_rows), 12345, ctx);
  add_estimate_columns(row, p, o.est, 12345, ctx);
  row["workspace_bytes"] = method.workspace_bytes(p, ctx);
  row["status"] = status;
  NUMATTN_CHECK(status == "ok", "{}", status.substr(8));  // "failed: ..."
  write_outputs(o, p, layout);
  print_table(std::cout, {row}, parse_format(o.format), true);
}

// Under mpirun: a dist.* method, each rank holding only its shard (dist_cli.h); rank 0 prints.
void run_under_mpi(const RunOptions& o, const AttentionMethod& method, const ExecContext& ctx) {
  check_dist_method(method);
  NUMATTN_CHECK_OPTION(o.qkv.empty(), "qkv", "is not supported under mpirun: give --q/--k/--v");
  NUMATTN_CHECK_OPTION(o.mask.empty(), "mask", "is not supported under mpirun yet");
  ProblemConfig cfg;
  DistFiles files;
  const bool from_files = !o.q.empty() || !o.k.empty() || !o.v.empty();
  if (from_files) {
    NUMATTN_CHECK(!o.q.empty() && !o.k.empty() && !o.v.empty(), "--q, --k and --v must be given together");
    refuse_flags(o.pf, ProblemFlags::input_flags(), "--q/--k/--v", "the files fix the inputs and their shape");
    files = {o.q, o.k, o.v, parse_layout(o.pf.layout), std::stod(o.pf.logit_scale),
             parse_causal(o.pf.causal), std::nullopt, std::stoll(o.pf.window_left), std::stoll(o.pf.window_right)};
    if (!o.pf.scale.empty()) files.scale = std::stod(o.pf.scale);
  } else {
    auto cfgs = o.pf.expand();
    NUMATTN_CHECK(cfgs.size() == 1, "run takes one value per problem flag (use bench for lists)");
    cfg = cfgs[0];
  }
  cfg.want_lse = o.want_lse(method);
  Row row = run_distributed(method, cfg, from_files ? &files : nullptr, ctx, o.reps, o.check_rows, o.out, o.lse_out);
  const std::string status = row["status"].get<std::string>();
  NUMATTN_CHECK(status == "ok", "{}", status.rfind("failed: ", 0) == 0 ? status.substr(8) : status);
  if (dist_rank() == 0) print_table(std::cout, {row}, parse_format(o.format), true);
}

}  // namespace

void add_run(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  auto* sub = app.add_subcommand(
      "run", "run one method on one problem (random, or --q/--k/--v .npy files) and check it "
             "against the float64 reference");
  sub->add_option("--method", o->method, "method spec, e.g. exact.flash or exact.flash(block_q=32)")
      ->capture_default_str();
  o->pf.add_to(*sub, false);
  add_common(*sub, &o->threads, &o->format);
  sub->add_option("--reps", o->reps, "timed repetitions (median reported)")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  sub->add_option("--check-rows", o->check_rows,
                  "query rows checked against the float64 reference (-1 = all up to 4096 rows, "
                  "else a sample of 1024; 0 = no check)")
      ->check(CLI::Range(-1LL, 1000000000LL))
      ->capture_default_str();
  o->est.add_to(*sub);
  sub->add_option("--q", o->q, "query .npy ([N,D], [H,N,D] or [B,H,N,D]; [B,N,H,D] with --layout bnhd)");
  sub->add_option("--k", o->k, "key .npy");
  sub->add_option("--v", o->v, "value .npy");
  sub->add_option("--qkv", o->qkv,
                  "a `numattn capture` directory: the problem is layer --layer's captured q/k/v "
                  "(manifest checked; shape flags are refused, --causal/--scale/--logit-scale/"
                  "--window-* apply)");
  sub->add_option("--layer", o->layer, "the captured layer to run (with --qkv)");
  sub->add_option("--mask", o->mask, "[Nq,Nk] mask .npy: float = additive, int64 = boolean (nonzero = visible)");
  sub->add_option("--out", o->out, "write the output to this .npy (same layout as the inputs)");
  sub->add_option("--lse-out", o->lse_out, "write the natural-log LSE [B,H,Nq] to this .npy");
  sub->add_flag("--no-lse", o->no_lse,
                "do not request the log-sum-exp (lse_max_abs_error is then null); an LSE beyond "
                "the float32 range is refused, the output itself is not");
  sub->callback([o, sub] {
    check_output_options(
        *sub, {{"--out", o->out, OutputKind::kFile}, {"--lse-out", o->lse_out, OutputKind::kFile}},
        {{"--q", o->q}, {"--k", o->k}, {"--v", o->v}, {"--mask", o->mask}});
    NUMATTN_CHECK(!o->no_lse || o->lse_out.empty(), "--lse-out needs the LSE: drop --no-lse");
    ExecContext ctx{o->threads};
    auto method = create_method(o->method);
    NUMATTN_CHECK_OPTION(o->lse_out.empty() || method->info().caps.lse, "lse-out",
                         "{} gives no LSE (capability `lse` absent in `numattn methods`)", method->spec());
    if (distributed_launch()) {
      run_under_mpi(*o, *method, ctx);
      return;
    }
    NUMATTN_CHECK_OPTION(o->qkv.empty() == (o->layer < 0), o->qkv.empty() ? "layer" : "qkv",
                         "--qkv DIR and --layer L (>= 0) go together");
    if (!o->qkv.empty()) {
      for (const auto& [flag, val] : {std::pair<std::string, std::string>{"--q", o->q}, {"--k", o->k}, {"--v", o->v}})
        if (!val.empty())
          throw OptionError(flag.substr(2), "cannot be combined with --qkv: the capture holds q, k and v");
      refuse_flags(o->pf, ProblemFlags::input_flags(), "--qkv", "the capture fixes the inputs and their shape");
      refuse_flags(o->pf, {"--layout"}, "--qkv", "capture files are [H,N,D]");
      const CapturedLayer c = read_capture(o->qkv, o->layer);
      check_outputs_distinct({{"--out", o->out}, {"--lse-out", o->lse_out}},
                             {{"--qkv q", c.q_path}, {"--qkv k", c.k_path}, {"--qkv v", c.v_path}});
      RunOptions f = *o;
      f.q = c.q_path;
      f.k = c.k_path;
      f.v = c.v_path;
      run_files(f, *method, ctx, c.source());
      return;
    }
    if (!o->q.empty() || !o->k.empty() || !o->v.empty()) {
      refuse_flags(o->pf, ProblemFlags::input_flags(), "--q/--k/--v", "the files fix the inputs and their shape");
      run_files(*o, *method, ctx, "files " + o->q + " " + o->k + " " + o->v);
      return;
    }
    auto cfgs = o->pf.expand();
    NUMATTN_CHECK(cfgs.size() == 1, "run takes one value per problem flag (use bench for lists)");
    ProblemConfig cfg = cfgs[0];
    cfg.want_lse = o->want_lse(*method);
    RandomProblem prob(cfg);
    Row row = run_method_row(*method, prob, ctx, o->reps, o->check_rows, o->est);
    const std::string status = row["status"].get<std::string>();
    NUMATTN_CHECK(status == "ok", "{}", status.rfind("failed: ", 0) == 0 ? status.substr(8) : status);
    write_outputs(*o, prob.problem(), cfg.layout);
    print_table(std::cout, {row}, parse_format(o->format), true);
  });
}

NUMATTN_COMMAND(20, add_run);

}  // namespace numattn::cli
