#include "numattn/transform/bda.h"

#include <algorithm>

#include "numattn/core/error.h"

namespace numattn::transform {

using decomp::MatrixXd;

BdaPairs parse_bda_pairs(const std::string& s) {
  if (s == "none" || s.empty()) return BdaPairs::kNone;
  if (s == "qk") return BdaPairs::kQK;
  if (s == "vo") return BdaPairs::kVO;
  if (s == "qkvo" || s == "all") return BdaPairs::kQKVO;
  throw Error(fmt::format("unknown BDA pair selection '{}': use none, qk, vo or qkvo", s));
}

const char* to_string(BdaPairs p) {
  switch (p) {
    case BdaPairs::kNone: return "none";
    case BdaPairs::kQK: return "qk";
    case BdaPairs::kVO: return "vo";
    case BdaPairs::kQKVO: return "qkvo";
  }
  return "?";
}

namespace {

// A weight of y = x·W in `layout` as a float64 [in, out] matrix.
MatrixXd to_inout(std::span<const float> w, index_t in, index_t out, WeightLayout layout,
                  const char* name) {
  NUMATTN_CHECK(static_cast<index_t>(w.size()) == in * out,
                "BDA: {} has {} values, expected {}x{} = {}", name, w.size(), in, out, in * out);
  MatrixXd m(in, out);
  for (index_t i = 0; i < in; ++i)
    for (index_t o = 0; o < out; ++o)
      m(i, o) = layout == WeightLayout::kInOut ? w[static_cast<std::size_t>(i * out + o)]
                                               : w[static_cast<std::size_t>(o * in + i)];
  return m;
}

std::vector<float> from_inout(const MatrixXd& m, WeightLayout layout) {
  const index_t in = m.rows(), out = m.cols();
  std::vector<float> w(static_cast<std::size_t>(in * out));
  for (index_t i = 0; i < in; ++i)
    for (index_t o = 0; o < out; ++o)
      w[static_cast<std::size_t>(layout == WeightLayout::kInOut ? i * out + o : o * in + i)] =
          static_cast<float>(m(i, o));
  return w;
}

std::vector<double> to_f64(std::span<const float> b, index_t n, const char* name) {
  NUMATTN_CHECK(b.empty() || static_cast<index_t>(b.size()) == n,
                "BDA: bias {} has {} values, expected {}", name, b.size(), n);
  return std::vector<double>(b.begin(), b.end());
}

void summarise(BdaPairReport& r) {
  r.applied = true;
  r.kappa_max = 1;
  r.fallback_heads = 0;
  for (const auto& h : r.heads) {
    if (h.dense)
      ++r.fallback_heads;
    else
      r.kappa_max = std::max(r.kappa_max, h.kappa);
  }
}

}  // namespace

BdaLayer bda_transform(const AttentionLayerWeights& w, const BdaOptions& opt) {
  const index_t d = w.d_model, dkv = w.eff_d_kv(), H = w.heads, G = w.kv_heads, dh = w.head_dim;
  NUMATTN_CHECK(d >= 1 && dkv >= 1 && H >= 1 && G >= 1 && dh >= 1,
                "BDA: d_model, d_kv, heads, kv_heads and head_dim must be >= 1 (got {}, {}, {}, "
                "{}, {})", d, dkv, H, G, dh);
  NUMATTN_CHECK(H % G == 0, "BDA: heads ({}) must be a multiple of kv_heads ({})", H, G);
  NUMATTN_CHECK(w.rope_dims >= 0 && w.rope_dims <= dh,
                "BDA: rope_dims {} must be in [0, head_dim = {}]", w.rope_dims, dh);
  if (has_qk(opt.pairs))
    NUMATTN_CHECK(w.rope_dims == 0,
                  "BDA: the QK pair cannot be rewritten: RoPE rotates {} of the {} dimensions of "
                  "each Q/K head, and a rotary position R(p) does not commute with the BD "
                  "transform, so Q'·K'ᵀ would differ from Q·Kᵀ. Use the VO pair alone "
                  "(pairs \"vo\": it carries no RoPE), or decoupled RoPE with the position-free "
                  "slice only",
                  w.rope_dims, dh);
  if (opt.pairs != BdaPairs::kNone)
    NUMATTN_CHECK(dh <= dkv, "BDA: head_dim {} exceeds the K/V input dim {}: no basis of {} "
                             "input channels exists", dh, dkv, dh);
  const index_t group = H / G;

  MatrixXd wq = to_inout(w.wq, d, H * dh, w.layout, "wq");
  MatrixXd wk = to_inout(w.wk, dkv, G * dh, w.layout, "wk");
  MatrixXd wv = to_inout(w.wv, dkv, G * dh, w.layout, "wv");
  MatrixXd wo = to_inout(w.wo, H * dh, d, w.layout, "wo");
  std::vector<double> bq = to_f64(w.bq, H * dh, "bq"), bk = to_f64(w.bk, G * dh, "bk"),
                      bv = to_f64(w.bv, G * dh, "bv"), bo = to_f64(w.bo, d, "bo");

  BdaLayer L;
  L.d_model = d;
  L.d_kv = dkv;
  L.heads = H;
  L.kv_heads = G;
  L.head_dim = dh;
  L.layout = w.layout;
  L.params_before = static_cast<index_t>(w.wq.size() + w.wk.size() + w.wv.size() + w.wo.size());

  auto f32 = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };

  // QK pair: identity on K (shared per KV group); Q'_j = Q_j·W_k^g[S,:]ᵀ.
  if (has_qk(opt.pairs)) {
    std::vector<MatrixXd> blocks;
    const bool transform_bk = opt.key_bias == KeyBias::kTransform;
    L.k_proj = build_bd_projection(dkv, G, dh, wk,
                                          transform_bk ? std::span<const double>(bk)
                                                       : std::span<const double>(),
                                          opt.strategy, opt.kappa_threshold, &L.qk.heads, &blocks);
    L.key_bias_dropped = !bk.empty() && !transform_bk;
    L.qk.basis.assign(L.k_proj.permutation().begin(), L.k_proj.permutation().begin() + dh);
    summarise(L.qk);
    for (index_t j = 0; j < H; ++j) {
      const index_t g = j / group;
      if (L.k_proj.head_dense(g)) continue;
      const MatrixXd& bg = blocks[static_cast<std::size_t>(g)];  // W_k^g[S,:], dh×dh
      wq.middleCols(j * dh, dh) = (wq.middleCols(j * dh, dh) * bg.transpose()).eval();
      if (!bq.empty()) {
        Eigen::Map<Eigen::RowVectorXd> b(bq.data() + j * dh, dh);
        b = (b * bg.transpose()).eval();
      }
    }
  } else {
    const std::vector<float> wk32 = from_inout(wk, WeightLayout::kInOut);
    const std::vector<float> bk32 = f32(bk);
    L.k_proj = BdProjection::dense(dkv, G, dh, wk32, bk32);
  }

  // VO pair: identity on V; W_o'^j = W_v^g[S,:]·W_o^j.
  if (has_vo(opt.pairs)) {
    std::vector<MatrixXd> blocks;
    const bool transform_bv = opt.value_bias == ValueBias::kTransform;
    if (!bv.empty() && !transform_bv) {
      // Softmax rows sum to one: P·(V + 1·b_v)·W_o = P·V·W_o + 1·(b_v·W_o).
      if (bo.empty()) bo.assign(static_cast<std::size_t>(d), 0.0);
      Eigen::Map<Eigen::RowVectorXd> o(bo.data(), d);
      for (index_t j = 0; j < H; ++j) {
        const index_t g = j / group;
        Eigen::Map<const Eigen::RowVectorXd> b(bv.data() + g * dh, dh);
        o += b * wo.middleRows(j * dh, dh);
      }
    }
    L.v_proj = build_bd_projection(dkv, G, dh, wv,
                                          transform_bv ? std::span<const double>(bv)
                                                       : std::span<const double>(),
                                          opt.strategy, opt.kappa_threshold, &L.vo.heads, &blocks);
    L.vo.basis.assign(L.v_proj.permutation().begin(), L.v_proj.permutation().begin() + dh);
    summarise(L.vo);
    for (index_t j = 0; j < H; ++j) {
      const index_t g = j / group;
      if (L.v_proj.head_dense(g)) continue;
      const MatrixXd& bg = blocks[static_cast<std::size_t>(g)];  // W_v^g[S,:], dh×dh
      wo.middleRows(j * dh, dh) = (bg * wo.middleRows(j * dh, dh)).eval();
    }
  } else {
    const std::vector<float> wv32 = from_inout(wv, WeightLayout::kInOut);
    const std::vector<float> bv32 = f32(bv);
    L.v_proj = BdProjection::dense(dkv, G, dh, wv32, bv32);
  }

  L.wq = from_inout(wq, w.layout);
  L.wo = from_inout(wo, w.layout);
  L.bq = f32(bq);
  L.bo = f32(bo);
  L.params_after = static_cast<index_t>(L.wq.size() + L.wo.size()) + L.k_proj.weight_params() +
                   L.v_proj.weight_params();
  return L;
}

}  // namespace numattn::transform
