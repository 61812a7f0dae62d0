#include "analysis/auto_select.h"

#include <algorithm>
#include <atomic>
#include <cstdio>

#include "attention/method_def.h"
#include "numattn/analysis/advise.h"
#include "numattn/attention/registry.h"

namespace numattn {

const MethodInfo& AutoSelectAttention::describe() {
  static const MethodInfo info = [] {
    MethodInfo m;
    m.name = "auto.select";
    m.family = "auto";
    m.summary =
        "picks per problem shape (per layer in a model) the fastest approximate method whose "
        "estimated error bound meets tol, measured on the input (numattn advise); spec auto(tol=E)";
    m.citation = "numattn advise: a-posteriori ratio estimate from sampled exact rows (Cochran, Sampling Techniques, 1977)";
    m.time_complexity = "the selection once per shape, then the chosen method's";
    m.memory_complexity = "the chosen method's; the selection the largest candidate's";
    m.params = {
        {"tol", ParamType::kFloat, "0", 0, 1, {},
         "error target: the chosen method's est_rel_error_hi must be at most this (0 = exact.flash)"},
        {"rows", ParamType::kInt, "0", 0, 4096, {}, "rows computed exactly for the error estimates (0 = automatic: max(32, sqrt(B·Hq·Nq)))"},
        {"reps", ParamType::kInt, "3", 1, 20, {}, "timed runs per candidate (median)"},
    };
    m.caps = {.exact = false, .causal = true, .gqa = true, .bool_mask = true, .additive_mask = true,
              .window = true, .lse = true, .decode = true, .deterministic = false};
    AccuracyContract& a = m.accuracy;
    // The choice's bound holds at level 0.95 on the sampled problem; the budget allows for the
    // other 5% and for the spread of the estimate (docs/numerics.md, "A-posteriori error
    // estimates": estimates are within ×2 of the truth in ≥ 90% of the validation runs).
    a.max_rel_fro_error = [](const BudgetInput& in) {
      return 4 * in.params.get_float("tol") + exact_f32_tolerance(in.logit_magnitude).rel_fro_error;
    };
    a.limit_case = [](const AttentionProblem&) { return ParamOverrides{{"tol", "0"}}; };
    // A tolerance that approximations meet on the harness's problems, so a choice is made.
    a.samples = {{{"tol", "0.2"}, {"reps", "1"}, {"rows", "8"}}};
    return m;
  }();
  return info;
}

AutoSelectAttention::ShapeKey AutoSelectAttention::key_of(const AttentionProblem& p) {
  return {p.batch(), p.heads(), p.kv_heads(), p.n_q(), p.n_kv(), p.d_qk(), p.d_v(),
          static_cast<int>(p.causal), p.window_left, p.window_right, static_cast<int>(p.mask.kind)};
}

std::size_t AutoSelectAttention::workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = chosen_.find(key_of(p)); it != chosen_.end()) return it->second->workspace_bytes(p, ctx);
  }
  std::size_t most = create_exact_method()->workspace_bytes(p, ctx);
  if (params_.get_float("tol") == 0) return most;
  AdviseOptions opt;
  for (const std::string& spec : advise_candidates(p, opt)) {
    const auto m = create_method(spec);
    if (m->can_run(p).is_ok()) most = std::max(most, m->workspace_bytes(p, ctx));
  }
  return most;
}

std::shared_ptr<const AttentionMethod> AutoSelectAttention::choose(const AttentionProblem& p,
                                                                  const ExecContext& ctx) const {
  const ShapeKey key = key_of(p);
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = chosen_.find(key); it != chosen_.end()) return it->second;
  static std::atomic<int> selections{0};
  const int id = selections++;
  const double tol = params_.get_float("tol");
  std::shared_ptr<const AttentionMethod> pick;
  std::string why;
  if (tol == 0) {
    pick = create_exact_method();
    why = "tol = 0: only exact attention meets it";
  } else {
    AdviseOptions opt;
    opt.tol = tol;
    opt.est_rows = params_.get_int("rows");
    opt.reps = static_cast<int>(params_.get_int("reps"));
    const Advice adv = advise(p, opt, ctx);
    if (const AdviseCandidate* c = adv.chosen()) {
      pick = create_method(c->spec);
      why = fmt::format("est_rel_error {:.3g}, bound {:.3g} ≤ {:g}, {:.2f}× exact.flash", c->estimate.rel_error,
                        c->estimate.rel_error_hi, tol, c->speedup_vs_exact);
    } else {
      pick = create_exact_method();
      why = fmt::format("no approximation of the {} tried meets {:g} faster than exact", adv.candidates.size(), tol);
    }
  }
  std::fprintf(stderr, "auto: selection %d (Hq=%lld Nq=%lld Nk=%lld, %s): %s (%s)\n", id,
               static_cast<long long>(p.heads()), static_cast<long long>(p.n_q()),
               static_cast<long long>(p.n_kv()), to_string(p.causal), pick->spec().c_str(), why.c_str());
  chosen_[key] = pick;
  return pick;
}

void AutoSelectAttention::forward(const AttentionProblem& p, const ExecContext& ctx) const {
  std::shared_ptr<const AttentionMethod> m = choose(p, ctx);
  if (!m->can_run(p).is_ok()) m = create_exact_method();
  // run, not forward: the chosen method settles its own edges (an exact method recomputes a
  // float32 overflow in float64, which this non-exact wrapper's run would refuse).
  m->run(p, ctx);
}

NUMATTN_DEFINE_METHOD(AutoSelectAttention)

}  // namespace numattn
