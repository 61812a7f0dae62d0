#include "numattn/transform/bda_eval.h"

#include <cmath>

#include "numattn/attention/reference.h"
#include "numattn/attention/registry.h"
#include "numattn/core/blas.h"
#include "numattn/core/error.h"
#include "numattn/core/rng.h"

namespace numattn::transform {

using decomp::MatrixXd;

AttentionLayerWeights RandomLayer::view() const {
  AttentionLayerWeights w;
  w.d_model = d_model;
  w.d_kv = d_kv;
  w.heads = heads;
  w.kv_heads = kv_heads;
  w.head_dim = head_dim;
  w.layout = WeightLayout::kInOut;
  w.wq = wq;
  w.wk = wk;
  w.wv = wv;
  w.wo = wo;
  w.bq = bq;
  w.bk = bk;
  w.bv = bv;
  w.bo = bo;
  return w;
}

RandomLayer random_layer(index_t d_model, index_t d_kv, index_t heads, index_t kv_heads,
                         index_t head_dim, bool biases, std::uint64_t seed) {
  RandomLayer L;
  L.d_model = d_model;
  L.d_kv = d_kv > 0 ? d_kv : d_model;
  L.heads = heads;
  L.kv_heads = kv_heads;
  L.head_dim = head_dim;
  auto fill = [&](std::vector<float>& v, index_t rows, index_t cols, std::uint64_t stream,
                  double scale) {
    v.resize(static_cast<std::size_t>(rows * cols));
    fill_normal(v, seed, stream);
    for (auto& x : v) x = static_cast<float>(x * scale);
  };
  fill(L.wq, d_model, heads * head_dim, 11, 1.0 / std::sqrt(static_cast<double>(d_model)));
  fill(L.wk, L.d_kv, kv_heads * head_dim, 12, 1.0 / std::sqrt(static_cast<double>(L.d_kv)));
  fill(L.wv, L.d_kv, kv_heads * head_dim, 13, 1.0 / std::sqrt(static_cast<double>(L.d_kv)));
  fill(L.wo, heads * head_dim, d_model, 14, 1.0 / std::sqrt(static_cast<double>(heads * head_dim)));
  if (biases) {
    fill(L.bq, 1, heads * head_dim, 15, 0.1);
    fill(L.bk, 1, kv_heads * head_dim, 16, 0.1);
    fill(L.bv, 1, kv_heads * head_dim, 17, 0.1);
    fill(L.bo, 1, d_model, 18, 0.1);
  }
  return L;
}

namespace {

using MatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

MatrixXd to64(std::span<const float> v, index_t rows, index_t cols) {
  return Eigen::Map<const MatF>(v.data(), rows, cols).cast<double>();
}

void add_bias(MatrixXd& m, std::span<const float> b) {
  if (b.empty()) return;
  for (index_t i = 0; i < m.rows(); ++i)
    for (index_t j = 0; j < m.cols(); ++j) m(i, j) += b[static_cast<std::size_t>(j)];
}

// y = x·W + b in float32 BLAS.
std::vector<float> matmul32(const std::vector<float>& x, index_t n, index_t in,
                            std::span<const float> w, index_t out, std::span<const float> b) {
  std::vector<float> y(static_cast<std::size_t>(n * out), 0.f);
  float beta = 0.f;
  if (!b.empty()) {
    for (index_t i = 0; i < n; ++i)
      std::copy(b.begin(), b.end(), y.begin() + static_cast<std::ptrdiff_t>(i * out));
    beta = 1.f;
  }
  blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, n, out, in, 1.f, x.data(), in, w.data(), out,
              beta, y.data(), out);
  return y;
}

AttentionProblem make_problem(const float* q, const float* k, const float* v, float* out,
                              index_t n, index_t H, index_t G, index_t dh, Causal causal) {
  AttentionProblem p;
  p.q = TensorView<const float>::bnhd(q, 1, H, n, dh);
  p.k = TensorView<const float>::bnhd(k, 1, G, n, dh);
  p.v = TensorView<const float>::bnhd(v, 1, G, n, dh);
  p.out = TensorView<float>::bnhd(out, 1, H, n, dh);
  p.scale = 1.0 / std::sqrt(static_cast<double>(dh));
  p.causal = causal;
  return p;
}

double rel_fro(const MatrixXd& a, const MatrixXd& ref) {
  const double den = ref.norm();
  return den > 0 ? (a - ref).norm() / den : (a - ref).norm();
}

// Σ_j ‖Q_j·K_gᵀ − ref‖² over query heads, and the reference norm², logits in double.
void logit_err(const MatrixXd& q, const MatrixXd& k, const MatrixXd& q64, const MatrixXd& k64,
               index_t H, index_t G, index_t dh, double* num, double* den) {
  const index_t group = H / G;
  for (index_t j = 0; j < H; ++j) {
    const index_t g = j / group;
    const MatrixXd ref = q64.middleCols(j * dh, dh) * k64.middleCols(g * dh, dh).transpose();
    const MatrixXd got = q.middleCols(j * dh, dh) * k.middleCols(g * dh, dh).transpose();
    *num += (got - ref).squaredNorm();
    *den += ref.squaredNorm();
  }
}

}  // namespace

BdaAccuracy evaluate_bda(const AttentionLayerWeights& w, const BdaLayer& layer, index_t n,
                         std::uint64_t seed, const ExecContext& ctx, Causal causal) {
  NUMATTN_CHECK(w.layout == WeightLayout::kInOut && layer.layout == WeightLayout::kInOut,
                "evaluate_bda expects kInOut weights");
  NUMATTN_CHECK(n >= 1, "evaluate_bda needs at least one token");
  const index_t d = w.d_model, dkv = w.eff_d_kv(), H = w.heads, G = w.kv_heads, dh = w.head_dim;

  std::vector<float> xq(static_cast<std::size_t>(n * d)), xkv;
  fill_normal(xq, seed, 100);
  if (dkv == d) {
    xkv = xq;
  } else {
    xkv.resize(static_cast<std::size_t>(n * dkv));
    fill_normal(xkv, seed, 101);
  }

  // Float64 reference.
  const MatrixXd xq64 = to64(xq, n, d), xkv64 = to64(xkv, n, dkv);
  MatrixXd q64 = xq64 * to64(w.wq, d, H * dh);
  MatrixXd k64 = xkv64 * to64(w.wk, dkv, G * dh);
  MatrixXd v64 = xkv64 * to64(w.wv, dkv, G * dh);
  const MatrixXd k64_nobias = k64;
  add_bias(q64, w.bq);
  add_bias(k64, w.bk);
  add_bias(v64, w.bv);
  const MatF q32r = q64.cast<float>(), k32r = k64.cast<float>(), v32r = v64.cast<float>();
  std::vector<float> dummy(static_cast<std::size_t>(n * H * dh));
  AttentionProblem pref =
      make_problem(q32r.data(), k32r.data(), v32r.data(), dummy.data(), n, H, G, dh, causal);
  const ReferenceRows ref = reference_all(pref, ctx);
  MatrixXd a64(n, H * dh);
  for (index_t h = 0; h < H; ++h)
    for (index_t i = 0; i < n; ++i)
      for (index_t j = 0; j < dh; ++j)
        a64(i, h * dh + j) = ref.out[static_cast<std::size_t>((h * n + i) * dh + j)];
  MatrixXd o_ref = a64 * to64(w.wo, H * dh, d);
  add_bias(o_ref, w.bo);

  auto flash = create_exact_method();
  BdaAccuracy acc;
  acc.tokens = n;

  // Plain float32.
  {
    auto q = matmul32(xq, n, d, w.wq, H * dh, w.bq);
    auto k = matmul32(xkv, n, dkv, w.wk, G * dh, w.bk);
    auto v = matmul32(xkv, n, dkv, w.wv, G * dh, w.bv);
    std::vector<float> a(static_cast<std::size_t>(n * H * dh));
    flash->run(make_problem(q.data(), k.data(), v.data(), a.data(), n, H, G, dh, causal), ctx);
    auto o = matmul32(a, n, H * dh, w.wo, d, w.bo);
    acc.out_err_plain = rel_fro(to64(o, n, d), o_ref);
    double num = 0, den = 0;
    logit_err(to64(q, n, H * dh), to64(k, n, G * dh), q64, k64, H, G, dh, &num, &den);
    acc.logit_err_plain = std::sqrt(num / den);
  }
  // BDA float32.
  {
    auto q = matmul32(xq, n, d, layer.wq, H * dh, layer.bq);
    std::vector<float> k(static_cast<std::size_t>(n * G * dh)), v(k.size());
    layer.k_proj.project(xkv.data(), n, dkv, k.data(), G * dh, InputOrder::kOriginal, ctx);
    layer.v_proj.project(xkv.data(), n, dkv, v.data(), G * dh, InputOrder::kOriginal, ctx);
    std::vector<float> a(static_cast<std::size_t>(n * H * dh));
    flash->run(make_problem(q.data(), k.data(), v.data(), a.data(), n, H, G, dh, causal), ctx);
    auto o = matmul32(a, n, H * dh, layer.wo, d, layer.bo);
    acc.out_err_bda = rel_fro(to64(o, n, d), o_ref);
    double num = 0, den = 0;
    // With the key bias dropped, the exact logits of the rewritten layer are Q·(K − 1·b_k)ᵀ.
    logit_err(to64(q, n, H * dh), to64(k, n, G * dh), q64,
              layer.key_bias_dropped ? k64_nobias : k64, H, G, dh, &num, &den);
    acc.logit_err_bda = std::sqrt(num / den);
  }
  acc.kappa_max = 1;
  if (layer.qk.applied) acc.kappa_max = std::max(acc.kappa_max, layer.qk.kappa_max);
  if (layer.vo.applied) acc.kappa_max = std::max(acc.kappa_max, layer.vo.kappa_max);
  return acc;
}

}  // namespace numattn::transform
