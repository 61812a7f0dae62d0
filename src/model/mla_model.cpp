#include "numattn/model/mla_model.h"

#include <algorithm>
#include <cmath>

#include <Eigen/Core>

#include "model/blocks/linear.h"
#include "numattn/core/blas.h"
#include "numattn/core/error.h"
#include "numattn/core/memory.h"
#include "numattn/decomp/dense.h"
#include "numattn/model/llama.h"
#include "numattn/quant/quant.h"

namespace numattn {

const char* to_string(MlaWeights w) {
  return w == MlaWeights::kF32 ? "f32" : w == MlaWeights::kSource ? "source" : "q8_0";
}

MlaWeights parse_mla_weights(const std::string& s) {
  if (s == "f32") return MlaWeights::kF32;
  if (s == "source") return MlaWeights::kSource;
  if (s == "q8_0") return MlaWeights::kQ8_0;
  throw OptionError("weights", fmt::format("'{}' is not an MLA weight storage: use f32, source or q8_0", s));
}

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
  if (quantized()) return q_proj.rows() * E + q_up.rows() * q_up.cols + q_uv.rows() * rank;
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

namespace {

// `t` when quant.h can quantize it and its block divides `cols`; else Q8_0; else F32.
GgmlType storable_type(GgmlType t, std::int64_t cols) {
  auto fits = [&](GgmlType u) {
    const GgmlTypeInfo& ti = ggml_type_info(u);
    return ti.quantizable && cols % ti.block_elems == 0;
  };
  return fits(t) ? t : fits(GgmlType::Q8_0) ? GgmlType::Q8_0 : GgmlType::F32;
}

// Appends `rows` rows of m [rows, cols] to `q`, quantized to (the storable form of) `t`; L owns
// the bytes.
void append_quantized(MlaLayer& L, QuantMatrix& q, GgmlType t, const float* m, std::int64_t rows,
                      std::int64_t cols, const char* what) {
  if (rows == 0) return;
  t = storable_type(t, cols);
  auto b = std::make_shared<const std::vector<std::uint8_t>>(quantize(t, m, rows * cols));
  q.append(t, b->data(), rows, cols, what);
  L.q_bytes.push_back(std::move(b));
}

// y [n, o1 − o0] (row stride ldy) = x [n, cols] (row stride ldx) · W[o0:o1, :]ᵀ on the calling
// thread: the decode kernels on the encoded rows for a few vectors, else the rows dequantized
// once and one GEMM (the same floats, another summation order).
void rows_product(const QuantMatrix& w, std::int64_t o0, std::int64_t o1, const float* x, std::int64_t n,
                  std::int64_t ldx, float* y, std::int64_t ldy) {
  if (n <= kQuantGemvMaxBatch) {
    quant_gemv(w, o0, o1, x, n, ldx, y - o0, ldy, false, default_cpu_path());  // y is indexed by row o
    return;
  }
  thread_local std::vector<float> tile;
  tile.resize(static_cast<std::size_t>((o1 - o0) * w.cols));
  w.dequantize_rows(o0, o1, tile.data());
  blas::sgemm(blas::Trans::kNo, blas::Trans::kYes, n, o1 - o0, w.cols, 1.f, x, ldx, tile.data(), w.cols, 0.f, y,
              ldy);
}

// rows_product of each head h < H: rows [h·m, (h+1)·m) of w times x + h·dx into y + h·dy. A
// decode step (n ≤ kQuantGemvMaxBatch) splits the heads over the context's threads: each head's
// product is a few µs, and the nine of a SmolLM2 layer on one thread cost a quarter of the MLA
// projections' time.
void heads_product(const QuantMatrix& w, std::int64_t H, std::int64_t m, const float* x, std::int64_t dx,
                   std::int64_t n, std::int64_t ldx, float* y, std::int64_t dy, std::int64_t ldy,
                   const ExecContext& ctx) {
  const auto heads = [&](std::int64_t h0, std::int64_t h1) {
    for (std::int64_t h = h0; h < h1; ++h) rows_product(w, h * m, (h + 1) * m, x + h * dx, n, ldx, y + h * dy, ldy);
  };
  const std::int64_t nt = std::min<std::int64_t>(ctx.num_threads(), H);
  if (nt <= 1 || n > kQuantGemvMaxBatch) return heads(0, H);
  parallel_for(ctx, nt, [&](std::int64_t p) { heads(H * p / nt, H * (p + 1) / nt); });
}

// The factored query of head h (MlaLayer::q_up): B_h [dn + dr, D] with [W_q_nope[h]; W_q_rope[h]]
// = B_h·G (G = the source W_q[h], [D, E]) by least squares in float64 (normal equations: G is a
// head's query projection, well conditioned); false when the residual says the rows are not such
// a product.
bool factor_query_head(const MlaLayer& L, std::int64_t h, std::int64_t E, const float* g, std::int64_t D,
                       Eigen::MatrixXd& b) {
  using RowMat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const std::int64_t dn = L.d_nope, dr = L.d_rope, H = L.n_head, q0 = L.rank + dr;
  RowMat wq(dn + dr, E), G(D, E);
  for (std::int64_t i = 0; i < dn; ++i)
    for (std::int64_t e = 0; e < E; ++e) wq(i, e) = L.w_in[static_cast<std::size_t>((q0 + h * dn + i) * E + e)];
  for (std::int64_t i = 0; i < dr; ++i)
    for (std::int64_t e = 0; e < E; ++e)
      wq(dn + i, e) = L.w_in[static_cast<std::size_t>((q0 + H * dn + h * dr + i) * E + e)];
  for (std::int64_t i = 0; i < D; ++i)
    for (std::int64_t e = 0; e < E; ++e) G(i, e) = g[i * E + e];
  const Eigen::MatrixXd gg = G * G.transpose(), rhs = G * wq.transpose();
  const decomp::dense::Solution sol = decomp::dense::cholesky_solve(gg, rhs);
  if (sol.info != decomp::dense::Info::kSuccess) return false;
  b = sol.x.transpose();  // B = W·Gᵀ·(G·Gᵀ)⁻¹
  const double res = (wq - b * G).norm(), ref = wq.norm();
  return std::isfinite(res) && res <= 1e-5 * std::max(ref, 1e-300);
}

}  // namespace

void quantize_mla_layer(MlaLayer& L, std::int64_t E, GgmlType big, GgmlType small, const QuantMatrix* source_wq) {
  NUMATTN_CHECK(!L.uk_bd && L.uv_bd.empty(), "quantize_mla_layer: the layer has a BD form (quantize before BDA)");
  const std::int64_t H = L.n_head, r = L.rank, dn = L.d_nope, dr = L.d_rope, dv = L.d_v, qw = r + dr;
  L.q_proj = {};
  L.q_up = {};
  L.q_uv = {};
  L.q_bytes.clear();
  L.q_head_dim = 0;
  append_quantized(L, L.q_proj, big, L.w_in.data(), r + dr, E, "MLA W_dkv|W_kr");
  // Factored query: every head's [W_q_nope; W_q_rope] through the source W_q's rows.
  std::vector<float> up;
  if (source_wq != nullptr && !source_wq->empty() && source_wq->cols == E && source_wq->rows() % H == 0) {
    const std::int64_t D = source_wq->rows() / H;
    const std::vector<float> g = source_wq->dequantize();
    up.assign(static_cast<std::size_t>(H * qw * D), 0.f);
    Eigen::MatrixXd b;
    bool ok = true;
    for (std::int64_t h = 0; h < H && ok; ++h) {
      ok = factor_query_head(L, h, E, g.data() + h * D * E, D, b);
      if (!ok) break;
      float* u = up.data() + h * qw * D;
      // Rows 0..r: W_uk[h]ᵀ·B_nope (the absorbed q̃_h); rows r..r+dr: B_rope.
      for (std::int64_t c = 0; c < r; ++c)
        for (std::int64_t k = 0; k < D; ++k) {
          double acc = 0;
          for (std::int64_t a = 0; a < dn; ++a)
            acc += static_cast<double>(L.w_uk[static_cast<std::size_t>((h * dn + a) * r + c)]) * b(a, k);
          u[c * D + k] = static_cast<float>(acc);
        }
      for (std::int64_t i = 0; i < dr; ++i)
        for (std::int64_t k = 0; k < D; ++k) u[(r + i) * D + k] = static_cast<float>(b(dn + i, k));
    }
    if (ok) {
      for (const QuantMatrix::Part& p : source_wq->parts) L.q_proj.append(p.type, p.data, p.rows, E, "source W_q");
      append_quantized(L, L.q_up, small, up.data(), H * qw, D, "MLA query up-projection");
      L.q_head_dim = D;
    }
  }
  if (L.q_head_dim == 0) {
    // Direct: per head [W_uk[h]ᵀ·W_q_nope[h]; W_q_rope[h]] `[r + dr, E]`.
    std::vector<float> rows(static_cast<std::size_t>(H * qw * E), 0.f);
    const float* qn = L.w_in.data() + qw * E;
    const float* qr = qn + H * dn * E;
    for (std::int64_t h = 0; h < H; ++h) {
      float* dst = rows.data() + h * qw * E;
      if (dn > 0)
        blas::sgemm(blas::Trans::kYes, blas::Trans::kNo, r, E, dn, 1.f, L.w_uk.data() + h * dn * r, r,
                    qn + h * dn * E, E, 0.f, dst, E);
      std::copy_n(qr + h * dr * E, dr * E, dst + r * E);
    }
    append_quantized(L, L.q_proj, big, rows.data(), H * qw, E, "MLA absorbed query");
  }
  append_quantized(L, L.q_uv, small, L.w_uv.data(), H * dv, r, "MLA W_uv");
}

void quantize_mla_model(LlamaModel& model, const std::vector<QuantMatrix>& source_wq, MlaWeights w) {
  if (w == MlaWeights::kF32) return;
  const std::int64_t E = model.hparams().n_embd;
  const std::size_t n = model.weights().layers.size();
  NUMATTN_CHECK(source_wq.empty() || source_wq.size() == n, "quantize_mla_model: {} source W_q for {} layers",
                source_wq.size(), n);
  std::vector<std::shared_ptr<const MlaLayer>> done(n);
  for (std::size_t l = 0; l < n; ++l) {
    const std::shared_ptr<const MlaLayer>& cur = model.weights().layers[l].mla;
    done[l] = cur;
    if (!cur) continue;
    const QuantMatrix* src = source_wq.empty() || source_wq[l].empty() ? nullptr : &source_wq[l];
    if (w == MlaWeights::kSource && src == nullptr) continue;
    MlaLayer M = *cur;
    const GgmlType big = w == MlaWeights::kSource ? src->parts.front().type : GgmlType::Q8_0;
    try {
      quantize_mla_layer(M, E, big, GgmlType::Q8_0, src);
    } catch (const Error& e) {
      throw Error(fmt::format("MLA weights of layer {}: {}", l, e.what()));
    }
    done[l] = std::make_shared<const MlaLayer>(std::move(M));
  }
  model.edit_weights([&](LlamaWeights& ew) {
    for (std::size_t l = 0; l < n; ++l) ew.layers[l].mla = done[l];
  });
}

MlaLayerWeights MlaLayer::quantized_weights(std::int64_t E) const {
  NUMATTN_CHECK(quantized(), "quantized_weights: the layer has no quantized storage");
  const std::int64_t H = n_head, r = rank, dr = d_rope, qw = r + dr;
  const std::vector<float> p = q_proj.dequantize(), uv = q_uv.dequantize();
  MlaLayerWeights w;
  w.n_head = H;
  w.rank = r;
  w.d_nope = r;
  w.d_rope = dr;
  w.d_v = d_v;
  w.softmax_scale = softmax_scale;
  w.rope_theta = rope_theta;
  w.w_dkv.assign(p.begin(), p.begin() + r * E);
  w.w_kr.assign(p.begin() + r * E, p.begin() + qw * E);
  // Each head's absorbed query rows `[r + dr, E]`, float64.
  std::vector<double> q(static_cast<std::size_t>(H * qw * E));
  if (q_head_dim == 0) {
    std::copy(p.begin() + qw * E, p.end(), q.begin());
  } else {
    const std::int64_t D = q_head_dim;
    const std::vector<float> up = q_up.dequantize();
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < qw; ++i)
        for (std::int64_t e = 0; e < E; ++e) {
          double acc = 0;
          for (std::int64_t k = 0; k < D; ++k)
            acc += static_cast<double>(up[static_cast<std::size_t>((h * qw + i) * D + k)]) *
                   p[static_cast<std::size_t>((qw + h * D + k) * E + e)];
          q[static_cast<std::size_t>((h * qw + i) * E + e)] = acc;
        }
  }
  for (std::int64_t h = 0; h < H; ++h) {
    w.w_q_nope.insert(w.w_q_nope.end(), q.begin() + h * qw * E, q.begin() + (h * qw + r) * E);
    w.w_q_rope.insert(w.w_q_rope.end(), q.begin() + (h * qw + r) * E, q.begin() + (h + 1) * qw * E);
  }
  w.w_uk.assign(static_cast<std::size_t>(H * r * r), 0.0);
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t i = 0; i < r; ++i) w.w_uk[static_cast<std::size_t>((h * r + i) * r + i)] = 1.0;
  w.w_uv.assign(uv.begin(), uv.end());
  return w;
}

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

std::int64_t mla_proj_width(const MlaLayer& L, MlaExec exec) {
  return exec == MlaExec::kAbsorbed && L.quantized() ? L.q_proj.rows() : L.in_rows();
}

namespace {

// cos/sin of position `pos` times each pair's frequency (float64 angle: pos·θ stays accurate at
// long positions), and the rotation of one RoPE vector by them.
void rope_table(const MlaLayer& L, std::int64_t pos, float* cs, float* sn) {
  for (std::int64_t j = 0; j < L.d_rope / 2; ++j) {
    const double th = static_cast<double>(pos) * L.rope_theta[static_cast<std::size_t>(j)];
    cs[j] = static_cast<float>(std::cos(th));
    sn[j] = static_cast<float>(std::sin(th));
  }
}
void rope_rotate(float* v, std::int64_t dr, const float* cs, const float* sn) {
  for (std::int64_t j = 0; j < dr / 2; ++j) {
    const float a = v[2 * j], b = v[2 * j + 1];
    v[2 * j] = a * cs[j] - b * sn[j];
    v[2 * j + 1] = a * sn[j] + b * cs[j];
  }
}

// mla_project of a quantized layer (absorbed): one product through q_proj gives [c | k_rope]
// and the query rows (direct) or each head's source query q_h, which q_up lifts to [q̃_h | q_rope_h].
void project_quantized(const MlaLayer& L, const float* xn, std::int64_t n, std::int64_t E, std::int64_t pos0,
                       float* cache_rows, float* q, float* proj, const ExecContext& gemm_ctx, Activations act) {
  const std::int64_t H = L.n_head, r = L.rank, dr = L.d_rope, W = L.cache_width(), qw = r + dr;
  const std::int64_t P = L.q_proj.rows(), D = L.q_head_dim;
  blocks::linear(gemm_ctx, act, xn, n, blocks::Weight{nullptr, &L.q_proj, P, E}, proj, false);
  if (D > 0) heads_product(L.q_up, H, qw, proj + W, D, n, P, q, qw, H * qw, gemm_ctx);
  std::vector<float> cs(static_cast<std::size_t>(dr / 2)), sn(cs.size());
  for (std::int64_t t = 0; t < n; ++t) {
    float* row = proj + t * P;
    rope_table(L, pos0 + t, cs.data(), sn.data());
    rope_rotate(row + r, dr, cs.data(), sn.data());
    std::copy_n(row, W, cache_rows + t * W);
    float* qrow = q + t * H * qw;
    if (D == 0) std::copy_n(row + W, H * qw, qrow);
    for (std::int64_t h = 0; h < H; ++h) rope_rotate(qrow + h * qw + r, dr, cs.data(), sn.data());
  }
}

}  // namespace

void mla_project(const MlaLayer& L, MlaExec exec, const float* xn, std::int64_t n, std::int64_t E,
                 std::int64_t pos0, float* cache_rows, float* q, float* proj,
                 const ExecContext& gemm_ctx, Activations act) {
  if (exec == MlaExec::kAbsorbed && L.quantized())
    return project_quantized(L, xn, n, E, pos0, cache_rows, q, proj, gemm_ctx, act);
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
                std::int64_t nk, const AttentionMethod& method, const ExecContext& ctx, float* out,
                const HalfKv& half) {
  const std::int64_t H = L.n_head, r = L.rank, dn = L.d_nope, dr = L.d_rope, dv = L.d_v;
  const std::int64_t W = L.cache_width();
  AttentionProblem p;
  p.causal = Causal::kBottomRight;
  p.scale = L.softmax_scale;
  if (exec == MlaExec::kAbsorbed) {
    // MQA over the cache: key [c | k_rope], value the c prefix of the same rows. One KV head, so
    // the flash block puts all Hq query rows of a decode step in one block: each cached row is
    // read once per step for all heads.
    const std::int64_t qw = r + dr;
    p.q = TensorView<const float>(q, {1, H, n, qw}, {n * H * qw, qw, H * qw, 1});
    p.k = TensorView<const float>(cache, {1, 1, nk, W}, {nk * W, nk * W, W, 1});
    p.v = TensorView<const float>(cache, {1, 1, nk, r}, {nk * W, nk * W, W, 1});
    p.out = TensorView<float>(out, {1, H, n, r}, {n * H * r, r, H * r, 1});
    if (half.type != KvType::kF32) {
      p.k.data = nullptr;
      p.v.data = nullptr;
      p.half = HalfKv{half.type, half.k, half.k};
      if (!method.info().caps.half_kv) {
        const WidenedKv w = widen_kv(p);
        return method.run(w.problem, ctx);
      }
    }
    method.run(p, ctx);
    return;
  }
  std::vector<float> widened;
  if (half.type != KvType::kF32) {
    widened.resize(static_cast<std::size_t>(nk * W));
    const auto to_f32 = half.type == KvType::kF16 ? fp16_to_fp32 : bf16_to_fp32;
    std::transform(half.k, half.k + nk * W, widened.begin(), to_f32);
    cache = widened.data();
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

void mla_up_values(const MlaLayer& L, const float* lat, std::int64_t n, float* att, const ExecContext& ctx) {
  const std::int64_t H = L.n_head, r = L.rank, dv = L.d_v;
  if (L.quantized()) return heads_product(L.q_uv, H, dv, lat, r, n, H * r, att, dv, H * dv, ctx);
  for (std::int64_t h = 0; h < H; ++h) up_value_head(L, h, lat + h * r, n, H * r, att + h * dv, H * dv);
}

std::vector<float> mla_attention_f32(const MlaLayer& L, const std::vector<float>& xn,
                                     std::int64_t n, std::int64_t E, std::int64_t p0, MlaExec exec,
                                     const AttentionMethod& method, const ExecContext& ctx) {
  NUMATTN_CHECK(n >= 1 && static_cast<std::int64_t>(xn.size()) == n * E,
                "mla_attention_f32: xn has {} values for {} tokens of width {}", xn.size(), n, E);
  std::vector<float> cache(static_cast<std::size_t>(n * L.cache_width()));
  std::vector<float> q(static_cast<std::size_t>(n * mla_query_width(L, exec)));
  std::vector<float> proj(static_cast<std::size_t>(n * mla_proj_width(L, exec)));
  mla_project(L, exec, xn.data(), n, E, p0, cache.data(), q.data(), proj.data(), ExecContext{1});
  std::vector<float> o(static_cast<std::size_t>(n * mla_out_width(L, exec)));
  mla_attend(L, exec, q.data(), n, cache.data(), n, method, ctx, o.data());
  if (exec == MlaExec::kNaive) return o;
  std::vector<float> att(static_cast<std::size_t>(n * L.n_head * L.d_v));
  mla_up_values(L, o.data(), n, att.data());
  return att;
}

}  // namespace numattn
