#include "support/conformance.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <set>

#include "numattn/analysis/metrics.h"
#include "numattn/attention/reference.h"
#include "numattn/attention/registry.h"
#include "numattn/quant/quant.h"
#include "support/test_util.h"

namespace numattn::test {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

bool quick() { return std::getenv("NUMATTN_TEST_QUICK") != nullptr; }

enum class MaskCase { kNone, kBoolEmptyRows, kAdditive };

/// One problem of the matrix.
struct Case {
  std::string name;
  ProblemConfig cfg;
  MaskCase mask = MaskCase::kNone;
};

ProblemConfig shape(index_t h, index_t hk, index_t n, index_t nk, index_t d, index_t dv, Causal c) {
  ProblemConfig cfg;
  cfg.heads = h;
  cfg.kv_heads = hk;
  cfg.n = n;
  cfg.n_kv = nk;
  cfg.d = d;
  cfg.dv = dv;
  cfg.causal = c;
  return cfg;
}

std::vector<Case> matrix() {
  std::vector<Case> v;
  v.push_back({"one key", shape(2, 2, 1, 1, 1, 1, Causal::kNone)});
  v.push_back({"D=3 GQA top-left", shape(2, 1, 2, 2, 3, 3, Causal::kTopLeft)});
  v.push_back({"Nq<Nk D=59 bottom-right", shape(4, 2, 17, 40, 59, 59, Causal::kBottomRight)});
  v.push_back({"Nq>Nk Dk!=Dv top-left", shape(4, 4, 40, 17, 16, 8, Causal::kTopLeft)});
  Case bnhd{"MQA bnhd", shape(8, 1, 130, 130, 64, 64, Causal::kNone)};
  bnhd.cfg.layout = Layout::kBNHD;
  v.push_back(bnhd);
  Case big{"logits x100", shape(2, 2, quick() ? 97 : 257, 300, 32, 32, Causal::kNone)};
  big.cfg.logit_scale = 100;
  v.push_back(big);
  v.push_back({"decode D=128", shape(3, 3, 1, quick() ? 500 : 2000, 128, 128, Causal::kBottomRight)});
  Case spiky{"spiky bottom-right", shape(4, 2, 33, 96, 32, 32, Causal::kBottomRight)};
  spiky.cfg.dist = Dist::kSpiky;
  v.push_back(spiky);
  v.push_back({"bool mask, empty rows", shape(2, 1, 23, 70, 16, 16, Causal::kNone), MaskCase::kBoolEmptyRows});
  v.push_back({"additive mask -inf/NaN/-1e30", shape(2, 2, 20, 50, 8, 8, Causal::kBottomRight),
               MaskCase::kAdditive});
  Case win{"window 5/3", shape(2, 2, 40, 40, 8, 8, Causal::kNone)};
  win.cfg.window_left = 5;
  win.cfg.window_right = 3;
  v.push_back(win);
  return v;
}

void apply_mask(RandomProblem& prob, MaskCase m) {
  const index_t nq = prob.config().n, nk = prob.config().eff_n_kv();
  const auto at = [&](index_t i, index_t j) { return static_cast<std::size_t>(i * nk + j); };
  if (m == MaskCase::kBoolEmptyRows) {
    std::vector<std::uint8_t> allowed(static_cast<std::size_t>(nq * nk));
    for (index_t i = 0; i < nq; ++i)
      for (index_t j = 0; j < nk; ++j) allowed[at(i, j)] = i % 4 != 1 && (i + 2 * j) % 3 != 0;
    prob.set_bool_mask(allowed);
  } else if (m == MaskCase::kAdditive) {
    std::vector<float> add(static_cast<std::size_t>(nq * nk));
    for (index_t i = 0; i < nq; ++i)
      for (index_t j = 0; j < nk; ++j) {
        float a = static_cast<float>((i * 7 + j) % 11) * 0.3f - 1.5f;
        if ((i + j) % 5 == 0) a = kNaN;
        if ((i + 3 * j) % 7 == 0) a = -kInf;
        if (i == 2) a = -kInf;                     // a fully hidden row
        if (i == 3 && j % 4 != 0) a = -1e30f;      // "hidden" the way frameworks spell it
        add[at(i, j)] = a;
      }
    prob.set_additive_mask(add);
  }
}

/// Fills the outputs with NaN so that a row a method forgets to write is caught.
void poison_outputs(RandomProblem& prob) {
  std::fill(prob.out_data().begin(), prob.out_data().end(), kNaN);
  const AttentionProblem& p = prob.problem();
  if (p.lse.empty()) return;
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t h = 0; h < p.heads(); ++h)
      for (index_t i = 0; i < p.n_q(); ++i) p.lse(b, h, i, 0) = kNaN;
}

/// What one run did.
struct Outcome {
  bool refused = false;  ///< can_run said no
  std::string reason;
  bool threw = false;
  bool non_finite_input = false;  ///< threw NonFiniteInput
  std::string tensor;
  std::vector<index_t> index;
  std::string error;
  ErrorMetrics e;
  std::vector<float> out;
};

Outcome run_once(const AttentionMethod& m, RandomProblem& prob, const ReferenceRows* ref, int threads) {
  Outcome o;
  const AttentionProblem& p = prob.problem();
  const Status s = m.can_run(p);
  if (!s.is_ok()) {
    o.refused = true;
    o.reason = s.reason();
    return o;
  }
  poison_outputs(prob);
  try {
    m.run(p, ExecContext{threads});
  } catch (const NonFiniteInput& e) {
    o.threw = o.non_finite_input = true;
    o.tensor = e.tensor();
    o.index = e.index();
    o.error = e.what();
    return o;
  } catch (const Error& e) {
    o.threw = true;
    o.error = e.what();
    return o;
  }
  if (ref) o.e = compare_with_reference(p, *ref);
  o.out = prob.out_data();
  return o;
}

/// The float64 rows of `m`'s target on `p`: `softmax_ref` itself for softmax methods.
const ReferenceRows& target_reference(const AttentionMethod& m, const AttentionProblem& p,
                                      const ReferenceRows& softmax_ref, ReferenceRows& storage) {
  const Target t = m.target();
  if (t.is_softmax()) return softmax_ref;
  storage = reference_all(p, ExecContext{2}, t);
  return storage;
}

std::string where(const std::string& spec, const std::string& problem, int threads) {
  return fmt::format("{} on '{}' with {} thread(s)", spec, problem, threads);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Seeds a randomized method is run with (an empty override for the others).
std::vector<ParamOverrides> seed_overrides(const MethodInfo& info, int count = kSeeds) {
  if (!info.caps.randomized) return {{}};
  std::vector<ParamOverrides> v;
  for (int s = 1; s <= count; ++s) v.push_back({{"seed", std::to_string(s)}});
  return v;
}

ParamOverrides merged(ParamOverrides a, const ParamOverrides& b) {
  for (const auto& kv : b) {
    auto it = std::find_if(a.begin(), a.end(), [&](const auto& x) { return x.first == kv.first; });
    if (it != a.end()) it->second = kv.second;
    else a.push_back(kv);
  }
  return a;
}

/// The exact float32 tolerances at logit magnitude L; violations go to `v`.
void check_exact(std::vector<Violation>& v, const std::string& check, const std::string& at,
                 const ErrorMetrics& e, bool lse, double L) {
  const ExactTolerance tol = exact_f32_tolerance(L);
  if (!(e.max_scaled_error <= tol.max_scaled_error))
    v.push_back({check, at, fmt::format("max_scaled_error {:.3g} > {:.3g} (64·ε·(1+L), L = {:.3g})",
                                        e.max_scaled_error, tol.max_scaled_error, L)});
  if (!(e.rel_fro_error <= tol.rel_fro_error))
    v.push_back({check, at, fmt::format("rel_fro_error {:.3g} > {:.3g} (1e-5·(1+L/10), L = {:.3g})",
                                        e.rel_fro_error, tol.rel_fro_error, L)});
  if (lse && !(e.lse_max_abs_error <= tol.lse_max_abs_error))
    v.push_back({check, at, fmt::format("lse_max_abs_error {:.3g} > {:.3g} (64·ε·(1+L), L = {:.3g})",
                                        e.lse_max_abs_error, tol.lse_max_abs_error, L)});
}

double budget_of(const MethodInfo& info, const AttentionMethod& m, const AttentionProblem& p, double L) {
  return info.accuracy.max_rel_fro_error(BudgetInput{m.params(), p, L});
}

/// Runs `info` with `overrides` (median over seeds) on `prob` and checks it: refusal, finite,
/// budget, the exact tolerances when `exact`, bitwise repeatability.
void check_run(std::vector<Violation>& v, const MethodInfo& info, const MethodFactory& make,
               const ParamOverrides& overrides, RandomProblem& prob, const ReferenceRows& softmax_ref,
               const std::string& name, int threads, bool exact, const char* check) {
  const AttentionProblem& p = prob.problem();
  std::vector<double> errs;
  std::unique_ptr<AttentionMethod> last;
  double L = softmax_ref.logit_magnitude;
  for (const ParamOverrides& seed : seed_overrides(info)) {
    const std::string spec = spec_with(info, merged(overrides, seed));
    auto m = make(spec);
    const std::string at = where(spec, name, threads);
    ReferenceRows storage;
    const ReferenceRows& ref = target_reference(*m, p, softmax_ref, storage);
    const Outcome o = run_once(*m, prob, &ref, threads);
    if (o.refused) {
      if (o.reason.empty()) v.push_back({"refusal", at, "can_run refused without a reason"});
      bool threw = false;
      try {
        m->run(p, ExecContext{threads});
      } catch (const Error&) {
        threw = true;
      }
      if (!threw) v.push_back({"refusal", at, "can_run refused but run did not throw"});
      if (info.caps.exact) v.push_back({"refusal", at, "an exact method must run every problem: " + o.reason});
      return;
    }
    if (o.threw) {
      v.push_back({check, at, "threw: " + o.error});
      return;
    }
    if (!o.e.finite) v.push_back({check, at, "the output or LSE is not finite"});
    if (exact) check_exact(v, "exact", at, o.e, !p.lse.empty(), ref.logit_magnitude);
    errs.push_back(o.e.rel_fro_error);
    if (info.caps.deterministic) {
      const Outcome again = run_once(*m, prob, &ref, threads);
      if (again.out != o.out) v.push_back({"determinism", at, "two runs gave different outputs"});
    }
    if (m->workspace_bytes(p, ExecContext{threads}) >= (std::size_t{1} << 34))
      v.push_back({check, at, "workspace_bytes is implausible (≥ 16 GiB)"});
    last = std::move(m);
    L = ref.logit_magnitude;
  }
  const double err = median(errs), budget = budget_of(info, *last, p, L);
  if (!(err <= budget))
    v.push_back({"budget", where(spec_with(info, overrides), name, threads),
                 fmt::format("rel_fro_error {}{:.3g} > declared budget {:.3g} (L = {:.3g}, target {})",
                             errs.size() > 1 ? "median " : "", err, budget, L, last->target().name())});
}

}  // namespace

MethodFactory registry_factory() {
  return [](const std::string& spec) { return create_method(spec); };
}

std::string describe(const std::vector<Violation>& v) {
  std::string s;
  for (const Violation& x : v) s += fmt::format("[{}] {}: {}\n", x.check, x.where, x.detail);
  return s;
}

bool has_check(const std::vector<Violation>& v, const std::string& check) {
  return std::any_of(v.begin(), v.end(), [&](const Violation& x) { return x.check == check; });
}

std::string spec_with(const MethodInfo& info, const ParamOverrides& overrides) {
  if (overrides.empty()) return info.name;
  std::string s = info.name + "(";
  for (std::size_t i = 0; i < overrides.size(); ++i)
    s += (i ? "," : "") + overrides[i].first + "=" + overrides[i].second;
  return s + ")";
}

std::vector<ParamOverrides> parameter_sets(const MethodInfo& info) {
  std::vector<ParamOverrides> sets = {{}};
  for (const ParamOverrides& s : info.accuracy.samples) sets.push_back(s);
  for (const ParamSpec& ps : info.params) {
    if (info.caps.randomized && ps.name == "seed") continue;  // seeds are swept separately
    auto num = [&](double x) {
      return ps.type == ParamType::kInt ? std::to_string(static_cast<long long>(x)) : fmt::format("{:g}", x);
    };
    switch (ps.type) {
      case ParamType::kInt:
      case ParamType::kFloat:
        for (double x : {ps.min, ps.max})
          if (num(x) != ps.default_value) sets.push_back({{ps.name, num(x)}});
        break;
      case ParamType::kBool:
        sets.push_back({{ps.name, ps.default_value == "true" ? "false" : "true"}});
        break;
      case ParamType::kString:
        for (const std::string& c : ps.choices)
          if (c != ps.default_value) sets.push_back({{ps.name, c}});
        break;
    }
  }
  return sets;
}

std::vector<Violation> check_declaration(const MethodInfo& info) {
  std::vector<Violation> v;
  const AccuracyContract& a = info.accuracy;
  auto has_param = [&](const std::string& n) {
    return std::any_of(info.params.begin(), info.params.end(), [&](const ParamSpec& p) { return p.name == n; });
  };
  if (!a.max_rel_fro_error) v.push_back({"declaration", info.name, "no error budget (accuracy.max_rel_fro_error)"});
  if (!info.caps.exact && !a.limit_case && a.convergence.param.empty())
    v.push_back({"declaration", info.name, "an approximate method declares a limit case or a convergence parameter"});
  if (!a.convergence.param.empty() && (!has_param(a.convergence.param) || !a.convergence.values))
    v.push_back({"declaration", info.name, "convergence parameter '" + a.convergence.param + "' is not a parameter, or has no values"});
  for (const ParamOverrides& s : a.samples)
    for (const auto& kv : s)
      if (!has_param(kv.first)) v.push_back({"declaration", info.name, "sample sets unknown parameter '" + kv.first + "'"});
  if (info.caps.randomized && !has_param("seed"))
    v.push_back({"declaration", info.name, "a randomized method has a 'seed' parameter"});
  if (!info.params.empty() && a.samples.empty())
    v.push_back({"declaration", info.name, "a method with parameters declares non-default samples"});
  return v;
}

std::vector<Violation> check_budget(const MethodInfo& info, const MethodFactory& make,
                                    const std::vector<int>& threads) {
  std::vector<Violation> v;
  if (!info.accuracy.max_rel_fro_error) return check_declaration(info);
  const std::vector<Case> cases = matrix();
  const std::vector<ParamOverrides> sets = parameter_sets(info);
  for (std::size_t c = 0; c < cases.size(); ++c) {
    ProblemConfig cfg = cases[c].cfg;
    cfg.seed = base_seed() + c;
    cfg.want_lse = info.caps.lse;
    RandomProblem prob(cfg);
    apply_mask(prob, cases[c].mask);
    const ReferenceRows ref = reference_all(prob.problem(), ExecContext{2});
    // The defaults run at every thread count; the other parameter sets at the last one (the
    // thread split is a property of the kernel, not of a parameter value, and a randomized
    // method multiplies every run by kSeeds).
    for (std::size_t s = 0; s < sets.size(); ++s)
      for (std::size_t ti = s == 0 ? 0 : threads.size() - 1; ti < threads.size(); ++ti)
        check_run(v, info, make, sets[s], prob, ref, cases[c].name, threads[ti], info.caps.exact, "budget");
  }
  return v;
}

std::vector<Violation> check_limit_case(const MethodInfo& info, const MethodFactory& make,
                                        const std::vector<int>& threads) {
  std::vector<Violation> v;
  if (!info.accuracy.limit_case) return v;  // exact methods: every run of check_budget is one
  const std::vector<Case> cases = matrix();
  for (std::size_t c = 0; c < cases.size(); ++c) {
    ProblemConfig cfg = cases[c].cfg;
    cfg.seed = base_seed() + 100 + c;
    cfg.want_lse = info.caps.lse;
    RandomProblem prob(cfg);
    apply_mask(prob, cases[c].mask);
    const ReferenceRows ref = reference_all(prob.problem(), ExecContext{2});
    const ParamOverrides limit = info.accuracy.limit_case(prob.problem());
    for (int t : threads)
      for (const ParamOverrides& seed : seed_overrides(info, 2)) {
        const std::string spec = spec_with(info, merged(limit, seed));
        auto m = make(spec);
        ReferenceRows storage;
        const ReferenceRows& tref = target_reference(*m, prob.problem(), ref, storage);
        const Outcome o = run_once(*m, prob, &tref, t);
        const std::string at = where(spec, cases[c].name, t);
        if (o.refused) break;  // capabilities are check_budget's business
        if (o.threw) v.push_back({"limit", at, "threw: " + o.error});
        else check_exact(v, "limit", at, o.e, !prob.problem().lse.empty(), tref.logit_magnitude);
      }
  }
  return v;
}

std::vector<Violation> check_convergence(const MethodInfo& info, const MethodFactory& make) {
  std::vector<Violation> v;
  const auto& conv = info.accuracy.convergence;
  if (!info.accuracy.max_rel_fro_error) return check_declaration(info);
  if (conv.param.empty() || !conv.values) return v;
  ProblemConfig cfg = shape(2, 2, 48, 160, 32, 32, Causal::kNone);
  cfg.logit_scale = 2;
  cfg.seed = base_seed() + 200;
  cfg.want_lse = info.caps.lse;
  RandomProblem prob(cfg);
  const ReferenceRows ref = reference_all(prob.problem(), ExecContext{2});
  std::vector<std::string> values = conv.values(prob.problem());
  if (values.size() < 2) {
    v.push_back({"declaration", info.name, "convergence needs at least two values"});
    return v;
  }
  if (!conv.error_falls_as_it_grows) std::reverse(values.begin(), values.end());
  const double floor = exact_f32_tolerance(ref.logit_magnitude).rel_fro_error;
  std::vector<double> err;
  for (const std::string& x : values) {
    const ParamOverrides ov = {{conv.param, x}};
    std::vector<Violation> run_v;
    check_run(run_v, info, make, ov, prob, ref, "convergence problem", 1, false, "convergence");
    v.insert(v.end(), run_v.begin(), run_v.end());
    std::vector<double> e;
    for (const ParamOverrides& seed : seed_overrides(info)) {
      auto m = make(spec_with(info, merged(ov, seed)));
      ReferenceRows storage;
      const Outcome o = run_once(*m, prob, &target_reference(*m, prob.problem(), ref, storage), 1);
      e.push_back(o.refused || o.threw ? std::numeric_limits<double>::infinity() : o.e.rel_fro_error);
    }
    err.push_back(median(e));
  }
  std::string trail;
  for (std::size_t k = 0; k < values.size(); ++k) trail += fmt::format(" {}={}:{:.3g}", conv.param, values[k], err[k]);
  for (std::size_t k = 1; k < err.size(); ++k)
    if (!(err[k] <= err[k - 1] * kConvergenceSlack + floor))
      v.push_back({"convergence", info.name,
                   fmt::format("error grows from {}={} to {}={} as the budget grows:{}", conv.param,
                               values[k - 1], conv.param, values[k], trail)});
  if (err[0] > floor && !(err.back() <= kConvergenceGain * err[0]))
    v.push_back({"convergence", info.name, "error does not fall over the sweep:" + trail});
  return v;
}

namespace {

/// The element of `data` that `view` (which points into it) shows at [b, h, n, d].
float& element(std::vector<float>& data, const TensorView<const float>& view, index_t b, index_t h,
               index_t n, index_t d) {
  return data[static_cast<std::size_t>(view.row(b, h, n) + d - data.data())];
}

ProblemConfig hostile_config(const MethodInfo& info) {
  ProblemConfig cfg = shape(2, info.caps.gqa ? 1 : 2, 9, 23, 8, 8, Causal::kNone);
  cfg.seed = base_seed() + 300;
  cfg.want_lse = info.caps.lse;
  return cfg;
}

/// Runs and expects NonFiniteInput(tensor, index) at each thread count.
void expect_refused_input(std::vector<Violation>& v, const MethodInfo& info, const MethodFactory& make,
                          RandomProblem& prob, const std::string& name, const std::string& tensor,
                          const std::vector<index_t>& index, const std::vector<int>& threads) {
  for (int t : threads) {
    const std::string spec = spec_with(info, seed_overrides(info, 1)[0]);
    const Outcome o = run_once(*make(spec), prob, nullptr, t);
    const std::string at = where(spec, name, t);
    if (o.refused) return;
    if (!o.non_finite_input)
      v.push_back({"hostile", at, o.threw ? "threw something else: " + o.error : "ran without refusing the input"});
    else if (o.tensor != tensor || o.index != index)
      v.push_back({"hostile", at, "named the wrong element: " + o.error});
  }
}

/// Runs and expects the reference's answer. `clear_winner`: every row is one-hot by a margin far
/// above float32 rounding, so the output is held to the L = 0 tolerance whatever L is.
/// `may_refuse`: an approximate method may throw an Error instead (overflow it cannot handle).
void expect_answer(std::vector<Violation>& v, const MethodInfo& info, const MethodFactory& make,
                   RandomProblem& prob, const std::string& name, const std::vector<int>& threads,
                   bool clear_winner, bool may_refuse) {
  const ReferenceRows ref = reference_all(prob.problem(), ExecContext{2});
  for (int t : threads) {
    const std::string spec = spec_with(info, seed_overrides(info, 1)[0]);
    auto m = make(spec);
    ReferenceRows storage;
    const ReferenceRows& tref = target_reference(*m, prob.problem(), ref, storage);
    const Outcome o = run_once(*m, prob, &tref, t);
    const std::string at = where(spec, name, t);
    if (o.refused) return;
    if (o.threw) {
      if (!(may_refuse && !info.caps.exact && !o.non_finite_input)) v.push_back({"hostile", at, "threw: " + o.error});
      continue;
    }
    if (!o.e.finite) v.push_back({"hostile", at, "the output or LSE is not finite"});
    const double budget = budget_of(info, *m, prob.problem(), ref.logit_magnitude);
    if (!(o.e.rel_fro_error <= budget))
      v.push_back({"hostile", at, fmt::format("rel_fro_error {:.3g} > budget {:.3g}", o.e.rel_fro_error, budget)});
    if (info.caps.exact) check_exact(v, "hostile", at, o.e, !prob.problem().lse.empty(), ref.logit_magnitude);
    if (info.caps.exact && clear_winner && !(o.e.max_scaled_error <= exact_f32_tolerance(0).max_scaled_error))
      v.push_back({"hostile", at, fmt::format("one-hot rows: max_scaled_error {:.3g} > {:.3g}",
                                              o.e.max_scaled_error, exact_f32_tolerance(0).max_scaled_error)});
  }
}

}  // namespace

namespace {

/// A mask of one kind over [B, Hq, Nq, Nk] with strides; entry(b, h, i, j) fills it.
struct HeadMaskCase {
  std::string name;
  ProblemConfig cfg;
  MaskKind kind;
  index_t stride_b, stride_h, ld;  ///< in units of the [B or 1, H or 1, Nq or 1, Nk] layout below
  std::function<float(index_t, index_t, index_t, index_t)> entry;
};

std::vector<HeadMaskCase> head_mask_cases() {
  std::vector<HeadMaskCase> v;
  {  // padding: batch 0 sees all 24 keys, batch 1 only the first 13
    ProblemConfig c = shape(4, 2, 24, 24, 16, 16, Causal::kNone);
    c.batch = 2;
    v.push_back({"padding bool [B,1,Nq,Nk]", c, MaskKind::kBool, 1, 0, 1,
                 [](index_t b, index_t, index_t i, index_t j) { return b == 1 ? float(j < 13) : float((i + j) % 7 != 0); }});
    v.push_back({"padding bool [B,1,1,Nk] (ld = 0)", c, MaskKind::kBool, 1, 0, 0,
                 [](index_t b, index_t, index_t, index_t j) { return float(j < (b == 1 ? 5 : 24)); }});
  }
  {  // ALiBi: −slope_h·|i − j| per query head, bottom-right causal
    ProblemConfig c = shape(4, 4, 20, 30, 16, 16, Causal::kBottomRight);
    v.push_back({"ALiBi additive [1,Hq,Nq,Nk]", c, MaskKind::kAdditive, 0, 1, 1,
                 [](index_t, index_t h, index_t i, index_t j) {
                   return -std::ldexp(1.f, -static_cast<int>(h) - 1) * static_cast<float>(std::abs(i + 10 - j));
                 }});
  }
  {  // one row fully hidden in (b, h) = (1, 2) only; -inf/NaN entries elsewhere
    ProblemConfig c = shape(3, 3, 17, 21, 8, 8, Causal::kNone);
    c.batch = 2;
    v.push_back({"row hidden in one (b,h) [B,Hq,Nq,Nk]", c, MaskKind::kAdditive, 1, 1, 1,
                 [](index_t b, index_t h, index_t i, index_t j) {
                   if (b == 1 && h == 2 && i == 3) return -kInf;
                   if ((i + j + h + 2 * b) % 9 == 0) return kNaN;
                   return static_cast<float>((i * 5 + j * 3 + h * 7 + b) % 13) * 0.25f - 1.5f;
                 }});
  }
  {  // GQA, a different boolean mask per query head of a group
    ProblemConfig c = shape(6, 2, 19, 19, 16, 16, Causal::kTopLeft);
    v.push_back({"GQA per-query-head bool [1,Hq,Nq,Nk]", c, MaskKind::kBool, 0, 1, 1,
                 [](index_t, index_t h, index_t i, index_t j) { return float((i + j + h) % 3 != 0 || j == 0); }});
  }
  return v;
}

/// Mask storage for a case: [B or 1, H or 1, Nq or 1, Nk] contiguous.
struct HeadMaskData {
  std::vector<std::uint8_t> allowed;
  std::vector<float> additive;
};

void apply_head_mask(RandomProblem& prob, const HeadMaskCase& c, HeadMaskData& d) {
  const ProblemConfig& cfg = prob.config();
  const index_t nb = c.stride_b ? cfg.batch : 1, nh = c.stride_h ? cfg.heads : 1, ni = c.ld ? cfg.n : 1;
  const index_t nk = cfg.eff_n_kv();
  const auto n = static_cast<std::size_t>(nb * nh * ni * nk);
  if (c.kind == MaskKind::kBool) d.allowed.resize(n);
  else d.additive.resize(n);
  for (index_t b = 0; b < nb; ++b)
    for (index_t h = 0; h < nh; ++h)
      for (index_t i = 0; i < ni; ++i)
        for (index_t j = 0; j < nk; ++j) {
          const auto at = static_cast<std::size_t>(((b * nh + h) * ni + i) * nk + j);
          const float x = c.entry(b, h, i, j);
          if (c.kind == MaskKind::kBool) d.allowed[at] = x != 0.f;
          else d.additive[at] = x;
        }
  Mask& m = prob.problem().mask;
  m.kind = c.kind;
  m.allowed = c.kind == MaskKind::kBool ? d.allowed.data() : nullptr;
  m.additive = c.kind == MaskKind::kAdditive ? d.additive.data() : nullptr;
  m.ld = c.ld ? nk : 0;
  m.stride_h = c.stride_h ? ni * nk : 0;
  m.stride_b = c.stride_b ? nh * ni * nk : 0;
}

/// Rounds every element of x to half precision and back (in place); returns the half values.
std::vector<std::uint16_t> round_to_half(std::vector<float>& x, KvType t) {
  std::vector<std::uint16_t> h(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    h[i] = t == KvType::kF16 ? fp32_to_fp16(x[i]) : fp32_to_bf16(x[i]);
    x[i] = t == KvType::kF16 ? fp16_to_fp32(h[i]) : bf16_to_fp32(h[i]);
  }
  return h;
}

float half_value(std::uint16_t h, KvType t) { return t == KvType::kF16 ? fp16_to_fp32(h) : bf16_to_fp32(h); }

}  // namespace

std::vector<Violation> check_head_masks(const MethodInfo& info, const MethodFactory& make,
                                        const std::vector<int>& threads) {
  std::vector<Violation> v;
  if (!info.accuracy.max_rel_fro_error) return check_declaration(info);
  const std::vector<HeadMaskCase> cases = head_mask_cases();
  for (std::size_t c = 0; c < cases.size(); ++c) {
    ProblemConfig cfg = cases[c].cfg;
    cfg.seed = base_seed() + 500 + c;
    cfg.want_lse = info.caps.lse;
    RandomProblem prob(cfg);
    HeadMaskData data;
    apply_head_mask(prob, cases[c], data);
    const AttentionProblem& p = prob.problem();
    if (!info.caps.head_mask) {
      auto m = make(info.name);
      const std::string at = where(info.name, cases[c].name, 1);
      const Status s = m->can_run(p);
      if (s.is_ok()) {
        v.push_back({"refusal", at, "accepts a mask varying over (b, h) without Capabilities::head_mask"});
        continue;
      }
      if (s.reason().empty()) v.push_back({"refusal", at, "can_run refused without a reason"});
      bool threw = false;
      try {
        m->run(p, ExecContext{1});
      } catch (const Error&) {
        threw = true;
      }
      if (!threw) v.push_back({"refusal", at, "can_run refused but run did not throw"});
      continue;
    }
    const ReferenceRows ref = reference_all(p, ExecContext{2});
    for (int t : threads) check_run(v, info, make, {}, prob, ref, cases[c].name, t, info.caps.exact, "head-mask");
  }
  return v;
}

std::vector<Violation> check_half_io(const MethodInfo& info, const MethodFactory& make,
                                     const std::vector<int>& threads) {
  std::vector<Violation> v;
  if (!info.accuracy.max_rel_fro_error) return check_declaration(info);
  struct HalfCase {
    std::string name;
    ProblemConfig cfg;
    bool half_kv;
  };
  std::vector<HalfCase> cases;
  {
    ProblemConfig c = shape(4, 2, 37, 37, 32, 32, Causal::kNone);
    cases.push_back({"GQA bhnd", c, false});
    c.layout = Layout::kBNHD;
    c.n = c.n_kv = 150;  // several query blocks per kv head: the packed panels of exact.flash
    c.causal = Causal::kTopLeft;
    cases.push_back({"GQA bnhd causal", c, false});
    cases.push_back({"GQA bnhd causal, half K/V", c, true});
    ProblemConfig d = shape(3, 1, 1, 90, 64, 64, Causal::kBottomRight);  // decode (key lanes)
    cases.push_back({"MQA decode", d, false});
  }
  for (KvType type : {KvType::kF16, KvType::kBf16})
    for (std::size_t c = 0; c < cases.size(); ++c) {
      ProblemConfig cfg = cases[c].cfg;
      cfg.seed = base_seed() + 600 + c;
      cfg.want_lse = info.caps.lse;
      RandomProblem prob(cfg);
      const bool half_kv = cases[c].half_kv && info.caps.half_kv;
      // x̂: the inputs rounded to half precision; prob holds them in float32 (the twin problem).
      const std::vector<std::uint16_t> q16 = round_to_half(prob.q_data(), type);
      std::vector<std::uint16_t> k16, v16;
      if (half_kv) k16 = round_to_half(prob.k_data(), type), v16 = round_to_half(prob.v_data(), type);
      std::vector<std::uint16_t> out16(prob.out_data().size());
      const AttentionProblem& p32 = prob.problem();
      AttentionProblem p16 = p32;
      p16.q.data = nullptr;
      p16.half_q = {type, q16.data()};
      if (half_kv) {
        p16.k.data = nullptr;
        p16.v.data = nullptr;
        p16.half = {type, k16.data(), v16.data()};
      }
      const std::string name = fmt::format("{} {}{}", cases[c].name, to_string(type), half_kv ? "" : ", f32 K/V");
      const ReferenceRows ref = reference_all(p32, ExecContext{2});
      auto m = make(info.name);
      const Status s32 = m->can_run(p32);
      const Status s16 = m->can_run(p16);
      if (s32.is_ok() != s16.is_ok()) {
        v.push_back({"half-io", where(info.name, name, 1), "can_run differs between the float32 and the half problem: " +
                                                               (s32.is_ok() ? s16.reason() : s32.reason())});
        continue;
      }
      if (!s32.is_ok()) continue;
      const double u = type == KvType::kF16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
      for (int t : threads) {
        const std::string at = where(info.name, name, t);
        // The float32 path with the same K/V (half K/V may be read by other kernels than
        // float32 ones, so that path is what run's conversion of Q and out must reproduce).
        AttentionProblem pb = p16;
        pb.q = p32.q;
        pb.half_q = HalfQ{};
        m->run(pb, ExecContext{t});
        const std::vector<float> out32 = prob.out_data();
        m->run(p32, ExecContext{t});
        const ErrorMetrics e32 = compare_with_reference(p32, ref);
        for (bool half_out : {false, true}) {
          AttentionProblem ph = p16;
          std::fill(prob.out_data().begin(), prob.out_data().end(), kNaN);
          std::fill(out16.begin(), out16.end(), std::uint16_t{0x7e00});  // NaN in both types' top bits
          if (half_out) {
            ph.out.data = nullptr;
            ph.half_out = {type, out16.data()};
          }
          try {
            m->run(ph, ExecContext{t});
          } catch (const Error& e) {
            v.push_back({"half-io", at, std::string("threw: ") + e.what()});
            continue;
          }
          std::vector<float> got(prob.out_data().size());
          for (std::size_t x = 0; x < got.size(); ++x) got[x] = half_out ? half_value(out16[x], type) : prob.out_data()[x];
          if (!info.caps.half_io) {
            // run() converts: exactly the float32 path, rounded once.
            for (std::size_t x = 0; x < got.size(); ++x) {
              const float want = half_out ? half_value(type == KvType::kF16 ? fp32_to_fp16(out32[x]) : fp32_to_bf16(out32[x]), type)
                                          : out32[x];
              if (!(got[x] == want) && info.caps.deterministic) {
                v.push_back({"half-io", at, fmt::format("{} output [{}] = {} differs from the float32 path's {}",
                                                        half_out ? "half" : "float32", x, got[x], want)});
                break;
              }
            }
            continue;
          }
          // Native: 2·e32 (+ the output rounding) against the float64 reference on x̂.
          const AttentionProblem& pp = p32;
          double worst = 0;
          std::string worst_at;
          const index_t dv = pp.d_v();
          for (index_t b = 0; b < pp.batch(); ++b)
            for (index_t h = 0; h < pp.heads(); ++h)
              for (index_t i = 0; i < pp.n_q(); ++i) {
                const std::size_t row = static_cast<std::size_t>(((b * pp.heads() + h) * pp.n_q() + i));
                const float* o32 = pp.out.row(b, h, i);  // prob.out_data() laid out as out
                const std::ptrdiff_t off = o32 - prob.out_data().data();
                for (index_t d = 0; d < dv; ++d) {
                  const double r = ref.out[row * static_cast<std::size_t>(dv) + static_cast<std::size_t>(d)];
                  const double tol = 2 * e32.max_abs_error + 1e-7 * (1 + std::abs(r)) + (half_out ? u * std::abs(r) : 0.0);
                  const double err = std::abs(got[static_cast<std::size_t>(off + d)] - r);
                  if (!(err <= tol) && !(err - tol <= worst)) {
                    worst = err - tol;
                    worst_at = fmt::format("[{},{},{},{}]: |{} − {}| > {:.3g} (2·e32 = {:.3g})", b, h, i, d,
                                           got[static_cast<std::size_t>(off + d)], r, tol, 2 * e32.max_abs_error);
                  }
                }
              }
          if (!worst_at.empty())
            v.push_back({"half-io", at, std::string(half_out ? "half" : "float32") + " output beyond its bound at " + worst_at});
        }
      }
      // A non-finite half value in a q row some key is visible to: refused, naming q.
      for (std::uint16_t bad : {std::uint16_t(type == KvType::kF16 ? 0x7c00 : 0x7f80), std::uint16_t(0x7fc0)}) {
        std::vector<std::uint16_t> qb = q16;
        const index_t b = 0, h = 1, i = p32.n_q() - 1, d = 3;
        qb[static_cast<std::size_t>(b * p32.q.stride[0] + h * p32.q.stride[1] + i * p32.q.stride[2] + d)] = bad;
        AttentionProblem ph = p16;
        ph.half_q.data = qb.data();
        const std::string at = where(info.name, name + fmt::format(", q[0,1,{},3] = {:#x}", i, bad), 1);
        try {
          m->run(ph, ExecContext{1});
          v.push_back({"half-io", at, "ran without NonFiniteInput"});
        } catch (const NonFiniteInput& e) {
          if (e.tensor() != "q" || e.index() != std::vector<index_t>{b, h, i, d})
            v.push_back({"half-io", at, std::string("NonFiniteInput names the wrong element: ") + e.what()});
        } catch (const Error& e) {
          v.push_back({"half-io", at, std::string("threw something else: ") + e.what()});
        }
      }
    }
  return v;
}

std::vector<Violation> check_hostile(const MethodInfo& info, const MethodFactory& make,
                                     const std::vector<int>& threads) {
  std::vector<Violation> v;
  if (!info.accuracy.max_rel_fro_error) return check_declaration(info);
  const ProblemConfig base = hostile_config(info);
  const index_t hk = base.eff_kv_heads() - 1;
  struct Site {
    const char* tensor;
    index_t b, h, n, d;
  };
  const Site sites[] = {{"q", 0, 1, 4, 3}, {"k", 0, hk, 11, 5}, {"v", 0, hk, 17, 2}};
  for (const Site& s : sites)
    for (float bad : {kNaN, kInf, -kInf}) {
      RandomProblem prob(base);
      const AttentionProblem& p = prob.problem();
      const std::string t = s.tensor;
      float& x = t == "q" ? element(prob.q_data(), p.q, s.b, s.h, s.n, s.d)
                 : t == "k" ? element(prob.k_data(), p.k, s.b, s.h, s.n, s.d)
                            : element(prob.v_data(), p.v, s.b, s.h, s.n, s.d);
      x = bad;
      expect_refused_input(v, info, make, prob, fmt::format("{} at {}[{},{},{},{}]", bad, t, s.b, s.h, s.n, s.d),
                           t, {s.b, s.h, s.n, s.d}, threads);
    }

  if (make(info.name)->runs_causal()) {  // keys 9..22 are hidden from all 9 queries (top-left)
    ProblemConfig cfg = base;
    cfg.causal = Causal::kTopLeft;
    RandomProblem prob(cfg);
    element(prob.k_data(), prob.problem().k, 0, hk, 20, 0) = kNaN;
    element(prob.k_data(), prob.problem().k, 0, hk, 15, 1) = -kInf;
    element(prob.v_data(), prob.problem().v, 0, hk, 20, 1) = kInf;
    expect_answer(v, info, make, prob, "non-finite k/v in keys no query sees (causal)", threads, false, false);
  }
  if (info.caps.bool_mask) {  // key 6 is hidden from every query, query 5 sees nothing
    RandomProblem prob(base);
    std::vector<std::uint8_t> allowed(static_cast<std::size_t>(9 * 23), 1);
    for (index_t i = 0; i < 9; ++i) allowed[static_cast<std::size_t>(i * 23 + 6)] = 0;
    for (index_t j = 0; j < 23; ++j) allowed[static_cast<std::size_t>(5 * 23 + j)] = 0;
    prob.set_bool_mask(allowed);
    element(prob.k_data(), prob.problem().k, 0, hk, 6, 2) = -kInf;
    element(prob.v_data(), prob.problem().v, 0, hk, 6, 3) = kNaN;
    expect_answer(v, info, make, prob, "non-finite k/v in a key the boolean mask hides, an empty row", threads, false, false);
  }
  if (info.caps.additive_mask) {
    RandomProblem prob(base);
    apply_mask(prob, MaskCase::kAdditive);
    expect_answer(v, info, make, prob, "additive mask with NaN, -inf, -1e30 and a hidden row", threads, false, false);
    std::vector<float> add(static_cast<std::size_t>(9 * 23), 0.5f);
    add[1 * 23 + 7] = kInf;
    prob.set_additive_mask(add);
    expect_refused_input(v, info, make, prob, "additive mask +inf", "mask", {1, 7}, threads);
  }

  {  // logits beyond float32: an LSE cannot hold them; the output can
    ProblemConfig cfg = base;
    cfg.scale = 1e38;
    if (info.caps.lse) {
      RandomProblem prob(cfg);
      for (int t : threads) {
        const std::string spec = spec_with(info, seed_overrides(info, 1)[0]);
        const Outcome o = run_once(*make(spec), prob, nullptr, t);
        if (!o.refused && (!o.threw || o.non_finite_input))
          v.push_back({"hostile", where(spec, "scale 1e38 with LSE", t),
                       o.threw ? "wrong error: " + o.error : "an LSE beyond float32 was not refused"});
      }
    }
    cfg.want_lse = false;
    RandomProblem prob(cfg);
    expect_answer(v, info, make, prob, "scale 1e38 (logits beyond float32)", threads, true, true);
  }
  {  // logits near 1e37: within float32, one-hot rows
    ProblemConfig cfg = base;
    cfg.scale = 1e36;
    RandomProblem prob(cfg);
    expect_answer(v, info, make, prob, "scale 1e36 (logits near 1e37)", threads, true, true);
  }
  {  // values near FLT_MAX: their weighted sums overflow float32 unless normalised first
    RandomProblem prob(base);
    for (float& x : prob.v_data()) x = std::clamp(x * 1e38f, -3.3e38f, 3.3e38f);
    expect_answer(v, info, make, prob, "v near FLT_MAX", threads, false, true);
  }
  {  // q·k whose float32 partial sums overflow although the terms cancel
    RandomProblem prob(base);
    const AttentionProblem& p = prob.problem();
    for (index_t h = 0; h < base.heads; ++h)
      for (index_t i = 0; i < base.n; ++i)
        element(prob.q_data(), p.q, 0, h, i, 0) = element(prob.q_data(), p.q, 0, h, i, 1) = 3e19f;
    for (index_t h = 0; h < base.eff_kv_heads(); ++h)
      for (index_t j = 0; j < base.n_kv; ++j) {
        element(prob.k_data(), p.k, 0, h, j, 0) = 3e19f;
        element(prob.k_data(), p.k, 0, h, j, 1) = -3e19f;
      }
    expect_answer(v, info, make, prob, "cancelling dot products with overflowing partial sums", threads, false, true);
  }
  return v;
}

}  // namespace numattn::test
