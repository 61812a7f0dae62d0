#include "numattn/attention/random_problem.h"

#include <cmath>
#include <initializer_list>

#include "numattn/core/memory.h"
#include "numattn/core/rng.h"

namespace numattn {

Dist parse_dist(const std::string& s) {
  if (s == "gaussian") return Dist::kGaussian;
  if (s == "uniform") return Dist::kUniform;
  if (s == "spiky") return Dist::kSpiky;
  throw Error(fmt::format("unknown distribution '{}' (valid: gaussian, spiky, uniform)", s));
}

const char* to_string(Dist d) {
  switch (d) {
    case Dist::kGaussian: return "gaussian";
    case Dist::kUniform: return "uniform";
    case Dist::kSpiky: return "spiky";
  }
  return "?";
}

namespace {
TensorView<float> make_view(std::vector<float>& buf, Layout layout, index_t b, index_t h, index_t n,
                            index_t d) {
  return layout == Layout::kBHND ? TensorView<float>::contiguous(buf.data(), {b, h, n, d})
                                 : TensorView<float>::bnhd(buf.data(), b, h, n, d);
}

}  // namespace

void fill_random_rows(const ProblemConfig& c, char which, index_t row0, TensorView<float> dst) {
  NUMATTN_CHECK(which == 'q' || which == 'k' || which == 'v', "fill_random_rows: tensor '{}'", which);
  const index_t H = which == 'q' ? c.heads : c.eff_kv_heads();
  const index_t N = which == 'q' ? c.n : c.eff_n_kv();
  const index_t D = which == 'v' ? c.eff_dv() : c.d;
  const index_t B = c.batch, rows = dst.shape[2];
  NUMATTN_CHECK(dst.shape[0] == B && dst.shape[1] == H && dst.shape[3] == D && row0 >= 0 && row0 + rows <= N,
                "fill_random_rows: {} rows from {} of {} do not fit [{}, {}, {}, {}]", rows, row0,
                which, B, H, N, D);
  const std::uint64_t stream = which == 'q' ? 1 : which == 'k' ? 2 : 3;
  const CounterRng rng(c.seed, stream);
  // Element (b, h, n, d) is draw number `its index in the full tensor's storage order`.
  auto index = [&](index_t b, index_t h, index_t n, index_t d) {
    return static_cast<std::uint64_t>(c.layout == Layout::kBHND ? ((b * H + h) * N + n) * D + d
                                                                : ((b * N + n) * H + h) * D + d);
  };
  // Spiky: a shared direction w with |w| = d^{1/4}: ~2% of keys get +4w and every query +w, so
  // the spiky keys gain about +4 logit units (at scale 1/sqrt(d)) and dominate their rows.
  std::vector<double> u;
  double s = 0;
  if (c.dist == Dist::kSpiky && which != 'v') {
    u.resize(static_cast<std::size_t>(c.d));
    fill_normal(u, c.seed, 4);
    double nrm = 0;
    for (double x : u) nrm += x * x;
    s = std::pow(static_cast<double>(c.d), 0.25) / std::sqrt(nrm);
  }
  const CounterRng pick(c.seed, 5);
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t r = 0; r < rows; ++r) {
        const index_t n = row0 + r;
        float* out = dst.row(b, h, r);
        for (index_t d = 0; d < D; ++d) {
          const std::uint64_t i = index(b, h, n, d);
          out[d] = c.dist == Dist::kUniform ? static_cast<float>(-1.0 + 2.0 * rng.uniform(i))
                                            : static_cast<float>(rng.normal(i));
        }
        if (!u.empty()) {
          if (which == 'q') {
            for (index_t d = 0; d < D; ++d) out[d] += static_cast<float>(s * u[static_cast<std::size_t>(d)]);
          } else if (pick.uniform(static_cast<std::uint64_t>((b * H + h) * N + n)) < 0.02) {
            for (index_t d = 0; d < D; ++d) out[d] += static_cast<float>(4.0 * s * u[static_cast<std::size_t>(d)]);
          }
        }
        if (which == 'q' && c.logit_scale != 1.0)
          for (index_t d = 0; d < D; ++d) out[d] = static_cast<float>(out[d] * c.logit_scale);
      }
}

RandomProblem::RandomProblem(const ProblemConfig& c) : cfg_(c) {
  const index_t B = c.batch, H = c.heads, Hk = c.eff_kv_heads(), N = c.n, Nk = c.eff_n_kv(),
                D = c.d, Dv = c.eff_dv();
  NUMATTN_CHECK(B >= 1 && H >= 1 && Hk >= 1 && N >= 1 && Nk >= 1 && D >= 1 && Dv >= 1,
                "problem sizes must be >= 1 (batch={} heads={} kv_heads={} n={} n_kv={} d={} dv={})",
                B, H, Hk, N, Nk, D, Dv);
  NUMATTN_CHECK_OPTION(H % Hk == 0, "kv_heads", "heads ({}) must be a multiple of kv_heads ({})",
                       H, Hk);
  // q, k, v, out and lse, sized with checked products so that a huge shape is refused by
  // the memory check instead of wrapping around into a small (or negative) size.
  constexpr const char* what = "random problem size";
  auto prod = [&](std::initializer_list<index_t> f) {
    index_t p = 1;
    for (index_t x : f) p = checked_mul(p, x, what);
    return p;
  };
  const index_t dims = checked_add(D, Dv, what);
  const index_t floats = checked_add(
      checked_add(prod({B, H, N, dims}), prod({B, Hk, Nk, dims}), what), prod({B, H, N}), what);
  check_memory(static_cast<std::uint64_t>(checked_mul(floats, 4, what)),
               fmt::format("the random problem (batch={} heads={} kv_heads={} n={} n_kv={} d={} "
                           "dv={}: q, k, v, out, lse in float32)",
                           B, H, Hk, N, Nk, D, Dv));
  q_.resize(static_cast<std::size_t>(B * H * N * D));
  k_.resize(static_cast<std::size_t>(B * Hk * Nk * D));
  v_.resize(static_cast<std::size_t>(B * Hk * Nk * Dv));
  out_.assign(static_cast<std::size_t>(B * H * N * Dv), 0.f);
  auto qv = make_view(q_, c.layout, B, H, N, D);
  auto kv = make_view(k_, c.layout, B, Hk, Nk, D);
  auto vv = make_view(v_, c.layout, B, Hk, Nk, Dv);
  fill_random_rows(c, 'q', 0, qv);
  fill_random_rows(c, 'k', 0, kv);
  fill_random_rows(c, 'v', 0, vv);

  problem_.q = qv;
  problem_.k = kv;
  problem_.v = vv;
  problem_.out = make_view(out_, c.layout, B, H, N, Dv);
  set_lse(c.want_lse);
  problem_.scale = c.scale;
  problem_.causal = c.causal;
  problem_.window_left = c.window_left;
  problem_.window_right = c.window_right;
}

void RandomProblem::set_bool_mask(const std::vector<std::uint8_t>& allowed) {
  NUMATTN_CHECK(static_cast<index_t>(allowed.size()) == cfg_.n * cfg_.eff_n_kv(),
                "bool mask must have Nq*Nk = {} entries", cfg_.n * cfg_.eff_n_kv());
  bool_mask_ = allowed;
  problem_.mask = {MaskKind::kBool, bool_mask_.data(), nullptr, cfg_.eff_n_kv()};
}

void RandomProblem::set_additive_mask(const std::vector<float>& add) {
  NUMATTN_CHECK(static_cast<index_t>(add.size()) == cfg_.n * cfg_.eff_n_kv(),
                "additive mask must have Nq*Nk = {} entries", cfg_.n * cfg_.eff_n_kv());
  add_mask_ = add;
  problem_.mask = {MaskKind::kAdditive, nullptr, add_mask_.data(), cfg_.eff_n_kv()};
}

void RandomProblem::set_lse(bool on) {
  if (!on) {
    problem_.lse = {};
    return;
  }
  lse_.assign(static_cast<std::size_t>(cfg_.batch * cfg_.heads * cfg_.n), 0.f);
  problem_.lse = TensorView<float>::contiguous(lse_.data(), {cfg_.batch, cfg_.heads, cfg_.n, 1});
}

std::size_t RandomProblem::bytes() const {
  return 4 * (q_.size() + k_.size() + v_.size() + out_.size() + lse_.size());
}

}  // namespace numattn
