#include "numattn/model/mla_model.h"

#include <algorithm>
#include <cmath>

#include "numattn/core/blas.h"
#include "numattn/core/error.h"
#include "numattn/core/memory.h"

namespace numattn {

const char* to_string(MlaExec e) { return e == MlaExec::kNaive ? "naive" : "absorbed"; }

MlaExec parse_mla_exec(const std::string& s) {
  if (s == "naive") return MlaExec::kNaive;
  if (s == "absorbed") return MlaExec::kAbsorbed;
  throw OptionError("mla-exec", fmt::format("'{}' is not an MLA execution: use naive or absorbed", s));
}

void validate_mla_weights(const MlaLayerWeights& w, std::int64_t E, const std::string& what) {
  const std::string at = what.empty() ? "MLA layer" : what;
  NUMATTN_CHECK(w.n_head >= 1 && w.rank >= 1 && w.d_v >= 1 && w.d_nope >= 0 && w.d_rope >= 0,
                "{}: n_head = {}, rank = {}, d_v = {} must be >= 1 and d_nope = {}, d_rope = {} >= 0",
                at, w.n_head, w.rank, w.d_v, w.d_nope, w.d_rope);
  NUMATTN_CHECK(w.d_rope % 2 == 0, "{}: d_rope = {} must be even (RoPE rotates pairs)", at, w.d_rope);
  NUMATTN_CHECK(w.d_nope + w.d_rope >= 1, "{}: d_nope + d_rope = 0: the keys would be empty", at);
  NUMATTN_CHECK(std::isfinite(w.softmax_scale) && w.softmax_scale > 0,
                "{}: softmax_scale = {} must be finite and positive", at, w.softmax_scale);
  constexpr const char* sz = "MLA weight size";
  auto need = [&](const std::vector<double>& v, std::int64_t rows, std::int64_t cols, const char* name) {
    const std::int64_t n = checked_mul(rows, cols, sz);
    NUMATTN_CHECK(static_cast<std::int64_t>(v.size()) == n, "{}: {} has {} values, expected {} × {}",
                  at, name, v.size(), rows, cols);
    for (std::size_t i = 0; i < v.size(); ++i)
      NUMATTN_CHECK(std::isfinite(v[i]), "{}: {}[{}] = {} is not finite", at, name, i, v[i]);
  };
  need(w.rope_theta, w.d_rope / 2, 1, "rope_theta");
  need(w.w_dkv, w.rank, E, "w_dkv");
  need(w.w_kr, w.d_rope, E, "w_kr");
  need(w.w_q_nope, checked_mul(w.n_head, w.d_nope, sz), E, "w_q_nope");
  need(w.w_q_rope, checked_mul(w.n_head, w.d_rope, sz), E, "w_q_rope");
  need(w.w_uk, checked_mul(w.n_head, w.d_nope, sz), w.rank, "w_uk");
  need(w.w_uv, checked_mul(w.n_head, w.d_v, sz), w.rank, "w_uv");
}

std::int64_t MlaLayer::weights(std::int64_t E) const {
  const std::int64_t uk = uk_bd ? uk_bd->weight_params() : n_head * d_nope * rank;
  std::int64_t uv = uv_bd.empty() ? n_head * d_v * rank : 0;
  for (const transform::BdProjection& p : uv_bd) uv += p.weight_params();
  return in_rows() * E + uk + uv;
}

MlaLayer MlaLayer::from_weights(const MlaLayerWeights& w, std::int64_t E) {
  validate_mla_weights(w, E, "");
  MlaLayer L;
  L.n_head = w.n_head;
  L.rank = w.rank;
  L.d_nope = w.d_nope;
  L.d_rope = w.d_rope;
  L.d_v = w.d_v;
  L.softmax_scale = w.softmax_scale;
  L.rope_theta = w.rope_theta;
  L.w_in.reserve(static_cast<std::size_t>(L.in_rows() * E));
  for (const auto* m : {&w.w_dkv, &w.w_kr, &w.w_q_nope, &w.w_q_rope})
    for (double v : *m) L.w_in.push_back(static_cast<float>(v));
  L.w_uk.assign(w.w_uk.begin(), w.w_uk.end());
  L.w_uv.assign(w.w_uv.begin(), w.w_uv.end());
  return L;
}

MlaLayerWeights MlaLayer::to_weights(std::int64_t E) const {
  MlaLayerWeights w;
  w.n_head = n_head;
  w.rank = rank;
  w.d_nope = d_nope;
  w.d_rope = d_rope;
  w.d_v = d_v;
  w.softmax_scale = softmax_scale;
  w.rope_theta = rope_theta;
  auto rows = [&](std::int64_t r0, std::int64_t n) {
    return std::vector<double>(w_in.begin() + r0 * E, w_in.begin() + (r0 + n) * E);
  };
  w.w_dkv = rows(0, rank);
  w.w_kr = rows(rank, d_rope);
  w.w_q_nope = rows(rank + d_rope, n_head * d_nope);
  w.w_q_rope = rows(rank + d_rope + n_head * d_nope, n_head * d_rope);
  w.w_uk.assign(w_uk.begin(), w_uk.end());
  w.w_uv.assign(w_uv.begin(), w_uv.end());
  return w;
}

namespace {

// y[o] = Σ_i W[o, i]·x[i] for W [out, in] row-major, float64.
void matvec(const double* w, std::int64_t out, std::int64_t in, const double* x, double* y) {
  for (std::int64_t o = 0; o < out; ++o) {
    double s = 0;
    for (std::int64_t i = 0; i < in; ++i) s += w[o * in + i] * x[i];
    y[o] = s;
  }
}

void rope_pairs(double* v, std::int64_t d_rope, const std::vector<double>& theta, std::int64_t pos) {
  for (std::int64_t j = 0; j < d_rope / 2; ++j) {
    const double th = static_cast<double>(pos) * theta[static_cast<std::size_t>(j)];
    const double c = std::cos(th), s = std::sin(th);
    const double a = v[2 * j], b = v[2 * j + 1];
    v[2 * j] = a * c - b * s;
    v[2 * j + 1] = a * s + b * c;
  }
}

// Head h's values of n latent rows x (row stride ldx) into y (row stride ldy): W_uv[h]·x, or
// the BD form x[S_h] + C_h·x[S_h^c] ((r − d_v)·d_v MACs per row instead of r·d_v). Shared by
// the naive execution (x = the cached c) and the absorbed one (x = o_lat_h). ExecContext{1}:
// callers are already inside a head- or token-parallel region.
void up_value_head(const MlaLayer& L, std::int64_t h, const float* x, std::int64_t n, std::int64_t ldx,
                   float* y, std::int64_t ldy) {
  const std::int64_t r = L.rank, dv = L.d_v;
  if (!L.uv_bd.empty() && !L.uv_bd[static_cast<std::size_t>(h)].head_dense(0)) {
    L.uv_bd[static_cast<std::size_t>(h)].project(x, n, ldx, y, ldy, transform::InputOrder::kOriginal,
                                                 ExecContext{1});
    return;
  }
  blas::sgemm(blas::Trans::kNo, blas::Trans::kYes, n, dv, r, 1.f, x, ldx,
              L.w_uv.data() + h * dv * r, r, 0.f, y, ldy);
}

}  // namespace

std::vector<double> mla_attention_f64(const MlaLayerWeights& w, const std::vector<double>& xn,
                                      std::int64_t n, std::int64_t E, std::int64_t p0,
                                      MlaExec exec) {
  validate_mla_weights(w, E, "mla_attention_f64");
  NUMATTN_CHECK(n >= 1 && static_cast<std::int64_t>(xn.size()) == n * E && p0 >= 0,
                "mla_attention_f64: xn has {} values for n = {} tokens of width {} (p0 = {})",
                xn.size(), n, E, p0);
  const std::int64_t H = w.n_head, r = w.rank, dn = w.d_nope, dr = w.d_rope, dv = w.d_v;
  // Per token: c, k_rope (rotated), q_nope_h, q_rope_h (rotated).
  std::vector<double> c(static_cast<std::size_t>(n * r)), kr(static_cast<std::size_t>(n * dr)),
      qn(static_cast<std::size_t>(n * H * dn)), qr(static_cast<std::size_t>(n * H * dr));
  for (std::int64_t t = 0; t < n; ++t) {
    const double* x = xn.data() + t * E;
    matvec(w.w_dkv.data(), r, E, x, c.data() + t * r);
    matvec(w.w_kr.data(), dr, E, x, kr.data() + t * dr);
    rope_pairs(kr.data() + t * dr, dr, w.rope_theta, p0 + t);
    matvec(w.w_q_nope.data(), H * dn, E, x, qn.data() + t * H * dn);
    matvec(w.w_q_rope.data(), H * dr, E, x, qr.data() + t * H * dr);
    for (std::int64_t h = 0; h < H; ++h) rope_pairs(qr.data() + (t * H + h) * dr, dr, w.rope_theta, p0 + t);
  }
  std::vector<double> out(static_cast<std::size_t>(n * H * dv), 0.0);
  std::vector<double> s(static_cast<std::size_t>(n));
  for (std::int64_t h = 0; h < H; ++h) {
    const double* uk = w.w_uk.data() + h * dn * r;  // [dn, r]
    const double* uv = w.w_uv.data() + h * dv * r;  // [dv, r]
    // Naive: k_nope_h and v_h of every token; absorbed: nothing per key.
    std::vector<double> kn, vv;
    if (exec == MlaExec::kNaive) {
      kn.resize(static_cast<std::size_t>(n * dn));
      vv.resize(static_cast<std::size_t>(n * dv));
      for (std::int64_t t = 0; t < n; ++t) {
        matvec(uk, dn, r, c.data() + t * r, kn.data() + t * dn);
        matvec(uv, dv, r, c.data() + t * r, vv.data() + t * dv);
      }
    }
    for (std::int64_t i = 0; i < n; ++i) {
      const double* q_n = qn.data() + (i * H + h) * dn;
      const double* q_r = qr.data() + (i * H + h) * dr;
      std::vector<double> qt;
      if (exec == MlaExec::kAbsorbed) {
        qt.assign(static_cast<std::size_t>(r), 0.0);  // W_uk[h]ᵀ q_nope_h
        for (std::int64_t a = 0; a < dn; ++a)
          for (std::int64_t b = 0; b < r; ++b) qt[static_cast<std::size_t>(b)] += uk[a * r + b] * q_n[a];
      }
      double mx = -INFINITY;
      for (std::int64_t j = 0; j <= i; ++j) {
        double d = 0;
        if (exec == MlaExec::kNaive) {
          for (std::int64_t a = 0; a < dn; ++a) d += q_n[a] * kn[static_cast<std::size_t>(j * dn + a)];
        } else {
          for (std::int64_t b = 0; b < r; ++b) d += qt[static_cast<std::size_t>(b)] * c[static_cast<std::size_t>(j * r + b)];
        }
        for (std::int64_t a = 0; a < dr; ++a) d += q_r[a] * kr[static_cast<std::size_t>(j * dr + a)];
        s[static_cast<std::size_t>(j)] = w.softmax_scale * d;
        mx = std::max(mx, s[static_cast<std::size_t>(j)]);
      }
      double z = 0;
      for (std::int64_t j = 0; j <= i; ++j) z += (s[static_cast<std::size_t>(j)] = std::exp(s[static_cast<std::size_t>(j)] - mx));
      double* o = out.data() + (i * H + h) * dv;
      if (exec == MlaExec::kNaive) {
        for (std::int64_t j = 0; j <= i; ++j)
          for (std::int64_t a = 0; a < dv; ++a) o[a] += s[static_cast<std::size_t>(j)] / z * vv[static_cast<std::size_t>(j * dv + a)];
      } else {
        std::vector<double> lat(static_cast<std::size_t>(r), 0.0);
        for (std::int64_t j = 0; j <= i; ++j)
          for (std::int64_t b = 0; b < r; ++b) lat[static_cast<std::size_t>(b)] += s[static_cast<std::size_t>(j)] / z * c[static_cast<std::size_t>(j * r + b)];
        matvec(uv, dv, r, lat.data(), o);
      }
    }
  }
  return out;
}

std::int64_t mla_query_width(const MlaLayer& L, MlaExec exec) {
  return L.n_head * ((exec == MlaExec::kAbsorbed ? L.rank : L.d_nope) + L.d_rope);
}

std::int64_t mla_out_width(const MlaLayer& L, MlaExec exec) {
  return L.n_head * (exec == MlaExec::kAbsorbed ? L.rank : L.d_v);
}

void mla_project(const MlaLayer& L, MlaExec exec, const float* xn, std::int64_t n, std::int64_t E,
                 std::int64_t pos0, float* cache_rows, float* q, float* proj,
                 const ExecContext& gemm_ctx) {
  const std::int64_t H = L.n_head, r = L.rank, dn = L.d_nope, dr = L.d_rope, R = L.in_rows();
  const std::int64_t W = L.cache_width(), qw = mla_query_width(L, exec) / H;
  // One GEMM for c, k_rope, q_nope, q_rope. Inside a token block (prefill) it is
  // single-threaded; a decode step splits it over output rows like the model's other GEMMs.
  const int nt = gemm_ctx.num_threads();
  if (nt > 1 && n * R * E >= (std::int64_t{1} << 20)) {
    parallel_for(gemm_ctx, nt, [&](std::int64_t p) {
      const std::int64_t o0 = R * p / nt, o1 = R * (p + 1) / nt;
      if (o1 > o0)
        blas::sgemm(blas::Trans::kNo, blas::Trans::kYes, n, o1 - o0, E, 1.f, xn, E,
                    L.w_in.data() + o0 * E, E, 0.f, proj + o0, R);
    });
  } else {
    blas::sgemm(blas::Trans::kNo, blas::Trans::kYes, n, R, E, 1.f, xn, E, L.w_in.data(), E, 0.f, proj, R);
  }
  std::vector<float> cs(static_cast<std::size_t>(dr / 2)), sn(cs.size());
  auto rot = [&](float* v) {
    for (std::int64_t j = 0; j < dr / 2; ++j) {
      const float a = v[2 * j], b = v[2 * j + 1];
      v[2 * j] = a * cs[static_cast<std::size_t>(j)] - b * sn[static_cast<std::size_t>(j)];
      v[2 * j + 1] = a * sn[static_cast<std::size_t>(j)] + b * cs[static_cast<std::size_t>(j)];
    }
  };
  for (std::int64_t t = 0; t < n; ++t) {
    float* row = proj + t * R;
    for (std::int64_t j = 0; j < dr / 2; ++j) {
      // float64 angle: pos·θ stays accurate at long positions.
      const double th = static_cast<double>(pos0 + t) * L.rope_theta[static_cast<std::size_t>(j)];
      cs[static_cast<std::size_t>(j)] = static_cast<float>(std::cos(th));
      sn[static_cast<std::size_t>(j)] = static_cast<float>(std::sin(th));
    }
    rot(row + r);
    std::copy_n(row, W, cache_rows + t * W);
    float* qrow = q + t * H * qw;
    const float* qn = row + W;
    const float* qr = qn + H * dn;
    for (std::int64_t h = 0; h < H; ++h) {
      float* dst = qrow + h * qw;
      std::copy_n(qr + h * dr, dr, dst + qw - dr);
      rot(dst + qw - dr);
      if (exec == MlaExec::kNaive) std::copy_n(qn + h * dn, dn, dst);
    }
  }
  if (exec == MlaExec::kNaive || dn == 0) {
    if (exec == MlaExec::kAbsorbed)
      for (std::int64_t t = 0; t < n; ++t)
        for (std::int64_t h = 0; h < H; ++h) std::fill_n(q + (t * H + h) * qw, r, 0.f);
    return;
  }
  // Absorbed: q̃_h = W_uk[h]ᵀ·q_nope_h for the block's tokens, one GEMM per head:
  // Q̃_h [n, r] = Qnope_h [n, dn] · W_uk[h] [dn, r].
  // BD form of W_uk (BD heads): q̃_h[S] = q'_h, q̃_h[S^c] = C_h·q'_h, a GEMM with r − dn
  // outputs instead of r; dense heads (and layers without BD) use W_uk[h] itself.
  for (std::int64_t h = 0; h < H; ++h) {
    const float* qh = proj + W + h * dn;
    if (!L.uk_bd || L.uk_bd->head_dense(h)) {
      blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, n, r, dn, 1.f, qh, R,
                  L.w_uk.data() + h * dn * r, r, 0.f, q + h * qw, H * qw);
      continue;
    }
    const std::vector<index_t>& perm = L.uk_bd->permutation();
    std::vector<float> tmp(static_cast<std::size_t>(n * (r - dn)));
    // tmp [n, r−dn] = q' [n, dn] · C_stack[:, h block]ᵀ   (C_stack is (r−dn) × H·dn row-major)
    if (r > dn)
      blas::sgemm(blas::Trans::kNo, blas::Trans::kYes, n, r - dn, dn, 1.f, qh, R,
                  L.uk_bd_rest.data() + h * dn, H * dn, 0.f, tmp.data(), r - dn);
    for (std::int64_t t = 0; t < n; ++t) {
      float* dst = q + t * H * qw + h * qw;
      for (std::int64_t k = 0; k < dn; ++k) dst[perm[static_cast<std::size_t>(k)]] = qh[t * R + k];
      for (std::int64_t m = 0; m < r - dn; ++m)
        dst[perm[static_cast<std::size_t>(dn + m)]] = tmp[static_cast<std::size_t>(t * (r - dn) + m)];
    }
  }
}

void mla_attend(const MlaLayer& L, MlaExec exec, const float* q, std::int64_t n, const float* cache,
                std::int64_t nk, const AttentionMethod& method, const ExecContext& ctx, float* out) {
  const std::int64_t H = L.n_head, r = L.rank, dn = L.d_nope, dr = L.d_rope, dv = L.d_v;
  const std::int64_t W = L.cache_width();
  AttentionProblem p;
  p.causal = Causal::kBottomRight;
  p.scale = L.softmax_scale;
  if (exec == MlaExec::kAbsorbed) {
    // MQA over the cache: key [c | k_rope], value the c prefix of the same rows.
    const std::int64_t qw = r + dr;
    p.q = TensorView<const float>(q, {1, H, n, qw}, {n * H * qw, qw, H * qw, 1});
    p.k = TensorView<const float>(cache, {1, 1, nk, W}, {nk * W, nk * W, W, 1});
    p.v = TensorView<const float>(cache, {1, 1, nk, r}, {nk * W, nk * W, W, 1});
    p.out = TensorView<float>(out, {1, H, n, r}, {n * H * r, r, H * r, 1});
    method.run(p, ctx);
    return;
  }
  // Naive: rebuild [k_nope_h | k_rope] and v_h for all nk tokens, then MHA (Hq KV heads).
  const std::int64_t dk = dn + dr;
  constexpr const char* what = "MLA naive key/value size";
  check_memory(static_cast<std::uint64_t>(checked_mul(checked_mul(nk, H * (dk + dv), what), 4, what)),
               fmt::format("the naive MLA execution's keys and values of {} tokens ({} heads)", nk, H));
  std::vector<float> K(static_cast<std::size_t>(nk * H * dk)), V(static_cast<std::size_t>(nk * H * dv));
  std::vector<float> kn_bd;
  if (L.uk_bd && dn > 0) {
    kn_bd.resize(static_cast<std::size_t>(nk * H * dn));
    L.uk_bd->project(cache, nk, W, kn_bd.data(), H * dn, transform::InputOrder::kOriginal, ctx);
  }
  parallel_for(ctx, H, [&](std::int64_t h) {
    if (dn > 0) {
      if (L.uk_bd) {
        for (std::int64_t t = 0; t < nk; ++t)
          std::copy_n(kn_bd.data() + t * H * dn + h * dn, dn, K.data() + (t * H + h) * dk);
      } else {
        blas::sgemm(blas::Trans::kNo, blas::Trans::kYes, nk, dn, r, 1.f, cache, W,
                    L.w_uk.data() + h * dn * r, r, 0.f, K.data() + h * dk, H * dk);
      }
    }
    for (std::int64_t t = 0; t < nk; ++t) std::copy_n(cache + t * W + r, dr, K.data() + (t * H + h) * dk + dn);
    up_value_head(L, h, cache, nk, W, V.data() + h * dv, H * dv);
  });
  p.q = TensorView<const float>(q, {1, H, n, dk}, {n * H * dk, dk, H * dk, 1});
  p.k = TensorView<const float>(K.data(), {1, H, nk, dk}, {nk * H * dk, dk, H * dk, 1});
  p.v = TensorView<const float>(V.data(), {1, H, nk, dv}, {nk * H * dv, dv, H * dv, 1});
  p.out = TensorView<float>(out, {1, H, n, dv}, {n * H * dv, dv, H * dv, 1});
  method.run(p, ctx);
}

void mla_up_values(const MlaLayer& L, const float* lat, std::int64_t n, float* att) {
  const std::int64_t H = L.n_head, r = L.rank, dv = L.d_v;
  for (std::int64_t h = 0; h < H; ++h) up_value_head(L, h, lat + h * r, n, H * r, att + h * dv, H * dv);
}

std::vector<float> mla_attention_f32(const MlaLayer& L, const std::vector<float>& xn,
                                     std::int64_t n, std::int64_t E, std::int64_t p0, MlaExec exec,
                                     const AttentionMethod& method, const ExecContext& ctx) {
  NUMATTN_CHECK(n >= 1 && static_cast<std::int64_t>(xn.size()) == n * E,
                "mla_attention_f32: xn has {} values for {} tokens of width {}", xn.size(), n, E);
  std::vector<float> cache(static_cast<std::size_t>(n * L.cache_width()));
  std::vector<float> q(static_cast<std::size_t>(n * mla_query_width(L, exec)));
  std::vector<float> proj(static_cast<std::size_t>(n * L.in_rows()));
  mla_project(L, exec, xn.data(), n, E, p0, cache.data(), q.data(), proj.data(), ExecContext{1});
  std::vector<float> o(static_cast<std::size_t>(n * mla_out_width(L, exec)));
  mla_attend(L, exec, q.data(), n, cache.data(), n, method, ctx, o.data());
  if (exec == MlaExec::kNaive) return o;
  std::vector<float> att(static_cast<std::size_t>(n * L.n_head * L.d_v));
  mla_up_values(L, o.data(), n, att.data());
  return att;
}

}  // namespace numattn
