// numattn advise: the fastest registered approximate method (and parameters) whose estimated
// error bound meets a tolerance on this input, measured (analysis/advise.h).
#include <iostream>
#include <memory>
#include <optional>

#include "cli_common.h"
#include "commands.h"
#include "numattn/analysis/advise.h"
#include "numattn/core/progress.h"
#include "qkv_source.h"

namespace numattn::cli {

namespace {

struct AdviseCliOptions {
  double tol = -1;
  ProblemFlags pf;
  EstimateFlags est;
  int threads = 0;
  int reps = 3;
  std::string format = "md";
  std::string qkv;
  std::int64_t layer = -1;
  std::vector<std::string> methods;
  bool no_progress = false;
};

Row candidate_row(const AdviseCandidate& c) {
  Row r;
  r["spec"] = c.spec;
  r["kind"] = c.kind;
  r["meets"] = c.meets;
  r["seconds"] = c.seconds;
  r["speedup_vs_exact"] = c.speedup_vs_exact;
  r["est_rel_error"] = c.estimate.rel_error;
  r["est_rel_error_hi"] = c.estimate.rel_error_hi;
  r["est_rows"] = c.estimate.rows;
  r["est_level"] = c.estimate.level;
  r["status"] = c.status;
  return r;
}

void print_advice(const Advice& a, const std::string& source, const AttentionProblem& p, Format f) {
  const AdviseCandidate* c = a.chosen();
  if (f == Format::kJson) {
    Row out;
    out["tol"] = a.tol;
    out["source"] = source;
    out["problem"] = {{"batch", p.batch()}, {"heads", p.heads()}, {"kv_heads", p.kv_heads()},
                      {"n", p.n_q()},       {"n_kv", p.n_kv()},   {"d", p.d_qk()},
                      {"dv", p.d_v()},      {"causal", to_string(p.causal)}};
    out["choice"] = c ? candidate_row(*c) : Row();
    out["baseline"] = candidate_row(a.baseline);
    out["candidates"] = Row::array();
    for (const AdviseCandidate& x : a.candidates) out["candidates"].push_back(candidate_row(x));
    std::cout << dump_json(out, 2) << "\n";
    return;
  }
  std::vector<Row> rows{candidate_row(a.baseline)};
  for (const AdviseCandidate& x : a.candidates) rows.push_back(candidate_row(x));
  if (f == Format::kMarkdown) {
    std::cout << fmt::format("tol {:g} on {} (B={} Hq={} Hkv={} Nq={} Nk={} D={} causal {})\n", a.tol, source,
                             p.batch(), p.heads(), p.kv_heads(), p.n_q(), p.n_kv(), p.d_qk(), to_string(p.causal));
    if (c)
      std::cout << fmt::format("choice: {} (est_rel_error {:.3g}, est_rel_error_hi {:.3g} <= {:g} at level {:g}; "
                               "{:.4g} s, {:.2f}x exact.flash)\n\n",
                               c->spec, c->estimate.rel_error, c->estimate.rel_error_hi, a.tol, c->estimate.level,
                               c->seconds, c->speedup_vs_exact);
    else
      std::cout << fmt::format("choice: none (no approximation of the {} tried has est_rel_error_hi <= {:g} and "
                               "beats exact.flash's {:.4g} s: use exact.flash)\n\n",
                               a.candidates.size(), a.tol, a.baseline.seconds);
  }
  print_table(std::cout, rows, f);
}

}  // namespace

void add_advise(CLI::App& app) {
  auto o = std::make_shared<AdviseCliOptions>();
  auto* sub = app.add_subcommand(
      "advise",
      "the fastest registered approximate method and parameters whose estimated error bound "
      "(est_rel_error_hi, from rows computed exactly) is at most --tol on this input, timed "
      "against exact.flash in the same run; prints the choice (or none) and every candidate");
  sub->add_option("--tol", o->tol, "error target: relative Frobenius error bound (e.g. 1e-2)")
      ->required()
      ->check(CLI::NonNegativeNumber);
  o->pf.add_to(*sub, false);
  o->est.add_to(*sub);
  add_common(*sub, &o->threads, &o->format);
  sub->add_option("--reps", o->reps, "timed runs per candidate (median reported)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  sub->add_option("--qkv", o->qkv,
                  "a `numattn capture` directory: the problem is layer --layer's captured q/k/v "
                  "(shape flags are refused; --causal, --scale, --logit-scale, --window-* apply)");
  sub->add_option("--layer", o->layer, "the captured layer (with --qkv)");
  sub->add_option(
      "--method", o->methods,
      "consider only this method (name, repeatable or comma-separated); default: every registered "
      "approximate method");
  sub->add_flag("--no-progress", o->no_progress, "no progress bar (it is drawn only on a terminal anyway)");
  sub->callback([o] {
    NUMATTN_CHECK_OPTION(o->est.rows >= 2 || o->est.rows == -1, "est-rows",
                         "advise needs at least 2 rows for a bound, or -1 for automatic (got {})", o->est.rows);
    NUMATTN_CHECK_OPTION(o->qkv.empty() == (o->layer < 0), o->qkv.empty() ? "layer" : "qkv",
                         "--qkv DIR and --layer L (>= 0) go together");
    const auto cfgs = o->pf.expand();
    NUMATTN_CHECK(cfgs.size() == 1, "advise takes one value per problem flag");
    ProblemConfig cfg = cfgs[0];
    cfg.want_lse = false;
    ExecContext ctx{o->threads};
    std::unique_ptr<RandomProblem> random;
    std::unique_ptr<FileProblem> file;
    std::string source;
    if (!o->qkv.empty()) {
      refuse_flags(o->pf, ProblemFlags::input_flags(), "--qkv", "the capture fixes the inputs and their shape");
      refuse_flags(o->pf, {"--layout"}, "--qkv", "capture files are [H,N,D]");
      const CapturedLayer cl = read_capture(o->qkv, o->layer);
      file = std::make_unique<FileProblem>(cl.q, std::array<index_t, 4>{1, cl.heads, cl.n, cl.d}, cl.k,
                                           std::array<index_t, 4>{1, cl.kv_heads, cl.n, cl.d}, cl.v,
                                           std::array<index_t, 4>{1, cl.kv_heads, cl.n, cl.d}, cfg);
      source = cl.source();
    } else {
      random = std::make_unique<RandomProblem>(cfg);
      source = random_source(cfg);
    }
    AttentionProblem& p = random ? random->problem() : file->problem();
    AdviseOptions opt;
    opt.tol = o->tol;
    opt.est_rows = std::max(0LL, o->est.rows);
    opt.level = o->est.level;
    if (o->est.seed >= 0) opt.seed = static_cast<std::uint64_t>(o->est.seed);
    opt.reps = o->reps;
    opt.methods = split_spec_option("method", o->methods);
    std::optional<ProgressBar> bar;
    const Advice a = advise(p, opt, ctx, [&](std::size_t done, std::size_t total, const std::string& spec) {
      if (o->no_progress) return;
      if (!bar) bar.emplace("advise", static_cast<std::int64_t>(total));
      bar->set(static_cast<std::int64_t>(done), spec);
    });
    if (bar) bar->finish();
    print_advice(a, source, p, parse_format(o->format));
  });
}

NUMATTN_COMMAND(35, add_advise);

}  // namespace numattn::cli
