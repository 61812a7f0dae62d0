#include "numattn/analysis/spectra.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "numattn/core/error.h"
#include "numattn/core/timing.h"

namespace numattn::analysis {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

double sum_sq(const Vector& s, std::int64_t from) {
  double t = 0;
  for (std::int64_t i = from; i < s.size(); ++i) t += s[i] * s[i];
  return t;
}

}  // namespace

std::int64_t numerical_rank(const Vector& sigma, double rel_tol) {
  if (sigma.size() == 0 || !(sigma[0] > 0)) return 0;
  const double tol = rel_tol * sigma[0];
  std::int64_t r = 0;
  for (std::int64_t i = 0; i < sigma.size(); ++i) r += sigma[i] > tol;
  return r;
}

std::int64_t energy_rank(const Vector& sigma, double fraction) {
  NUMATTN_CHECK(fraction > 0 && fraction <= 1, "energy_rank: the fraction must be in (0, 1], got {}", fraction);
  const double total = sum_sq(sigma, 0);
  if (!(total > 0)) return 0;
  double acc = 0;
  for (std::int64_t i = 0; i < sigma.size(); ++i) {
    acc += sigma[i] * sigma[i];
    // A relative slack of a few ulps, so that fraction = 1 is reached despite rounding of the sum.
    if (acc >= fraction * total * (1 - 4 * std::numeric_limits<double>::epsilon())) return i + 1;
  }
  return sigma.size();
}

double stable_rank(const Vector& sigma) {
  if (sigma.size() == 0 || !(sigma[0] > 0)) return 0;
  return sum_sq(sigma, 0) / (sigma[0] * sigma[0]);
}

double tail_rel_fro(const Vector& sigma, std::int64_t r) {
  NUMATTN_CHECK(r >= 0, "tail_rel_fro: the rank must be >= 0, got {}", r);
  const double total = sum_sq(sigma, 0);
  if (!(total > 0) || r >= sigma.size()) return 0;
  return std::sqrt(sum_sq(sigma, r) / total);
}

SpectrumStats spectrum_stats(const Vector& sigma) {
  SpectrumStats st;
  st.n = sigma.size();
  st.sigma1 = sigma.size() > 0 ? sigma[0] : 0;
  st.rank_rel = numerical_rank(sigma, 1e-2);
  st.rank_energy = energy_rank(sigma, 0.9);
  st.stable_rank = stable_rank(sigma);
  return st;
}

Vector singular_values(const Matrix& m, const char* what) {
  const decomp::dense::Svd r = decomp::dense::svd(m, false);
  NUMATTN_CHECK(r.info == decomp::dense::Info::kSuccess, "singular values of {} ({}×{}): LAPACK says {}", what,
                m.rows(), m.cols(), decomp::dense::to_string(r.info));
  return r.s;
}

std::vector<KeyRange> visible_ranges(std::int64_t nq, std::int64_t nk, Causal causal, std::int64_t window) {
  NUMATTN_CHECK(window >= 0, "visible_ranges: the window must be >= 0 keys (0 = none), got {}", window);
  std::vector<KeyRange> v(static_cast<std::size_t>(nq), KeyRange{0, nk});
  const std::int64_t off = causal == Causal::kBottomRight ? nk - nq : 0;
  for (std::int64_t i = 0; i < nq; ++i) {
    KeyRange& r = v[static_cast<std::size_t>(i)];
    if (causal != Causal::kNone) r.end = std::clamp<std::int64_t>(i + 1 + off, 0, nk);
    if (window > 0) r.begin = std::clamp<std::int64_t>(i + off - window + 1, 0, r.end);
  }
  return v;
}

std::vector<std::int64_t> range_sizes(const std::vector<KeyRange>& ranges) {
  std::vector<std::int64_t> n(ranges.size());
  for (std::size_t i = 0; i < ranges.size(); ++i) n[i] = ranges[i].end - ranges[i].begin;
  return n;
}

std::vector<std::int64_t> visible_keys(std::int64_t nq, std::int64_t nk, Causal causal, std::int64_t window) {
  return range_sizes(visible_ranges(nq, nk, causal, window));
}

HeadMatrices head_matrices(const Matrix& q, const Matrix& k, double scale, Causal causal, std::int64_t window) {
  NUMATTN_CHECK(q.cols() == k.cols(), "head_matrices: Q has d = {} columns, K has {}", q.cols(), k.cols());
  NUMATTN_CHECK(std::isfinite(scale) && scale > 0, "head_matrices: the scale must be finite and > 0, got {}", scale);
  const auto vis = visible_ranges(q.rows(), k.rows(), causal, window);
  HeadMatrices h;
  h.s = scale * (q * k.transpose());
  NUMATTN_CHECK(h.s.allFinite(), "head_matrices: S = scale·QKᵀ has a NaN or infinite entry (non-finite Q or K?)");
  h.a = Matrix::Zero(h.s.rows(), h.s.cols());
  h.p = Matrix::Zero(h.s.rows(), h.s.cols());
  for (std::int64_t i = 0; i < h.s.rows(); ++i) {
    const KeyRange r = vis[static_cast<std::size_t>(i)];
    const std::int64_t n = r.end - r.begin;
    if (n <= 0) continue;
    const double m = h.s.row(i).segment(r.begin, n).maxCoeff();
    double z = 0;
    for (std::int64_t j = r.begin; j < r.end; ++j) z += h.a(i, j) = std::exp(h.s(i, j) - m);
    h.p.row(i).segment(r.begin, n) = h.a.row(i).segment(r.begin, n) / z;  // z >= 1: the maximum contributes exp(0)
  }
  return h;
}

Matrix global_shift_a(const Matrix& s, Causal causal, std::int64_t window) {
  const auto vis = visible_ranges(s.rows(), s.cols(), causal, window);
  double m = kNegInf;
  for (std::int64_t i = 0; i < s.rows(); ++i)
    for (std::int64_t j = vis[static_cast<std::size_t>(i)].begin; j < vis[static_cast<std::size_t>(i)].end; ++j)
      m = std::max(m, s(i, j));
  Matrix a = Matrix::Zero(s.rows(), s.cols());
  for (std::int64_t i = 0; i < s.rows(); ++i)
    for (std::int64_t j = vis[static_cast<std::size_t>(i)].begin; j < vis[static_cast<std::size_t>(i)].end; ++j)
      a(i, j) = std::exp(s(i, j) - m);
  return a;
}

Vector row_entropy(const Matrix& p) {
  Vector e = Vector::Zero(p.rows());
  for (std::int64_t i = 0; i < p.rows(); ++i)
    for (std::int64_t j = 0; j < p.cols(); ++j)
      if (p(i, j) > 0) e[i] -= p(i, j) * std::log(p(i, j));
  return e;
}

Vector topk_mass(const Matrix& p, const std::vector<std::int64_t>& k_per_row) {
  NUMATTN_CHECK(static_cast<std::int64_t>(k_per_row.size()) == p.rows(),
                "topk_mass: {} values of k for {} rows", k_per_row.size(), p.rows());
  Vector m = Vector::Zero(p.rows());
  std::vector<double> row(static_cast<std::size_t>(p.cols()));
  for (std::int64_t i = 0; i < p.rows(); ++i) {
    const std::int64_t k = std::clamp<std::int64_t>(k_per_row[static_cast<std::size_t>(i)], 0, p.cols());
    for (std::int64_t j = 0; j < p.cols(); ++j) row[static_cast<std::size_t>(j)] = p(i, j);
    std::nth_element(row.begin(), row.begin() + k, row.end(), std::greater<>());
    // Sum the kept entries smallest first (rounding), after sorting only those k.
    std::sort(row.begin(), row.begin() + k);
    for (std::int64_t j = 0; j < k; ++j) m[i] += row[static_cast<std::size_t>(j)];
  }
  return m;
}

std::vector<std::int64_t> fixed_k(const std::vector<std::int64_t>& visible, std::int64_t k) {
  std::vector<std::int64_t> out(visible.size());
  for (std::size_t i = 0; i < visible.size(); ++i) out[i] = std::min(k, visible[i]);
  return out;
}

std::vector<std::int64_t> fraction_k(const std::vector<std::int64_t>& visible, double frac) {
  NUMATTN_CHECK(frac > 0 && frac <= 1, "fraction_k: the fraction must be in (0, 1], got {}", frac);
  std::vector<std::int64_t> out(visible.size());
  for (std::size_t i = 0; i < visible.size(); ++i)
    out[i] = std::min<std::int64_t>(visible[i], static_cast<std::int64_t>(std::ceil(frac * static_cast<double>(visible[i]) - 1e-9)));
  return out;
}

Vector key_share(const Matrix& p) {
  Vector c = Vector::Zero(p.cols());
  std::int64_t rows = 0;
  for (std::int64_t i = 0; i < p.rows(); ++i) {
    if (!(p.row(i).sum() > 0)) continue;
    c += p.row(i).transpose();
    ++rows;
  }
  if (rows > 0) c /= static_cast<double>(rows);
  return c;
}

Vector uniform_key_share(const std::vector<KeyRange>& visible, std::int64_t nk) {
  Vector u = Vector::Zero(nk);
  std::int64_t rows = 0;
  for (const KeyRange& r : visible) {
    const std::int64_t lo = std::clamp<std::int64_t>(r.begin, 0, nk), hi = std::clamp<std::int64_t>(r.end, 0, nk);
    if (hi <= lo) continue;
    u.segment(lo, hi - lo).array() += 1.0 / static_cast<double>(r.end - r.begin);
    ++rows;
  }
  if (rows > 0) u /= static_cast<double>(rows);
  return u;
}

namespace {

std::vector<KeyRange> prefix_ranges(const std::vector<std::int64_t>& visible) {
  std::vector<KeyRange> r(visible.size());
  for (std::size_t i = 0; i < visible.size(); ++i) r[i] = {0, std::max<std::int64_t>(visible[i], 0)};
  return r;
}

}  // namespace

Vector uniform_key_share(const std::vector<std::int64_t>& visible, std::int64_t nk) {
  return uniform_key_share(prefix_ranges(visible), nk);
}

std::vector<std::int64_t> sink_columns(const Matrix& p, const std::vector<KeyRange>& visible, double threshold,
                                       double factor) {
  NUMATTN_CHECK(static_cast<std::int64_t>(visible.size()) == p.rows(), "sink_columns: {} visible ranges for {} rows",
                visible.size(), p.rows());
  const Vector c = key_share(p), u = uniform_key_share(visible, p.cols());
  std::vector<std::int64_t> out;
  for (std::int64_t j = 0; j < c.size(); ++j)
    if (c[j] >= threshold && c[j] >= factor * u[j]) out.push_back(j);
  return out;
}

std::vector<std::int64_t> sink_columns(const Matrix& p, const std::vector<std::int64_t>& visible, double threshold,
                                       double factor) {
  NUMATTN_CHECK(static_cast<std::int64_t>(visible.size()) == p.rows(), "sink_columns: {} visible counts for {} rows",
                visible.size(), p.rows());
  return sink_columns(p, prefix_ranges(visible), threshold, factor);
}

Matrix top_left_panel(const Matrix& p, std::int64_t size) {
  Matrix b = p.topLeftCorner(std::min(size, p.rows()), std::min(size, p.cols()));
  for (std::int64_t i = 0; i < b.rows(); ++i) {
    const double m = b.row(i).maxCoeff();
    if (m > 0) b.row(i) /= m;
  }
  return b;
}

Matrix block_panel(const Matrix& p, std::int64_t grid) {
  NUMATTN_CHECK(grid >= 1 && p.rows() >= grid && p.cols() >= grid,
                "block_panel: a {}×{} grid needs at least {} rows and columns, P is {}×{}", grid, grid, grid,
                p.rows(), p.cols());
  Matrix g(grid, grid);
  auto edge = [grid](std::int64_t b, std::int64_t n) { return b * n / grid; };
  for (std::int64_t a = 0; a < grid; ++a)
    for (std::int64_t b = 0; b < grid; ++b) {
      const std::int64_t r0 = edge(a, p.rows()), r1 = edge(a + 1, p.rows());
      const std::int64_t c0 = edge(b, p.cols()), c1 = edge(b + 1, p.cols());
      g(a, b) = p.block(r0, c0, r1 - r0, c1 - c0).mean();
    }
  return g;
}

Matrix head_matrix(const std::vector<double>& hnd, std::int64_t h, std::int64_t n, std::int64_t d) {
  NUMATTN_CHECK(static_cast<std::int64_t>(hnd.size()) >= (h + 1) * n * d, "head_matrix: head {} is beyond an array of {} values of [H, {}, {}]",
                h, hnd.size(), n, d);
  Matrix m(n, d);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t c = 0; c < d; ++c) m(i, c) = hnd[static_cast<std::size_t>((h * n + i) * d + c)];
  return m;
}

LayerAnalysis analyze_layer(const LayerQkv& l, double scale, const std::vector<std::int64_t>& heads,
                            const ExecContext& ctx) {
  NUMATTN_CHECK(l.heads >= 1 && l.kv_heads >= 1 && l.heads % l.kv_heads == 0,
                "analyze_layer: {} query heads over {} KV heads (the query heads must be a multiple)", l.heads,
                l.kv_heads);
  NUMATTN_CHECK(l.n >= 1 && l.d >= 1, "analyze_layer: N = {}, d = {} (both must be >= 1)", l.n, l.d);
  NUMATTN_CHECK(l.window >= 0, "analyze_layer: the window must be >= 0 keys (0 = none), got {}", l.window);
  const auto q_size = static_cast<std::size_t>(l.heads * l.n * l.d), kv_size = static_cast<std::size_t>(l.kv_heads * l.n * l.d);
  NUMATTN_CHECK(l.q_post.size() == q_size && l.k_post.size() == kv_size && l.v.size() == kv_size,
                "analyze_layer: q_post, k_post, v hold {}, {}, {} values; [H, N, D] needs {}, {}, {}", l.q_post.size(),
                l.k_post.size(), l.v.size(), q_size, kv_size, kv_size);
  const bool pre = !l.q_pre.empty() || !l.k_pre.empty();
  NUMATTN_CHECK(!pre || (l.q_pre.size() == q_size && l.k_pre.size() == kv_size),
                "analyze_layer: q_pre and k_pre hold {} and {} values; [H, N, D] needs {} and {}", l.q_pre.size(),
                l.k_pre.size(), q_size, kv_size);
  std::vector<std::int64_t> qh = heads;
  if (qh.empty())
    for (std::int64_t h = 0; h < l.heads; ++h) qh.push_back(h);
  for (std::int64_t h : qh)
    NUMATTN_CHECK_OPTION(h >= 0 && h < l.heads, "heads", "head {} is out of range: the layer has {} query heads (0..{})", h,
                         l.heads, l.heads - 1);
  const std::int64_t group = l.heads / l.kv_heads;
  std::vector<std::int64_t> kvh;
  for (std::int64_t h : qh)
    if (std::find(kvh.begin(), kvh.end(), h / group) == kvh.end()) kvh.push_back(h / group);

  // One work item per query head and per KV head, each filling its own slots.
  const auto nq = static_cast<std::int64_t>(qh.size()), nkv = static_cast<std::int64_t>(kvh.size());
  const int per_q = pre ? 6 : 5, per_kv = pre ? 3 : 2;
  LayerAnalysis out;
  out.window = l.window;
  const auto vis = visible_ranges(l.n, l.n, Causal::kBottomRight, l.window);
  const auto vis_n = range_sizes(vis);
  out.spectra.resize(static_cast<std::size_t>(nq * per_q + nkv * per_kv));
  out.rows.resize(static_cast<std::size_t>(nq));
  parallel_for(ctx, nq + nkv, [&](std::int64_t item) {
    auto put = [&](std::size_t slot, std::int64_t h, const char* name, const Matrix& m) {
      HeadSpectrum& s = out.spectra[slot];
      s.head = h;
      s.matrix = name;
      s.sigma = singular_values(m, name);
      s.stats = spectrum_stats(s.sigma);
    };
    if (item < nq) {
      const std::int64_t h = qh[static_cast<std::size_t>(item)], g = h / group;
      const Matrix q = head_matrix(l.q_post, h, l.n, l.d), k = head_matrix(l.k_post, g, l.n, l.d);
      const HeadMatrices hm = head_matrices(q, k, scale, Causal::kBottomRight, l.window);
      auto slot = static_cast<std::size_t>(item * per_q);
      if (pre) put(slot++, h, "q_pre", head_matrix(l.q_pre, h, l.n, l.d));
      put(slot++, h, "q_post", q);
      put(slot++, h, "qk", hm.s);
      put(slot++, h, "a", hm.a);
      put(slot++, h, "p", hm.p);
      HeadRows& r = out.rows[static_cast<std::size_t>(item)];
      r.head = h;
      const Vector e = row_entropy(hm.p);
      r.entropy_mean = e.mean();
      r.entropy_min = e.minCoeff();
      r.entropy_max = e.maxCoeff();
      r.topk_mass_k8 = topk_mass(hm.p, fixed_k(vis_n, 8)).mean();
      r.topk_mass_k32 = topk_mass(hm.p, fixed_k(vis_n, 32)).mean();
      r.topk_mass_frac10 = topk_mass(hm.p, fraction_k(vis_n, 0.1)).mean();
      r.sinks = sink_columns(hm.p, vis);
      r.panel = top_left_panel(hm.p);
      if (l.n >= 20) r.block_grid = block_panel(hm.p);
      r.sigma_a_global = singular_values(global_shift_a(hm.s, Causal::kBottomRight, l.window), "exp(S - max S)");
      HeadSpectrum& ae = out.spectra[slot];
      ae.head = h;
      ae.matrix = "a_exp";
      ae.sigma = r.sigma_a_global;
      ae.stats = spectrum_stats(ae.sigma);
    } else {
      const std::int64_t g = kvh[static_cast<std::size_t>(item - nq)];
      auto slot = static_cast<std::size_t>(nq * per_q + (item - nq) * per_kv);
      if (pre) put(slot++, g, "k_pre", head_matrix(l.k_pre, g, l.n, l.d));
      put(slot++, g, "k_post", head_matrix(l.k_post, g, l.n, l.d));
      put(slot++, g, "v", head_matrix(l.v, g, l.n, l.d));
    }
  });
  return out;
}

}  // namespace numattn::analysis

namespace numattn::analysis {

double mean_log_decay(const Vector& sigma) {
  if (sigma.size() == 0 || !(sigma[0] > 0)) return 0;
  double t = 0;
  for (std::int64_t i = 0; i < sigma.size(); ++i) t += std::log10(std::max(sigma[i] / sigma[0], 1e-300));
  return t / static_cast<double>(sigma.size());
}

namespace {

// NaN for no heads: a statistic of nothing is reported as missing, not as an abort.
double median_of(std::vector<double> v) {
  return v.empty() ? std::numeric_limits<double>::quiet_NaN() : median(std::move(v));
}

double max_of(const std::vector<double>& v) {
  return v.empty() ? std::numeric_limits<double>::quiet_NaN() : *std::max_element(v.begin(), v.end());
}

// "holds" from the fraction of heads that pass: all (or >= `all`) true, >= half "partly".
nlohmann::ordered_json verdict(double frac, double all) {
  if (frac >= all) return true;
  if (frac >= 0.5) return "partly";
  return false;
}

}  // namespace

nlohmann::ordered_json section9_findings(const std::vector<LayerAnalysis>& layers, std::int64_t n, std::int64_t d) {
  using nlohmann::ordered_json;
  // Per matrix name, the spectra of every head of every layer.
  std::vector<double> qk_rank, q_ratio, k_ratio, qpre_ratio, kpre_ratio, q_rank, k_rank;
  std::vector<double> a_rank, ag_rank, p_rank, a_decay, ag_decay, p_decay, a_srank, ag_srank, p_srank;
  std::int64_t p_weaker_g = 0, p_weaker_a = 0, heads = 0, heads_windowed = 0;
  auto ratio = [&](const Vector& s) { return s.size() >= d && s[0] > 0 ? s[d - 1] / s[0] : 0.0; };
  for (const LayerAnalysis& la : layers) {
    for (const HeadSpectrum& s : la.spectra) {
      const std::string m = s.matrix;
      if (m == "qk") qk_rank.push_back(static_cast<double>(numerical_rank(s.sigma, 1e-10)));
      if (m == "q_post") q_ratio.push_back(ratio(s.sigma)), q_rank.push_back(static_cast<double>(s.stats.rank_rel));
      if (m == "k_post") k_ratio.push_back(ratio(s.sigma)), k_rank.push_back(static_cast<double>(s.stats.rank_rel));
      if (m == "q_pre") qpre_ratio.push_back(ratio(s.sigma));
      if (m == "k_pre") kpre_ratio.push_back(ratio(s.sigma));
    }
    for (const HeadRows& r : la.rows) {
      const HeadSpectrum *a = nullptr, *p = nullptr;
      for (const HeadSpectrum& s : la.spectra)
        if (s.head == r.head && std::string(s.matrix) == "a") a = &s;
        else if (s.head == r.head && std::string(s.matrix) == "p") p = &s;
      if (a == nullptr || p == nullptr) continue;
      ++heads;
      heads_windowed += la.window > 0;
      const SpectrumStats g = spectrum_stats(r.sigma_a_global);
      a_rank.push_back(static_cast<double>(a->stats.rank_rel));
      ag_rank.push_back(static_cast<double>(g.rank_rel));
      p_rank.push_back(static_cast<double>(p->stats.rank_rel));
      a_srank.push_back(a->stats.stable_rank);
      ag_srank.push_back(g.stable_rank);
      p_srank.push_back(p->stats.stable_rank);
      a_decay.push_back(mean_log_decay(a->sigma));
      ag_decay.push_back(mean_log_decay(r.sigma_a_global));
      p_decay.push_back(mean_log_decay(p->sigma));
      p_weaker_g += p_decay.back() > ag_decay.back();
      p_weaker_a += p_decay.back() > a_decay.back();
    }
  }
  const double nh = static_cast<double>(std::max<std::int64_t>(heads, 1));
  ordered_json out = ordered_json::array();

  {
    const double max_rank = max_of(qk_rank), mq = median_of(q_ratio), mk = median_of(k_ratio);
    const bool low_rank = max_rank <= static_cast<double>(d) && d < n;
    const bool q_mod = mq >= 1e-3 && mq <= 0.5, k_mod = mk >= 1e-3 && mk <= 0.5;
    ordered_json f;
    f["id"] = "qk_low_rank";
    f["statement"] = "Q_h and K_h, hence Q_h K_h^T, are low-rank by construction (rank <= d << N); their d singular "
                     "values show moderate decay";
    f["holds"] = !low_rank ? ordered_json(false) : (q_mod && k_mod) ? ordered_json(true) : ordered_json("partly");
    f["criterion"] = "numerical rank of S at 1e-10*sigma_1 <= d < N in every head; median over heads of "
                     "sigma_d/sigma_1 of Q and K (post-RoPE) in [1e-3, 0.5]";
    f["evidence"] = {{"n", n},
                     {"d", d},
                     {"max_rank_qk_1e-10", max_rank},
                     {"median_sigma_d_over_sigma_1_q_post", mq},
                     {"median_sigma_d_over_sigma_1_k_post", mk},
                     {"median_sigma_d_over_sigma_1_q_pre", median_of(qpre_ratio)},
                     {"median_sigma_d_over_sigma_1_k_pre", median_of(kpre_ratio)},
                     {"median_rank_rel_1e-2_q_post", median_of(q_rank)},
                     {"median_rank_rel_1e-2_k_post", median_of(k_rank)}};
    out.push_back(f);
  }
  {
    std::int64_t strong = 0, strong_a = 0;
    for (std::size_t i = 0; i < ag_rank.size(); ++i) {
      strong += ag_rank[i] <= 0.25 * static_cast<double>(n);
      strong_a += a_rank[i] <= 0.25 * static_cast<double>(n);
    }
    ordered_json f;
    f["id"] = "a_strong_decay";
    f["statement"] = "all layers and heads show strong singular value decay of A_h = exp(Q_h K_h^T / sqrt(d))";
    f["holds"] = verdict(static_cast<double>(strong) / nh, 1.0);
    f["criterion"] = std::string("A = exp(S) (causal-masked") +
                     (heads_windowed > 0 ? ", window-masked on sliding-window layers" : "") +
                     ", one global shift) has at most N/4 singular values above 1e-2*sigma_1, in every head (partly: "
                     "in at least half)";
    f["evidence"] = {{"heads", heads},
                     {"heads_strong", strong},
                     {"median_rank_rel_1e-2", median_of(ag_rank)},
                     {"max_rank_rel_1e-2", max_of(ag_rank)},
                     {"median_stable_rank", median_of(ag_srank)},
                     {"median_mean_log10_decay", median_of(ag_decay)},
                     {"rowmax_shifted_a_heads_strong", strong_a},
                     {"rowmax_shifted_a_median_rank_rel_1e-2", median_of(a_rank)},
                     {"rowmax_shifted_a_max_rank_rel_1e-2", max_of(a_rank)}};
    if (heads_windowed > 0) f["evidence"]["heads_windowed"] = heads_windowed;
    out.push_back(f);
  }
  {
    ordered_json f;
    f["id"] = "p_weaker_than_a";
    f["statement"] = "Z_h^-1 A_h decays more weakly than A_h";
    f["holds"] = verdict(static_cast<double>(p_weaker_g) / nh, 0.9);
    f["criterion"] = "mean over k of log10(sigma_k/sigma_1) larger for P than for A = exp(S), in at least 90% of "
                     "the heads (partly: at least half)";
    f["evidence"] = {{"heads", heads},
                     {"heads_p_weaker", p_weaker_g},
                     {"median_mean_log10_decay_p", median_of(p_decay)},
                     {"median_mean_log10_decay_a", median_of(ag_decay)},
                     {"median_rank_rel_1e-2_p", median_of(p_rank)},
                     {"median_rank_rel_1e-2_a", median_of(ag_rank)},
                     {"median_stable_rank_p", median_of(p_srank)},
                     {"median_stable_rank_a", median_of(ag_srank)},
                     {"rowmax_shifted_a_heads_p_weaker", p_weaker_a},
                     {"rowmax_shifted_a_median_mean_log10_decay", median_of(a_decay)}};
    if (heads_windowed > 0) f["evidence"]["heads_windowed"] = heads_windowed;
    out.push_back(f);
  }
  return out;
}

}  // namespace numattn::analysis
