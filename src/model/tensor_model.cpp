#include "numattn/model/tensor_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include <Eigen/Core>

#include "numattn/core/error.h"
#include "numattn/core/memory.h"
#include "numattn/model/mla_model.h"

namespace numattn {

namespace {

using decomp::dense::Matrix;
using RowMajorF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Rows [r0, r0 + rows) of a row-major [*, cols] weight held as float32 or in place, as float64.
Matrix weight_rows(const std::vector<float>& f, const QuantMatrix& q, std::int64_t r0, std::int64_t rows,
                   std::int64_t cols) {
  std::vector<float> buf;
  const float* p = nullptr;
  if (q.empty()) {
    p = f.data() + r0 * cols;
  } else {
    buf.resize(static_cast<std::size_t>(rows * cols));
    q.dequantize_rows(r0, r0 + rows, buf.data());
    p = buf.data();
  }
  return Eigen::Map<const RowMajorF>(p, rows, cols).cast<double>();
}

/// `m` written as row-major float32 rows at `dst` (leading dimension `ld`).
void store_rows(const Matrix& m, float* dst, std::int64_t ld) {
  for (std::int64_t r = 0; r < m.rows(); ++r)
    for (std::int64_t c = 0; c < m.cols(); ++c) dst[r * ld + c] = static_cast<float>(m(r, c));
}

void finish_report(TensorModelReport& rep) {
  rep.params_before = rep.params_after = 0;
  rep.fit_min = 1;
  double fsum = 0;
  for (const auto& p : rep.parts) {
    rep.params_before += p.params_before;
    rep.params_after += p.params_after;
    rep.fit_min = std::min(rep.fit_min, p.fit);
    fsum += p.fit;
    rep.not_converged += p.info == decomp::dense::Info::kNoConvergence;
  }
  rep.fit_mean = rep.parts.empty() ? 1 : fsum / static_cast<double>(rep.parts.size());
}

std::vector<float> to_f32(const Matrix& m) {
  std::vector<float> v(static_cast<std::size_t>(m.size()));
  store_rows(m, v.data(), m.cols());
  return v;
}

/// A [rows, cols] row-major float32 factor as float64.
Matrix from_f32(const std::vector<float>& v, std::int64_t rows, std::int64_t cols, const char* what) {
  NUMATTN_CHECK(static_cast<std::int64_t>(v.size()) == rows * cols, "tensor factors: {} has {} values, expected {}×{}",
                what, v.size(), rows, cols);
  return Eigen::Map<const RowMajorF>(v.data(), rows, cols).cast<double>();
}

Matrix source_matrix(const TensorSourceRows& source, std::int64_t l, const char* kind, std::int64_t rows,
                     std::int64_t cols) {
  return from_f32(source(l, kind), rows, cols, kind);
}

/// Factored collaborative VO (LlamaLayer::vo_mix): wqkv = [Wq; Wk; V'], wo = O', the mixing
/// vectors; the model keeps head dim D.
LlamaModel build_vo_factored(const ModelHParams& hp, LlamaWeights w, const TensorFactors& f,
                             const TensorSourceRows& source) {
  const std::int64_t E = hp.n_embd, D = hp.head_dim, Hq = hp.n_head, Hkv = hp.n_head_kv, L = hp.n_layer;
  const std::int64_t R = f.cp.front().rank;
  for (std::int64_t l = 0; l < L; ++l) {
    LlamaLayer& Ly = w.layers[static_cast<std::size_t>(l)];
    const TensorFactors::Cp& c = f.cp[static_cast<std::size_t>(l)];
    NUMATTN_CHECK(c.rank == R, "tensor factors: layer {} has rank {}, layer 0 {}", l, c.rank, R);
    const Matrix right = from_f32(c.right, E, R, "right");
    std::vector<float> qkv = source(l, "attn_q"), k = source(l, "attn_k");
    NUMATTN_CHECK(static_cast<std::int64_t>(qkv.size()) == Hq * D * E && static_cast<std::int64_t>(k.size()) == Hkv * D * E,
                  "tensor factors: layer {}'s attn_q/attn_k have {}/{} values", l, qkv.size(), k.size());
    qkv.insert(qkv.end(), k.begin(), k.end());
    qkv.resize(static_cast<std::size_t>(((Hq + Hkv) * D + R) * E));
    store_rows(right.transpose(), qkv.data() + (Hq + Hkv) * D * E, E);
    NUMATTN_CHECK(static_cast<std::int64_t>(c.left.size()) == E * R && static_cast<std::int64_t>(c.mix.size()) == Hq * R,
                  "tensor factors: layer {}'s O'/mixing have {}/{} values", l, c.left.size(), c.mix.size());
    Ly.wqkv = std::move(qkv);
    Ly.wqkv_q = {};
    Ly.wo = c.left;  // O' [E, R], row-major
    Ly.wo_q = {};
    Ly.vo_mix = c.mix;
    Ly.vo_rank = R;
  }
  return LlamaModel(hp, std::move(w));
}

/// Collaborative heads, VO side or QK side, embedded in a model of head dim max(D, R)
/// (model/tensor_model.h).
LlamaModel build_cp(const ModelHParams& hp, LlamaWeights w, const TensorFactors& f, const TensorSourceRows& source) {
  const bool vo = f.spec.scheme == transform::TensorScheme::kVoCp;
  const std::int64_t E = hp.n_embd, D = hp.head_dim, Hq = hp.n_head, Hkv = hp.n_head_kv, L = hp.n_layer;
  NUMATTN_CHECK(static_cast<std::int64_t>(f.cp.size()) == L && static_cast<std::int64_t>(w.layers.size()) == L,
                "tensor factors: {} CP layers for a model of {} layers", f.cp.size(), L);
  const std::int64_t R = f.cp.front().rank;
  if (vo && f.spec.factored) return build_vo_factored(hp, std::move(w), f, source);
  const std::int64_t Dp = std::max(D, R);
  ModelHParams hp2 = hp;
  hp2.head_dim = Dp;
  // Q is scaled so that the embedded model's default scale 1/sqrt(D') is the original 1/sqrt(D).
  const double qscale = std::sqrt(static_cast<double>(Dp) / static_cast<double>(D));
  for (std::int64_t l = 0; l < L; ++l) {
    LlamaLayer& Ly = w.layers[static_cast<std::size_t>(l)];
    const TensorFactors::Cp& c = f.cp[static_cast<std::size_t>(l)];
    NUMATTN_CHECK(c.rank == R, "tensor factors: layer {} has rank {}, layer 0 {}", l, c.rank, R);
    const Matrix left = from_f32(c.left, E, R, "left"), right = from_f32(c.right, E, R, "right"),
                 mix = from_f32(c.mix, Hq, R, "mix");
    std::vector<float> qkv(static_cast<std::size_t>((Hq + 2 * Hkv) * Dp * E), 0.f);
    std::vector<float> wo(static_cast<std::size_t>(E * Hq * Dp), 0.f);
    if (vo) {
      const Matrix wq = source_matrix(source, l, "attn_q", Hq * D, E);
      const Matrix wk = source_matrix(source, l, "attn_k", Hkv * D, E);
      for (std::int64_t h = 0; h < Hq; ++h) {
        store_rows(wq.middleRows(h * D, D) * qscale, qkv.data() + h * Dp * E, E);
        store_rows(left * mix.row(h).transpose().asDiagonal(), wo.data() + h * Dp, Hq * Dp);
      }
      for (std::int64_t g = 0; g < Hkv; ++g) {
        store_rows(wk.middleRows(g * D, D), qkv.data() + (Hq + g) * Dp * E, E);
        store_rows(right.transpose(), qkv.data() + (Hq + Hkv + g) * Dp * E, E);
      }
    } else {
      const Matrix wv = source_matrix(source, l, "attn_v", Hkv * D, E);
      const Matrix wo_old = source_matrix(source, l, "attn_output", E, Hq * D);
      for (std::int64_t h = 0; h < Hq; ++h) {
        store_rows(mix.row(h).transpose().asDiagonal() * left.transpose() * qscale, qkv.data() + h * Dp * E, E);
        store_rows(wo_old.middleCols(h * D, D), wo.data() + h * Dp, Hq * Dp);
      }
      for (std::int64_t g = 0; g < Hkv; ++g) {
        store_rows(right.transpose(), qkv.data() + (Hq + g) * Dp * E, E);
        store_rows(wv.middleRows(g * D, D), qkv.data() + (Hq + Hkv + g) * Dp * E, E);
      }
    }
    Ly.wqkv = std::move(qkv);
    Ly.wqkv_q = {};
    Ly.wo = std::move(wo);
    Ly.wo_q = {};
  }
  return LlamaModel(hp2, std::move(w));
}

/// Tucker / shared factors: every matrix of the rebuilt group, W_l = left·C_l·rightᵀ.
/// The float32 matrix of layer `Ly` a weight kind lives in (its in-place copy dropped: the kinds
/// of a scheme cover the whole matrix), sized for the model `hp`.
std::vector<float>& rebuilt_matrix(LlamaLayer& Ly, int matrix, const ModelHParams& hp) {
  std::vector<float>* dst = nullptr;
  std::int64_t n = 0;
  const std::int64_t E = hp.n_embd;
  switch (matrix) {
    case 0: dst = &Ly.wqkv, n = (hp.n_head + 2 * hp.n_head_kv) * hp.head_dim * E, Ly.wqkv_q = {}; break;
    case 1: dst = &Ly.wo, n = E * hp.n_head * hp.head_dim, Ly.wo_q = {}; break;
    case 2: dst = &Ly.w_gate_up, n = 2 * hp.n_ff * E, Ly.w_gate_up_q = {}; break;
    default: dst = &Ly.w_down, n = E * hp.n_ff, Ly.w_down_q = {}; break;
  }
  dst->resize(static_cast<std::size_t>(n));
  return *dst;
}

/// Tucker / shared factors: every slice of every stack, W_s = left·C_s·rightᵀ, put in place:
/// tucker-qkvo/-ffn slice s = layer s's matrix; tucker-heads slice h = head h's E × D block.
LlamaModel build_tucker(const ModelHParams& hp, LlamaWeights w, const TensorFactors& f) {
  const std::int64_t L = hp.n_layer, D = hp.head_dim;
  const bool heads = f.spec.scheme == transform::TensorScheme::kTuckerHeads;
  const std::vector<TensorStackKind> kinds = tensor_stack_kinds(f.spec.scheme, hp);
  const auto nk = static_cast<std::int64_t>(kinds.size());
  NUMATTN_CHECK(static_cast<std::int64_t>(f.stacks.size()) == (heads ? L * nk : nk) &&
                    static_cast<std::int64_t>(w.layers.size()) == L,
                "tensor factors: {} stacks, the scheme has {}", f.stacks.size(), heads ? L * nk : nk);
  for (std::size_t i = 0; i < f.stacks.size(); ++i) {
    const TensorStackKind& k = kinds[i % kinds.size()];
    const TensorFactors::Stack& st = f.stacks[i];
    const std::int64_t S = k.slices;
    NUMATTN_CHECK(st.rows == k.rows && st.cols == k.cols && st.bank >= 1 && (st.coef.empty() ? st.bank == S : true),
                  "tensor factors: {} is {}×{} with {} cores, the model needs {}×{}", st.name, st.rows, st.cols,
                  st.bank, k.rows, k.cols);
    const std::int64_t r1 = st.rank_rows, r2 = st.rank_cols;
    const Matrix left = from_f32(st.left, k.rows, r1, "left"), right = from_f32(st.right, k.cols, r2, "right");
    NUMATTN_CHECK(static_cast<std::int64_t>(st.cores.size()) == st.bank * r1 * r2,
                  "tensor factors: {} cores hold {} values, expected {}×{}×{}", st.name, st.cores.size(), st.bank, r1, r2);
    const Matrix coef = st.coef.empty() ? Matrix() : from_f32(st.coef, S, st.bank, "coef");
    auto core = [&](std::int64_t b) {
      return Eigen::Map<const RowMajorF>(st.cores.data() + b * r1 * r2, r1, r2).cast<double>();
    };
    for (std::int64_t s = 0; s < S; ++s) {
      Matrix c;
      if (coef.size() == 0) {
        c = core(s);
      } else {
        c = Matrix::Zero(r1, r2);
        for (std::int64_t b = 0; b < st.bank; ++b) c += coef(s, b) * core(b);
      }
      const Matrix ws = left * c * right.transpose();
      const std::int64_t l = heads ? static_cast<std::int64_t>(i) / nk : s;
      std::vector<float>& dst = rebuilt_matrix(w.layers[static_cast<std::size_t>(l)], k.matrix, hp);
      if (!heads) {
        store_rows(ws, dst.data() + k.r0 * k.cols, k.cols);
      } else if (k.matrix == 0) {
        store_rows(ws.transpose(), dst.data() + (k.r0 + s * D) * hp.n_embd, hp.n_embd);  // head rows of W_q/k/v
      } else {
        store_rows(ws, dst.data() + s * D, hp.n_head * D);  // head columns of W_o
      }
    }
  }
  return LlamaModel(hp, std::move(w));
}

TensorPartReport part_report(std::string name, double fit, int iterations, decomp::dense::Info info,
                             std::string message, std::int64_t r1, std::int64_t r2, std::int64_t before,
                             std::int64_t after) {
  TensorPartReport p;
  p.name = std::move(name);
  p.fit = fit;
  p.iterations = iterations;
  p.info = info;
  p.message = std::move(message);
  p.rank_rows = r1;
  p.rank_cols = r2;
  p.params_before = before;
  p.params_after = after;
  return p;
}

/// The model's own attention matrices, for build_tensor_model.
TensorSourceRows model_source(const LlamaModel& model) {
  return [&model](std::int64_t l, const char* kind) {
    const ModelHParams& hp = model.hparams();
    const std::int64_t E = hp.n_embd, D = hp.head_dim, Hq = hp.n_head, Hkv = hp.n_head_kv;
    const LlamaLayer& Ly = model.weights().layers[static_cast<std::size_t>(l)];
    const std::string k = kind;
    const Matrix m = k == "attn_output" ? weight_rows(Ly.wo, Ly.wo_q, 0, E, Hq * D)
                     : k == "attn_q"    ? weight_rows(Ly.wqkv, Ly.wqkv_q, 0, Hq * D, E)
                     : k == "attn_k"    ? weight_rows(Ly.wqkv, Ly.wqkv_q, Hq * D, Hkv * D, E)
                                        : weight_rows(Ly.wqkv, Ly.wqkv_q, (Hq + Hkv) * D, Hkv * D, E);
    return to_f32(m);
  };
}

/// Collaborative heads, VO side (`vo`) or QK side: the factors of every layer.
void compress_cp(const LlamaModel& model, const transform::TensorSpec& spec, const ExecContext& ctx,
                 TensorModelReport& rep, TensorFactors& fac) {
  const bool vo = spec.scheme == transform::TensorScheme::kVoCp;
  const char* name = transform::to_string(spec.scheme);
  const ModelHParams& hp = model.hparams();
  const std::int64_t E = hp.n_embd, D = hp.head_dim, Hq = hp.n_head, Hkv = hp.n_head_kv, L = hp.n_layer;
  std::vector<transform::CollabHeads> heads(static_cast<std::size_t>(L));
  transform::CollabOptions co;
  co.rank = spec.rank;
  co.max_iterations = spec.iterations();
  co.seed = spec.seed;
  const auto& layers = model.weights().layers;
  parallel_for(ctx, L, [&](std::int64_t l) {
    const LlamaLayer& Ly = layers[static_cast<std::size_t>(l)];
    // VO: T_h = W_O,h·W_V,g(h); QK: T_h = W_Q,hᵀ·W_K,g(h).
    std::vector<Matrix> left, right;
    if (vo) {
      const Matrix wo = weight_rows(Ly.wo, Ly.wo_q, 0, E, Hq * D);
      for (std::int64_t h = 0; h < Hq; ++h) left.push_back(wo.middleCols(h * D, D));
    } else {
      for (std::int64_t h = 0; h < Hq; ++h) left.push_back(weight_rows(Ly.wqkv, Ly.wqkv_q, h * D, D, E).transpose());
    }
    const std::int64_t r0 = vo ? Hq + Hkv : Hq;
    for (std::int64_t g = 0; g < Hkv; ++g) right.push_back(weight_rows(Ly.wqkv, Ly.wqkv_q, (r0 + g) * D, D, E));
    try {
      heads[static_cast<std::size_t>(l)] = transform::collaborative_heads(left, right, co);
    } catch (const OptionError&) {
      throw;
    } catch (const Error& e) {
      throw Error(fmt::format("{} on layer {}: {}", name, l, e.what()));
    }
  });
  for (std::int64_t l = 0; l < L; ++l) {
    const transform::CollabHeads& c = heads[static_cast<std::size_t>(l)];
    fac.cp.push_back({c.rank(), to_f32(c.left), to_f32(c.right), to_f32(c.mix)});
    rep.parts.push_back(part_report(fmt::format("layer {}", l), c.fit, c.iterations, c.info, c.message, c.rank(),
                                    c.rank(), c.params_before, c.params_after));
  }
  rep.exec_head_dim = vo && spec.factored ? D : std::max(D, fac.cp.front().rank);
}

/// Slice s of a stack: layer s's matrix (cross-layer schemes) or head s's E × D block of layer `l`.
Matrix stack_slice(const LlamaLayer& Ly, const TensorStackKind& k, bool heads, std::int64_t s, const ModelHParams& hp) {
  const std::int64_t E = hp.n_embd, D = hp.head_dim;
  switch (k.matrix) {
    case 0: return heads ? weight_rows(Ly.wqkv, Ly.wqkv_q, k.r0 + s * D, D, E).transpose()
                         : weight_rows(Ly.wqkv, Ly.wqkv_q, k.r0, k.rows, k.cols);
    case 1: return heads ? Matrix(weight_rows(Ly.wo, Ly.wo_q, 0, E, hp.n_head * D).middleCols(s * D, D))
                         : weight_rows(Ly.wo, Ly.wo_q, k.r0, k.rows, k.cols);
    case 2: return weight_rows(Ly.w_gate_up, Ly.w_gate_up_q, k.r0, k.rows, k.cols);
    default: return weight_rows(Ly.w_down, Ly.w_down_q, k.r0, k.rows, k.cols);
  }
}

void compress_tucker(const LlamaModel& model, const transform::TensorSpec& spec, const ExecContext& ctx,
                     TensorModelReport& rep, TensorFactors& fac) {
  const ModelHParams& hp = model.hparams();
  const std::int64_t L = hp.n_layer;
  const bool heads = spec.scheme == transform::TensorScheme::kTuckerHeads;
  const std::vector<TensorStackKind> kinds = tensor_stack_kinds(spec.scheme, hp);
  const auto nk = static_cast<std::int64_t>(kinds.size());
  // Work items: one stack per weight kind (across layers) or per layer and kind (heads).
  const std::int64_t items = heads ? L * nk : nk;
  std::uint64_t bytes = 0;
  for (const TensorStackKind& k : kinds) bytes += static_cast<std::uint64_t>(k.slices * k.rows * k.cols) * 8 * 3;
  check_memory(heads ? bytes * 2 : bytes, fmt::format("the float64 stacks of {}", transform::to_string(spec.scheme)));
  const auto& layers = model.weights().layers;
  std::vector<transform::StackCompression> res(static_cast<std::size_t>(items));
  std::vector<std::pair<std::int64_t, std::int64_t>> ranks(static_cast<std::size_t>(items));
  parallel_for(ctx, items, [&](std::int64_t i) {
    const TensorStackKind& k = kinds[static_cast<std::size_t>(i % nk)];
    std::vector<Matrix> mats;
    for (std::int64_t s = 0; s < k.slices; ++s)
      mats.push_back(stack_slice(layers[static_cast<std::size_t>(heads ? i / nk : s)], k, heads, s, hp));
    transform::StackOptions so;
    so.rank_rows = std::min(spec.rank, k.rows);
    so.rank_cols = std::min(spec.rank2, k.cols);
    so.stack_rank = spec.layers >= k.slices ? 0 : spec.layers;
    so.max_iterations = spec.iterations();
    ranks[static_cast<std::size_t>(i)] = {so.rank_rows, so.rank_cols};
    res[static_cast<std::size_t>(i)] = transform::compress_stack(mats, so);
  });
  for (std::int64_t i = 0; i < items; ++i) {
    const transform::StackCompression& r = res[static_cast<std::size_t>(i)];
    const TensorStackKind& k = kinds[static_cast<std::size_t>(i % nk)];
    TensorFactors::Stack st;
    st.name = k.name;
    st.rows = k.rows;
    st.cols = k.cols;
    st.rank_rows = ranks[static_cast<std::size_t>(i)].first;
    st.rank_cols = ranks[static_cast<std::size_t>(i)].second;
    st.bank = static_cast<std::int64_t>(r.cores.size());
    st.left = to_f32(r.left);
    st.right = to_f32(r.right);
    for (const Matrix& c : r.cores) {
      const std::vector<float> v = to_f32(c);
      st.cores.insert(st.cores.end(), v.begin(), v.end());
    }
    if (r.coef.size() > 0) st.coef = to_f32(r.coef);
    fac.stacks.push_back(std::move(st));
    rep.parts.push_back(part_report(heads ? fmt::format("layer {} {}", i / nk, k.name) : std::string(k.name), r.fit,
                                    r.iterations, r.info, r.message, ranks[static_cast<std::size_t>(i)].first,
                                    ranks[static_cast<std::size_t>(i)].second, r.params_before, r.params_after));
  }
  rep.exec_head_dim = hp.head_dim;
}

}  // namespace

void check_tensor_spec(const transform::TensorSpec& spec, const ModelHParams& hp, bool mla) {
  const std::int64_t E = hp.n_embd, D = hp.head_dim, Hq = hp.n_head, Hkv = hp.n_head_kv, F = hp.n_ff;
  const char* name = transform::to_string(spec.scheme);
  if (mla) {
    // The NoPE width of the MLA layers is known once they exist: the rank is checked then.
    NUMATTN_CHECK_OPTION(spec.scheme == transform::TensorScheme::kQkCp, "tensor",
                         "{} needs a plain GQA Llama model; on an MLA model only qk-cp (on the NoPE part "
                         "W_q_nope[h]ᵀ·W_uk[h]) applies", name);
    return;
  }
  if (spec.scheme == transform::TensorScheme::kQkCp)
    NUMATTN_CHECK_OPTION(hp.n_rot == 0, "tensor",
                         "qk-cp (collaborative QK heads) needs position-free Q/K dimensions: this model "
                         "applies RoPE to {} of its {} Q/K dimensions per head (rope.dimension_count), and "
                         "q·R(p_j − p_i)·k is not a bilinear form with a shared position-free matrix; "
                         "use vo-cp (the VO side carries no RoPE)",
                         hp.n_rot, hp.head_dim);
  if (spec.is_cp()) {
    NUMATTN_CHECK_OPTION(spec.rank <= Hq * D, "tensor",
                         "{} rank {} exceeds the exact block form's H·D = {}·{} = {} (use rank=0 for it)",
                         name, spec.rank, Hq, D, Hq * D);
    return;
  }
  const std::int64_t maxdim = spec.scheme == transform::TensorScheme::kTuckerQkvo    ? std::max({Hq * D, Hkv * D, E})
                              : spec.scheme == transform::TensorScheme::kTuckerHeads ? std::max(E, D)
                                                                                     : std::max(F, E);
  NUMATTN_CHECK_OPTION(spec.rank <= maxdim && spec.rank2 <= maxdim, "tensor",
                       "{} ranks {}x{} exceed the largest matrix dimension {} of the scheme", name,
                       spec.rank, spec.rank2, maxdim);
  if (spec.scheme != transform::TensorScheme::kTuckerHeads)  // heads=: clamped per kind to its head count
    NUMATTN_CHECK_OPTION(spec.layers <= hp.n_layer, "tensor", "layers={} exceeds the model's {} layers",
                         spec.layers, hp.n_layer);
}

namespace {

/// qk-cp on the NoPE part of every MLA layer (transform::collaborative_qk_mla).
LlamaModel compress_qk_mla(const LlamaModel& model, const transform::TensorSpec& spec, const ExecContext& ctx,
                           TensorModelReport* report) {
  const ModelHParams& hp = model.hparams();
  const std::int64_t E = hp.n_embd, L = hp.n_layer;
  LlamaWeights w = model.weights();
  for (std::int64_t l = 0; l < L; ++l) {
    const LlamaLayer& Ly = w.layers[static_cast<std::size_t>(l)];
    NUMATTN_CHECK_OPTION(Ly.mla && !Ly.mla->uk_bd && Ly.mla->uv_bd.empty(), "tensor",
                         "qk-cp on an MLA model needs every layer MLA without BD Attention (layer {} is {})", l,
                         Ly.mla ? "BDA on MLA" : "not MLA");
    NUMATTN_CHECK_OPTION(spec.rank <= hp.n_head * Ly.mla->d_nope, "tensor",
                         "qk-cp rank {} exceeds the MLA NoPE block form's Hq·d_nope = {}·{} = {} (use rank=0 for it)",
                         spec.rank, hp.n_head, Ly.mla->d_nope, hp.n_head * Ly.mla->d_nope);
  }
  transform::CollabOptions co;
  co.rank = spec.rank;
  co.max_iterations = spec.iterations();
  co.seed = spec.seed;
  std::vector<transform::CollabHeads> heads(static_cast<std::size_t>(L));
  std::vector<std::shared_ptr<const MlaLayer>> layers(static_cast<std::size_t>(L));
  parallel_for(ctx, L, [&](std::int64_t l) {
    const auto i = static_cast<std::size_t>(l);
    try {
      const MlaLayerWeights cw = transform::collaborative_qk_mla(w.layers[i].mla->to_weights(E), E, co, &heads[i]);
      layers[i] = std::make_shared<const MlaLayer>(MlaLayer::from_weights(cw, E));
    } catch (const OptionError&) {
      throw;
    } catch (const Error& e) {
      throw Error(fmt::format("qk-cp on MLA layer {}: {}", l, e.what()));
    }
  });
  TensorModelReport rep;
  rep.spec = spec;
  for (std::int64_t l = 0; l < L; ++l) {
    const auto i = static_cast<std::size_t>(l);
    w.layers[i].mla = layers[i];
    const transform::CollabHeads& c = heads[i];
    rep.parts.push_back(part_report(fmt::format("layer {}", l), c.fit, c.iterations, c.info, c.message, c.rank(),
                                    c.rank(), c.params_before, c.params_after));
  }
  finish_report(rep);
  rep.exec_head_dim = layers.front()->d_nope;  // the NoPE width the layers run with
  if (report) *report = std::move(rep);
  return LlamaModel(hp, std::move(w));
}

}  // namespace

std::vector<TensorStackKind> tensor_stack_kinds(transform::TensorScheme scheme, const ModelHParams& hp) {
  const std::int64_t E = hp.n_embd, D = hp.head_dim, Hq = hp.n_head, Hkv = hp.n_head_kv, F = hp.n_ff, L = hp.n_layer;
  switch (scheme) {
    case transform::TensorScheme::kTuckerQkvo:
      return {{"attn_q", 0, 0, Hq * D, E, L},
              {"attn_k", 0, Hq * D, Hkv * D, E, L},
              {"attn_v", 0, (Hq + Hkv) * D, Hkv * D, E, L},
              {"attn_output", 1, 0, E, Hq * D, L}};
    case transform::TensorScheme::kTuckerFfn:
      return {{"ffn_gate", 2, 0, F, E, L}, {"ffn_up", 2, F, F, E, L}, {"ffn_down", 3, 0, E, F, L}};
    case transform::TensorScheme::kTuckerHeads:
      return {{"attn_q", 0, 0, E, D, Hq},
              {"attn_k", 0, Hq * D, E, D, Hkv},
              {"attn_v", 0, (Hq + Hkv) * D, E, D, Hkv},
              {"attn_output", 1, 0, E, D, Hq}};
    default: break;
  }
  throw Error(fmt::format("tensor_stack_kinds: {} is not a Tucker scheme", transform::to_string(scheme)));
}

LlamaModel build_tensor_model(const ModelHParams& hp, LlamaWeights base, const TensorFactors& f,
                              const TensorSourceRows& source) {
  return f.spec.is_cp() ? build_cp(hp, std::move(base), f, source) : build_tucker(hp, std::move(base), f);
}

LlamaModel compress_model_tensor(const LlamaModel& model, const transform::TensorSpec& spec,
                                 const ExecContext& ctx, TensorModelReport* report, TensorFactors* factors) {
  const auto t0 = std::chrono::steady_clock::now();
  const ModelHParams& hp = model.hparams();
  if (model.has_mla()) {
    check_tensor_spec(spec, hp, true);
    NUMATTN_CHECK_OPTION(!factors, "tensor", "qk-cp on an MLA model is not storable as a numattn-tensor file");
    LlamaModel out = compress_qk_mla(model, spec, ctx, report);
    out.set_attention(model.attention_spec());
    if (report) report->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
  }
  for (const LlamaLayer& Ly : model.weights().layers)
    NUMATTN_CHECK_OPTION(!Ly.v_bd && Ly.vo_rank == 0, "tensor", "{} needs a plain GQA Llama model; this one has {} layers",
                         transform::to_string(spec.scheme), Ly.v_bd ? "BDA" : "factored collaborative VO");
  check_tensor_spec(spec, hp);
  TensorModelReport rep;
  rep.spec = spec;
  TensorFactors fac;
  fac.spec = spec;
  if (spec.is_cp()) {
    compress_cp(model, spec, ctx, rep, fac);
  } else {
    compress_tucker(model, spec, ctx, rep, fac);
  }
  LlamaModel out = build_tensor_model(hp, model.weights(), fac, model_source(model));
  finish_report(rep);
  out.set_attention(model.attention_spec());
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (report) *report = std::move(rep);
  if (factors) *factors = std::move(fac);
  return out;
}

}  // namespace numattn
