#include "numattn/analysis/advise.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "numattn/attention/registry.h"
#include "numattn/core/timing.h"

namespace numattn {

namespace {

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

std::vector<std::string> advise_grid(const MethodInfo& info, const AttentionProblem& p, std::size_t max_count) {
  std::vector<std::string> out;
  auto add = [&](const std::string& spec) {
    std::string canon;
    try {
      canon = create_method(spec)->spec();
    } catch (const Error&) {
      return;  // a convergence value outside the parameter's range on this problem
    }
    if (out.size() < max_count && std::find(out.begin(), out.end(), canon) == out.end()) out.push_back(canon);
  };
  add(info.name);
  const auto& cv = info.accuracy.convergence;
  if (!cv.param.empty() && cv.values)
    for (const std::string& v : cv.values(p)) add(info.name + "(" + cv.param + "=" + v + ")");
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
                            ? !info->caps.exact && info->family != "dist" && info->family != "auto"
                            : std::find(opt.methods.begin(), opt.methods.end(), info->name) != opt.methods.end();
    if (!wanted) continue;
    for (const std::string& s : advise_grid(*info, p, opt.max_per_method)) specs.push_back(s);
  }
  return specs;
}

Advice advise(const AttentionProblem& p, const AdviseOptions& opt, const ExecContext& ctx,
              const AdviseProgress& progress) {
  NUMATTN_CHECK(opt.tol >= 0 && std::isfinite(opt.tol), "advise: tolerance {} must be a finite number >= 0", opt.tol);
  validate(p);
  Advice adv;
  adv.tol = opt.tol;
  // The candidates first, so that progress knows the total.
  const std::vector<std::string> specs = advise_candidates(p, opt);
  const std::size_t total = specs.size() + 1;
  if (progress) progress(0, total, "exact.flash");

  const auto flash = create_method("exact.flash");
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

  std::size_t done = 1;
  std::string too_slow_method, too_slow_why;  // a method whose grid point ran far over exact
  for (const std::string& spec : specs) {
    if (progress) progress(done, total, spec);
    ++done;
    const auto m = create_method(spec);
    AdviseCandidate c = blank(m->spec(), "approximate");
    // Exact in disguise is a property of the spec and the shape: reported even where the
    // method's grid is cut short by time (which depends on the machine's load).
    const std::string disguise = exact_in_disguise(*m, p);
    if (!disguise.empty()) {
      c.kind = "exact";
      c.status = "skipped: " + disguise;
      adv.candidates.push_back(c);
      continue;
    }
    if (m->info().name == too_slow_method) {
      c.status = "skipped: " + too_slow_why;
      adv.candidates.push_back(c);
      continue;
    }
    const Status st = m->can_run(p);
    if (!st.is_ok()) {
      c.status = "skipped: " + st.reason();
      adv.candidates.push_back(c);
      continue;
    }
    try {
      const double warm = seconds_of([&] { m->run(p, ctx); });
      c.estimate = estimate_error(p, sample, opt.level);
      if (warm > opt.slow_factor * base_s) {
        c.seconds = warm;
        c.status = "ok: timed once (slower than exact)";
        if (warm > opt.skip_factor * base_s) {
          too_slow_method = m->info().name;
          too_slow_why = fmt::format("{} took {:.0f}x exact.flash's time; the rest of its grid is not tried",
                                     c.spec, warm / base_s);
        }
      } else {
        c.seconds = median_seconds(opt.reps, [&] { m->run(p, ctx); });
        c.status = "ok";
      }
    } catch (const Error& e) {
      c.status = std::string("failed: ") + e.what();
      adv.candidates.push_back(c);
      continue;
    }
    c.speedup_vs_exact = base_s / c.seconds;
    if (c.estimate.rel_error <= exact_tol) {
      c.kind = "exact";
      c.status = fmt::format("{} (measured exact: estimated error {:.3g} within the float32 tolerance {:.3g})",
                             c.status, c.estimate.rel_error, exact_tol);
    }
    c.meets = c.kind == "approximate" && c.estimate.rel_error_hi <= opt.tol && c.seconds < base_s;
    adv.candidates.push_back(c);
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
