#include "numattn/analysis/advise.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <functional>
#include <map>

#include "numattn/attention/registry.h"
#include "numattn/core/timing.h"

namespace numattn {

namespace {

// Registered approximations that are analysis oracles, not accelerations: lowrank.svd computes
// a float64 SVD of each head's N×N softmax matrix, O(N³), minutes at N = 2048. Tried only when
// named in `methods`.
bool oracle(const MethodInfo& m) { return m.name == "lowrank.svd"; }

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::map<std::string, std::string> param_map(const AttentionMethod& m) {
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : parse_spec(m.spec()).params) out[k] = v;
  return out;
}

bool as_number(const std::string& s, double& x) {
  try {
    std::size_t pos = 0;
    x = std::stod(s, &pos);
    return pos == s.size();
  } catch (const std::exception&) {
    return false;
  }
}

double seconds_of(const std::function<void()>& fn) { return median_seconds(1, fn); }

AdviseCandidate blank(const std::string& spec, const std::string& kind) {
  AdviseCandidate c{spec, kind, "", kNaN, kNaN, {}, false};
  c.estimate.rel_error = c.estimate.rel_error_hi = kNaN;
  return c;
}

}  // namespace

std::vector<std::string> budget_ladder(const MethodInfo& info, const AttentionProblem& p) {
  const auto& cv = info.accuracy.convergence;
  if (cv.param.empty() || !create_method(info.name)->target().is_softmax()) return {};
  const auto ps = std::find_if(info.params.begin(), info.params.end(),
                               [&](const ParamSpec& x) { return x.name == cv.param; });
  if (ps == info.params.end() || (ps->type != ParamType::kInt && ps->type != ParamType::kFloat)) return {};
  // The limit value bounds the ladder (0 means "automatic" in numattn's schemas, not a bound).
  double limit = std::numeric_limits<double>::infinity();
  if (info.accuracy.limit_case)
    for (const auto& [k, v] : info.accuracy.limit_case(p)) {
      double x = 0;
      if (k == cv.param && as_number(v, x) && x != 0) limit = x;
    }
  std::vector<double> values;
  if (ps->type == ParamType::kFloat) {
    // A fraction: halvings below the limit (or the range's top).
    const double top = std::min(ps->max, limit);
    for (int e = 6; e >= 1; --e)
      if (const double x = std::ldexp(top, -e); x >= ps->min) values.push_back(x);
  } else {
    // A count (keys, landmarks, features, clusters): powers of two inside the range, below the
    // limit when the error falls as it grows, above it when it falls as the count shrinks; no
    // count beyond the keys buys anything.
    const double top = std::min({ps->max, static_cast<double>(std::max<index_t>(p.n_kv(), 1)),
                                 cv.error_falls_as_it_grows ? limit - 1 : ps->max});
    const double bottom = std::max({ps->min, 1.0, cv.error_falls_as_it_grows ? 1.0 : limit + 1});
    for (double x = 1; x <= top; x *= 2)
      if (x >= bottom) values.push_back(x);
    if (!cv.error_falls_as_it_grows) std::reverse(values.begin(), values.end());
  }
  std::vector<std::string> out;
  for (double x : values) {
    const std::string spec = fmt::format("{}({}={:g})", info.name, cv.param, x);
    try {
      out.push_back(create_method(spec)->spec());
    } catch (const Error&) {  // a value the method refuses on its own terms
    }
  }
  return out;
}

std::size_t search_budget(std::size_t lo, std::size_t hi, std::size_t n, std::size_t max_probes,
                          const std::function<BudgetProbe(std::size_t)>& probe) {
  NUMATTN_CHECK(lo <= hi && hi <= n, "search_budget: bracket [{}, {}] outside a ladder of {}", lo, hi, n);
  for (std::size_t probes = 0; lo < hi && probes < max_probes; ++probes) {
    const std::size_t mid = lo + (hi - lo) / 2;
    const BudgetProbe b = probe(mid);
    if (!b.ran) break;
    if (b.accurate) {
      hi = mid;
    } else {
      if (b.slower_than_exact) break;  // a dearer value is slower still
      lo = mid + 1;
    }
  }
  return hi;
}

std::vector<std::string> advise_grid(const MethodInfo& info, const AttentionProblem& p) {
  std::vector<std::string> out{create_method(info.name)->spec()};
  for (const std::string& s : budget_ladder(info, p))
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  return out;
}

std::string exact_in_disguise(const AttentionMethod& m, const AttentionProblem& p) {
  const AccuracyContract& a = m.info().accuracy;
  if (!a.limit_case || !m.target().is_softmax()) return "";
  const ParamOverrides limit = a.limit_case(p);
  if (limit.empty()) return "";
  const auto have = param_map(m);
  std::string why;
  for (const auto& [k, v] : limit) {
    const auto it = have.find(k);
    if (it == have.end()) return "";
    double x = 0, y = 0;
    bool ok = it->second == v;
    // 0 compares only by equality: in numattn's schemas it means "automatic" (clusters=0:
    // ceil(sqrt(Nk)) clusters), not "fewer than 1".
    if (!ok && !a.convergence.param.empty() && as_number(it->second, x) && as_number(v, y) && x != 0)
      ok = a.convergence.error_falls_as_it_grows ? x >= y : x <= y;
    if (!ok) return "";
    why += fmt::format("{}{}={} (exact at {})", why.empty() ? "" : ", ", k, it->second, v);
  }
  return "exact softmax on this problem: " + why;
}

std::vector<std::string> advise_candidates(const AttentionProblem& p, const AdviseOptions& opt) {
  for (const std::string& name : opt.methods)
    NUMATTN_CHECK(find_method(name) != nullptr, "advise: unknown method '{}' (see `numattn methods`)", name);
  std::vector<std::string> specs;
  for (const MethodInfo* info : list_methods()) {
    const bool wanted = opt.methods.empty()
                            ? !info->caps.exact && !info->caps.communicates && info->family != "auto" && !oracle(*info)
                            : std::find(opt.methods.begin(), opt.methods.end(), info->name) != opt.methods.end();
    if (!wanted) continue;
    for (const std::string& s : advise_grid(*info, p)) specs.push_back(s);
  }
  return specs;
}

Advice advise(const AttentionProblem& p, const AdviseOptions& opt, const ExecContext& ctx,
              const AdviseProgress& progress) {
  NUMATTN_CHECK(opt.tol >= 0 && std::isfinite(opt.tol), "advise: tolerance {} must be a finite number >= 0", opt.tol);
  validate(p);
  for (const std::string& name : opt.methods)
    NUMATTN_CHECK(find_method(name) != nullptr, "advise: unknown method '{}' (see `numattn methods`)", name);
  Advice adv;
  adv.tol = opt.tol;
  std::vector<const MethodInfo*> methods;
  for (const MethodInfo* info : list_methods()) {
    const bool wanted = opt.methods.empty()
                            ? !info->caps.exact && !info->caps.communicates && info->family != "auto" && !oracle(*info)
                            : std::find(opt.methods.begin(), opt.methods.end(), info->name) != opt.methods.end();
    if (wanted) methods.push_back(info);
  }
  const std::size_t total = methods.size() + 1;
  if (progress) progress(0, total, "exact.flash");

  const auto flash = create_exact_method();
  adv.baseline = blank(flash->spec(), "baseline");
  const Status bst = flash->can_run(p);
  NUMATTN_CHECK(bst.is_ok(), "advise: the baseline exact.flash cannot run this problem: {}", bst.reason());
  flash->run(p, ctx);  // warm-up; throws for a non-finite input as every method would
  const EstimateSample sample = draw_estimate_sample(p, opt.est_rows, opt.seed, ctx);
  const double base_s = median_seconds(opt.reps, [&] { flash->run(p, ctx); });
  adv.baseline.seconds = base_s;
  adv.baseline.speedup_vs_exact = 1.0;
  adv.baseline.estimate = estimate_error(p, sample, opt.level);
  adv.baseline.status = "ok";
  const double exact_tol = exact_f32_tolerance(sample.ref.logit_magnitude).rel_fro_error;

  // One candidate: run, estimate, time; appended to adv.candidates.
  auto evaluate = [&](const std::string& spec) -> const AdviseCandidate& {
    const auto m = create_method(spec);
    AdviseCandidate c = blank(m->spec(), "approximate");
    // Exact in disguise is a property of the spec and the shape: reported without running.
    const std::string disguise = exact_in_disguise(*m, p);
    const Status st = m->can_run(p);
    if (!disguise.empty()) {
      c.kind = "exact";
      c.status = "skipped: " + disguise;
    } else if (!st.is_ok()) {
      c.status = "skipped: " + st.reason();
    } else {
      try {
        const double warm = seconds_of([&] { m->run(p, ctx); });
        c.estimate = estimate_error(p, sample, opt.level);
        if (warm > opt.slow_factor * base_s) {
          c.seconds = warm;
          c.status = "ok: timed once (slower than exact)";
        } else {
          c.seconds = median_seconds(opt.reps, [&] { m->run(p, ctx); });
          c.status = "ok";
        }
        c.speedup_vs_exact = base_s / c.seconds;
        if (c.estimate.rel_error <= exact_tol) {
          c.kind = "exact";
          c.status = fmt::format("{} (measured exact: estimated error {:.3g} within the float32 tolerance {:.3g})",
                                 c.status, c.estimate.rel_error, exact_tol);
        }
        c.meets = c.kind == "approximate" && c.estimate.rel_error_hi <= opt.tol && c.seconds < base_s;
      } catch (const Error& e) {
        c.status = std::string("failed: ") + e.what();
      }
    }
    adv.candidates.push_back(c);
    return adv.candidates.back();
  };
  // Whether a candidate's error meets the tolerance (an exact one does), whatever its speed.
  auto accurate = [&](const AdviseCandidate& c) {
    return c.kind == "exact" || (!std::isnan(c.estimate.rel_error_hi) && c.estimate.rel_error_hi <= opt.tol);
  };
  auto ran = [](const AdviseCandidate& c) { return c.kind == "exact" || !std::isnan(c.seconds); };

  std::size_t done = 1;
  for (const MethodInfo* info : methods) {
    if (progress) progress(done, total, info->name);
    ++done;
    const std::vector<std::string> ladder = budget_ladder(*info, p);
    const AdviseCandidate def = evaluate(create_method(info->name)->spec());
    if (ladder.empty() || !ran(def)) continue;
    // The budget search (see advise.h): the default brackets the answer when its value is on
    // the ladder's scale (0 means "automatic": no bracket).
    std::size_t lo = 0, hi = ladder.size();
    const std::string param = info->accuracy.convergence.param;
    auto value_of = [&](const std::string& spec, double& x) {
      for (const auto& [k, v] : parse_spec(spec).params)
        if (k == param) return as_number(v, x) && x != 0;
      return false;
    };
    if (double dv = 0; value_of(def.spec, dv)) {
      const bool grows = info->accuracy.convergence.error_falls_as_it_grows;
      std::size_t pos = 0;  // the first ladder value at least as accurate as the default
      for (double x = 0; pos < ladder.size(); ++pos)
        if (value_of(ladder[pos], x) && (grows ? x >= dv : x <= dv)) break;
      if (accurate(def)) {
        hi = pos;
      } else {
        if (def.seconds > base_s) continue;  // more budget: slower still
        lo = pos < ladder.size() && ladder[pos] == def.spec ? pos + 1 : pos;
      }
    }
    search_budget(lo, hi, ladder.size(), opt.max_per_method > 0 ? opt.max_per_method - 1 : 0, [&](std::size_t i) {
      const AdviseCandidate& c = evaluate(ladder[i]);
      return BudgetProbe{ran(c), accurate(c), ran(c) && c.seconds > base_s};
    });
  }
  if (progress) progress(total, total, "");
  std::stable_sort(adv.candidates.begin(), adv.candidates.end(),
                   [](const AdviseCandidate& a, const AdviseCandidate& b) {
                     if (a.meets != b.meets) return a.meets;
                     const bool ra = !std::isnan(a.seconds), rb = !std::isnan(b.seconds);
                     if (ra != rb) return ra;
                     return ra && a.seconds < b.seconds;
                   });
  if (!adv.candidates.empty() && adv.candidates.front().meets) adv.choice = 0;
  return adv;
}

}  // namespace numattn
