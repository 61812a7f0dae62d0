#include "numattn/model/tensor_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include <Eigen/Core>

#include "numattn/core/error.h"
#include "numattn/core/memory.h"

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

std::vector<float> dense_copy(const std::vector<float>& f, const QuantMatrix& q) {
  return q.empty() ? f : q.dequantize();
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

/// Collaborative heads, VO side (`vo`) or QK side, embedded in a model of head dim max(D, R)
/// (model/tensor_model.h).
LlamaModel compress_cp(const LlamaModel& model, const transform::TensorSpec& spec, const ExecContext& ctx,
                       TensorModelReport& rep) {
  const bool vo = spec.scheme == transform::TensorScheme::kVoCp;
  const char* name = transform::to_string(spec.scheme);
  const LlamaHParams& hp = model.hparams();
  const std::int64_t E = hp.n_embd, D = hp.head_dim, Hq = hp.n_head, Hkv = hp.n_head_kv, L = hp.n_layer;
  const std::int64_t R = spec.rank == 0 ? Hq * D : spec.rank;
  const std::int64_t Dp = std::max(D, R);
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
  LlamaHParams hp2 = hp;
  hp2.head_dim = Dp;
  LlamaWeights w = model.weights();
  // Q is scaled so that the embedded model's default scale 1/sqrt(D') is the original 1/sqrt(D).
  const double qscale = std::sqrt(static_cast<double>(Dp) / static_cast<double>(D));
  for (std::int64_t l = 0; l < L; ++l) {
    LlamaLayer& Ly = w.layers[static_cast<std::size_t>(l)];
    const transform::CollabHeads& c = heads[static_cast<std::size_t>(l)];
    const Matrix qkv_old = weight_rows(Ly.wqkv, Ly.wqkv_q, 0, (Hq + 2 * Hkv) * D, E);
    std::vector<float> qkv(static_cast<std::size_t>((Hq + 2 * Hkv) * Dp * E), 0.f);
    std::vector<float> wo(static_cast<std::size_t>(E * Hq * Dp), 0.f);
    if (vo) {
      for (std::int64_t h = 0; h < Hq; ++h) {
        store_rows(qkv_old.middleRows(h * D, D) * qscale, qkv.data() + h * Dp * E, E);
        store_rows(c.left * c.mix.row(h).transpose().asDiagonal(), wo.data() + h * Dp, Hq * Dp);
      }
      for (std::int64_t g = 0; g < Hkv; ++g) {
        store_rows(qkv_old.middleRows((Hq + g) * D, D), qkv.data() + (Hq + g) * Dp * E, E);
        store_rows(c.right.transpose(), qkv.data() + (Hq + Hkv + g) * Dp * E, E);
      }
    } else {
      const Matrix wo_old = weight_rows(Ly.wo, Ly.wo_q, 0, E, Hq * D);
      for (std::int64_t h = 0; h < Hq; ++h) {
        store_rows(c.mix.row(h).transpose().asDiagonal() * c.left.transpose() * qscale, qkv.data() + h * Dp * E, E);
        store_rows(wo_old.middleCols(h * D, D), wo.data() + h * Dp, Hq * Dp);
      }
      for (std::int64_t g = 0; g < Hkv; ++g) {
        store_rows(c.right.transpose(), qkv.data() + (Hq + g) * Dp * E, E);
        store_rows(qkv_old.middleRows((Hq + Hkv + g) * D, D), qkv.data() + (Hq + Hkv + g) * Dp * E, E);
      }
    }
    Ly.wqkv = std::move(qkv);
    Ly.wqkv_q = {};
    Ly.wo = std::move(wo);
    Ly.wo_q = {};
    TensorPartReport p;
    p.name = fmt::format("layer {}", l);
    p.fit = c.fit;
    p.iterations = c.iterations;
    p.info = c.info;
    p.message = c.message;
    p.rank_rows = p.rank_cols = c.rank();
    p.params_before = c.params_before;
    p.params_after = c.params_after;
    rep.parts.push_back(p);
  }
  rep.exec_head_dim = Dp;
  return LlamaModel(hp2, std::move(w));
}

/// One weight kind: rows [r0, r0 + rows) of the matrix `pick(layer)` of every layer.
struct Kind {
  std::string name;
  int matrix;  ///< 0 wqkv, 1 wo, 2 w_gate_up, 3 w_down
  std::int64_t r0, rows, cols;
};

LlamaModel compress_tucker(const LlamaModel& model, const transform::TensorSpec& spec, const ExecContext& ctx,
                           TensorModelReport& rep) {
  const LlamaHParams& hp = model.hparams();
  const std::int64_t E = hp.n_embd, D = hp.head_dim, Hq = hp.n_head, Hkv = hp.n_head_kv, L = hp.n_layer,
                     F = hp.n_ff;
  std::vector<Kind> kinds;
  if (spec.scheme == transform::TensorScheme::kTuckerQkvo) {
    kinds = {{"attn_q", 0, 0, Hq * D, E},
             {"attn_k", 0, Hq * D, Hkv * D, E},
             {"attn_v", 0, (Hq + Hkv) * D, Hkv * D, E},
             {"attn_output", 1, 0, E, Hq * D}};
  } else {
    kinds = {{"ffn_gate", 2, 0, F, E}, {"ffn_up", 2, F, F, E}, {"ffn_down", 3, 0, E, F}};
  }
  std::uint64_t bytes = 0;
  for (const Kind& k : kinds) bytes += static_cast<std::uint64_t>(L * k.rows * k.cols) * 8 * 3;
  check_memory(bytes, fmt::format("the float64 stacks of {}", transform::to_string(spec.scheme)));
  const auto& layers = model.weights().layers;
  auto source = [&](const LlamaLayer& Ly, int m) -> std::pair<const std::vector<float>*, const QuantMatrix*> {
    switch (m) {
      case 0: return {&Ly.wqkv, &Ly.wqkv_q};
      case 1: return {&Ly.wo, &Ly.wo_q};
      case 2: return {&Ly.w_gate_up, &Ly.w_gate_up_q};
      default: return {&Ly.w_down, &Ly.w_down_q};
    }
  };
  std::vector<transform::StackCompression> res(kinds.size());
  std::vector<std::pair<std::int64_t, std::int64_t>> ranks(kinds.size());
  parallel_for(ctx, static_cast<std::int64_t>(kinds.size()), [&](std::int64_t i) {
    const Kind& k = kinds[static_cast<std::size_t>(i)];
    std::vector<Matrix> mats;
    for (const LlamaLayer& Ly : layers) {
      const auto [f, q] = source(Ly, k.matrix);
      mats.push_back(weight_rows(*f, *q, k.r0, k.rows, k.cols));
    }
    transform::StackOptions so;
    so.rank_rows = std::min(spec.rank, k.rows);
    so.rank_cols = std::min(spec.rank2, k.cols);
    so.stack_rank = spec.layers;
    so.max_iterations = spec.iterations();
    ranks[static_cast<std::size_t>(i)] = {so.rank_rows, so.rank_cols};
    res[static_cast<std::size_t>(i)] = transform::compress_stack(mats, so);
  });
  LlamaWeights w = model.weights();
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    const Kind& k = kinds[i];
    for (std::int64_t l = 0; l < L; ++l) {
      LlamaLayer& Ly = w.layers[static_cast<std::size_t>(l)];
      std::vector<float>* f = nullptr;
      QuantMatrix* q = nullptr;
      switch (k.matrix) {
        case 0: f = &Ly.wqkv, q = &Ly.wqkv_q; break;
        case 1: f = &Ly.wo, q = &Ly.wo_q; break;
        case 2: f = &Ly.w_gate_up, q = &Ly.w_gate_up_q; break;
        default: f = &Ly.w_down, q = &Ly.w_down_q; break;
      }
      if (!q->empty()) {
        *f = dense_copy(*f, *q);
        *q = {};
      }
      store_rows(res[i].approx[static_cast<std::size_t>(l)], f->data() + k.r0 * k.cols, k.cols);
    }
    TensorPartReport p;
    p.name = k.name;
    p.fit = res[i].fit;
    p.iterations = res[i].iterations;
    p.info = res[i].info;
    p.message = res[i].message;
    p.rank_rows = ranks[i].first;
    p.rank_cols = ranks[i].second;
    p.params_before = res[i].params_before;
    p.params_after = res[i].params_after;
    rep.parts.push_back(p);
  }
  rep.exec_head_dim = D;
  return LlamaModel(hp, std::move(w));
}

}  // namespace

void check_tensor_spec(const transform::TensorSpec& spec, const LlamaHParams& hp) {
  const std::int64_t E = hp.n_embd, D = hp.head_dim, Hq = hp.n_head, Hkv = hp.n_head_kv, F = hp.n_ff;
  const char* name = transform::to_string(spec.scheme);
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
  const std::int64_t maxdim = spec.scheme == transform::TensorScheme::kTuckerQkvo
                                  ? std::max({Hq * D, Hkv * D, E})
                                  : std::max(F, E);
  NUMATTN_CHECK_OPTION(spec.rank <= maxdim && spec.rank2 <= maxdim, "tensor",
                       "{} ranks {}x{} exceed the largest matrix dimension {} of the scheme", name,
                       spec.rank, spec.rank2, maxdim);
  NUMATTN_CHECK_OPTION(spec.layers <= hp.n_layer, "tensor", "layers={} exceeds the model's {} layers",
                       spec.layers, hp.n_layer);
}

LlamaModel compress_model_tensor(const LlamaModel& model, const transform::TensorSpec& spec,
                                 const ExecContext& ctx, TensorModelReport* report) {
  const auto t0 = std::chrono::steady_clock::now();
  const LlamaHParams& hp = model.hparams();
  for (const LlamaLayer& Ly : model.weights().layers)
    NUMATTN_CHECK_OPTION(!Ly.mla && !Ly.v_bd, "tensor",
                         "{} needs a plain GQA Llama model; this one has {} layers{}",
                         transform::to_string(spec.scheme), Ly.mla ? "MLA" : "BDA",
                         spec.scheme == transform::TensorScheme::kQkCp && Ly.mla
                             ? " (collaborative QK on the MLA NoPE part W_q_nope[h]·W_uk[h] is not implemented)"
                             : "");
  check_tensor_spec(spec, hp);
  TensorModelReport rep;
  rep.spec = spec;
  LlamaModel out = spec.is_cp() ? compress_cp(model, spec, ctx, rep)
                                                                 : compress_tucker(model, spec, ctx, rep);
  finish_report(rep);
  out.set_attention(model.attention_spec());
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (report) *report = std::move(rep);
  return out;
}

}  // namespace numattn
