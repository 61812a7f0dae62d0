#include "numattn/transform/mla.h"

#include <Eigen/Core>

#include <cmath>
#include <string>

#include "numattn/core/error.h"
#include "numattn/decomp/dense.h"

namespace numattn::transform {

namespace {

using decomp::dense::Matrix;
using RowMap = Eigen::Map<const Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;

constexpr double kRoRopeDamping = 0.01;  // TransMLA's joint_complex_pca: 1% of the mean diagonal

bool all_finite(const std::vector<double>& v) {
  for (double x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

void check_weight(const std::vector<double>& w, std::int64_t rows, std::int64_t cols, const char* name) {
  NUMATTN_CHECK(static_cast<std::int64_t>(w.size()) == rows * cols,
                "MLA conversion: {} has {} values, expected [{}, {}] = {}", name, w.size(), rows,
                cols, rows * cols);
  NUMATTN_CHECK(all_finite(w), "MLA conversion: {} has a non-finite entry", name);
}

// One covariance of the calibration: [E, E] finite values, or none (`or_none` says what then).
void check_covariance(const std::vector<double>& c, std::int64_t e, const char* what, const char* or_none) {
  NUMATTN_CHECK(c.empty() || static_cast<std::int64_t>(c.size()) == e * e,
                "MLA conversion: {} has {} values, expected [E, E] = [{}, {}] = {} (or none{})", what, c.size(), e, e,
                e * e, or_none);
  NUMATTN_CHECK(all_finite(c), "MLA conversion: {} has a non-finite entry", what);
}

void check_calibration(const ModelHParams& hp, const MlaCalibration& calib) {
  check_covariance(calib.xn_cov, hp.n_embd, "the calibration covariance xn_cov", " for the identity");
  check_covariance(calib.latent_xn_cov, hp.n_embd, "the latent's calibration covariance latent_xn_cov", ": xn_cov");
}

void check_freqfold(const ModelHParams& hp, int freqfold) {
  const std::int64_t pairs = hp.n_rot / 2;
  NUMATTN_CHECK_OPTION(freqfold >= 1, "freqfold", "must be >= 1 (1 = no folding), got {}", freqfold);
  NUMATTN_CHECK_OPTION(pairs % freqfold == 0, "freqfold",
                       "{} does not divide the {} RoPE frequencies (n_rot/2) of the model", freqfold,
                       pairs);
}

/// A·C·Aᵀ for the rows A of a weight (C empty = identity): the covariance of A·xn.
Matrix covariance(const Matrix& a, const MlaCalibration& calib) {
  if (calib.xn_cov.empty()) return a * a.transpose();
  const std::int64_t e = a.cols();
  const RowMap c(calib.xn_cov.data(), e, e);
  const Matrix ca = c * a.transpose();  // [E, rows]
  Matrix s = a * ca;
  return 0.5 * (s + s.transpose());  // only the symmetric part of C is meaningful
}

std::vector<double> to_row_major(const Matrix& m) {
  std::vector<double> out(static_cast<std::size_t>(m.rows() * m.cols()));
  for (Eigen::Index i = 0; i < m.rows(); ++i)
    for (Eigen::Index j = 0; j < m.cols(); ++j) out[static_cast<std::size_t>(i * m.cols() + j)] = m(i, j);
  return out;
}

/// Eigen-decomposition with columns in descending order of eigenvalue.
decomp::dense::SymEig eig_descending(const Matrix& s, const char* what) {
  decomp::dense::SymEig e = decomp::dense::sym_eig(s);
  NUMATTN_CHECK(e.info == decomp::dense::Info::kSuccess,
                "MLA conversion: the eigendecomposition of the {} failed ({})", what,
                decomp::dense::to_string(e.info));
  e.values.reverseInPlace();
  e.vectors.rowwise().reverseInPlace();
  return e;
}

/// θ_i = rope_base^(−2i/n_rot), the frequency of RoPE pair i of every head.
double rope_freq(const ModelHParams& hp, std::int64_t i) {
  return std::pow(hp.rope_base, -2.0 * static_cast<double>(i) / static_cast<double>(hp.n_rot));
}

void check_rope_dims(const ModelHParams& hp, std::int64_t rope_dims) {
  const std::int64_t most = hp.n_head_kv * hp.n_rot;
  NUMATTN_CHECK_OPTION(rope_dims % 2 == 0 && rope_dims >= 2 && rope_dims <= most, "rope_dims",
                       "must be an even number in 2..{} (KV heads × n_rot = {} × {}: RoPE rotates pairs), got {}",
                       most, hp.n_head_kv, hp.n_rot, rope_dims);
}

/// The basis with U_f = I (the plain merge: nothing is dropped, so no rotation is needed).
RoRopeBasis identity_basis(const ModelHParams& hp, int m) {
  RoRopeBasis b;
  b.freqfold = m;
  b.n = hp.n_head_kv * m;
  const auto groups = static_cast<std::size_t>(hp.n_rot / 2 / m);
  const Matrix id = Matrix::Identity(b.n, b.n);
  b.u.assign(groups, to_row_major(id));
  b.eigenvalues.assign(groups, std::vector<double>(static_cast<std::size_t>(b.n), 0.0));
  return b;
}

/// Row of Wk / Wq for KV head (or query head) `head`, index j = g·M + m of group f, component c
/// (0 = x, 1 = y).
std::int64_t pair_row(std::int64_t head, std::int64_t d, std::int64_t f, int m_fold, std::int64_t m, int c) {
  return head * d + 2 * (f * m_fold + m) + c;
}

/// Steps 1–4 given a basis (the options already checked). `calib` only feeds the PCA and stats.
MlaLayerWeights build(const ModelHParams& hp, const std::vector<double>& wq_v,
                      const std::vector<double>& wk_v, const std::vector<double>& wv_v,
                      const MlaCalibration& calib, const RoRopeBasis& basis, std::int64_t rope_dims,
                      std::int64_t rank, double opt_balance, MlaConversionStats* stats) {
  const std::int64_t e = hp.n_embd, hq = hp.n_head, hkv = hp.n_head_kv, d = hp.head_dim;
  const std::int64_t group = hq / hkv, pairs = hp.n_rot / 2;
  const int mf = basis.freqfold;
  const std::int64_t groups = pairs / mf, n = hkv * mf;
  NUMATTN_CHECK(basis.n == n && static_cast<std::int64_t>(basis.u.size()) == groups,
                "MLA conversion: the RoRoPE basis (n = {}, {} groups) does not fit the layer "
                "(Hkv·M = {}, {} groups)",
                basis.n, basis.u.size(), n, groups);
  const RowMap wq(wq_v.data(), hq * d, e), wk(wk_v.data(), hkv * d, e), wv(wv_v.data(), hkv * d, e);

  const std::vector<std::int64_t> keep = rope_components(hp, mf, rope_dims);
  const std::int64_t d_rope = rope_dims, d_nope = hkv * d - d_rope;
  Matrix k_rope(d_rope, e), k_nope(d_nope, e);
  std::vector<Matrix> q_rope(static_cast<std::size_t>(hq), Matrix::Zero(d_rope, e));
  std::vector<Matrix> q_nope(static_cast<std::size_t>(hq), Matrix::Zero(d_nope, e));
  MlaLayerWeights out;
  out.rope_theta = mla_rope_theta(hp, mf, rope_dims);

  std::int64_t nope_row = 0, rope_pair = 0;
  for (std::int64_t f = 0; f < groups; ++f) {
    const RowMap u(basis.u[static_cast<std::size_t>(f)].data(), n, n);
    for (std::int64_t k = 0; k < n; ++k) {
      const bool rope = k < keep[static_cast<std::size_t>(f)];
      const std::int64_t row = rope ? 2 * rope_pair++ : nope_row;
      Matrix& kdst = rope ? k_rope : k_nope;
      for (int c = 0; c < 2; ++c) {
        kdst.row(row + c).setZero();
        for (std::int64_t g = 0; g < hkv; ++g)
          for (std::int64_t m = 0; m < mf; ++m)
            kdst.row(row + c) += u(g * mf + m, k) * wk.row(pair_row(g, d, f, mf, m, c));
        // Query head h only has its group's entries in the merged key space (the selector E_g).
        for (std::int64_t h = 0; h < hq; ++h) {
          Matrix& qdst = rope ? q_rope[static_cast<std::size_t>(h)] : q_nope[static_cast<std::size_t>(h)];
          const std::int64_t g = h / group;
          for (std::int64_t m = 0; m < mf; ++m)
            qdst.row(row + c) += u(g * mf + m, k) * wq.row(pair_row(h, d, f, mf, m, c));
        }
      }
      if (!rope) nope_row += 2;
    }
  }
  // Dims past n_rot never rotate: NoPE as they are.
  for (std::int64_t g = 0; g < hkv; ++g)
    for (std::int64_t c = hp.n_rot; c < d; ++c, ++nope_row) {
      k_nope.row(nope_row) = wk.row(g * d + c);
      for (std::int64_t h = g * group; h < (g + 1) * group; ++h)
        q_nope[static_cast<std::size_t>(h)].row(nope_row) = wq.row(h * d + c);
    }
  NUMATTN_ASSERT(nope_row == d_nope);

  // Step 4: the latent [k_nope; v] of width F, compressed by a balanced PCA when rank < F.
  const std::int64_t vdim = hkv * d, full = d_nope + vdim;
  Matrix wz(full, e);
  wz.topRows(d_nope) = k_nope;
  wz.bottomRows(vdim) = wv;
  Matrix down, up;  // latent = down·xn; [k_nope; v] ≈ up·latent
  double alpha = 1, kept_energy = 1;
  if (rank == 0 || rank > full) {
    down = wz;
    up = Matrix::Identity(full, full);
  } else {
    MlaCalibration latent_calib;
    latent_calib.xn_cov = calib.latent_xn_cov.empty() ? calib.xn_cov : calib.latent_xn_cov;
    const MlaCalibration& lc = latent_calib;
    const double ek = d_nope > 0 ? covariance(k_nope, lc).trace() : 0.0;
    const double ev = covariance(Matrix(wv), lc).trace();
    // α = b · (RMS entry of k_nope) / (RMS entry of v) divides the keys (TransMLA's balance).
    if (ek > 0 && ev > 0)
      alpha = opt_balance * std::sqrt((ek / static_cast<double>(d_nope)) / (ev / static_cast<double>(vdim)));
    Matrix wbal = wz;
    wbal.topRows(d_nope) /= alpha;
    const decomp::dense::SymEig eig = eig_descending(covariance(wbal, lc), "latent covariance");
    const Matrix pr = eig.vectors.leftCols(rank);
    down = pr.transpose() * wbal;
    up = pr;
    up.topRows(d_nope) *= alpha;
    const double total = eig.values.sum();
    kept_energy = total > 0 ? eig.values.head(rank).sum() / total : 1.0;
  }
  const std::int64_t r = down.rows();

  out.n_head = hq;
  out.rank = r;
  out.d_nope = d_nope;
  out.d_rope = d_rope;
  out.d_v = d;
  out.softmax_scale = 1.0 / std::sqrt(static_cast<double>(d));
  out.w_dkv = to_row_major(down);
  out.w_kr = to_row_major(k_rope);
  Matrix qn(hq * d_nope, e), qr(hq * d_rope, e), uk(hq * d_nope, r), uv(hq * d, r);
  for (std::int64_t h = 0; h < hq; ++h) {
    qn.middleRows(h * d_nope, d_nope) = q_nope[static_cast<std::size_t>(h)];
    qr.middleRows(h * d_rope, d_rope) = q_rope[static_cast<std::size_t>(h)];
    uk.middleRows(h * d_nope, d_nope) = up.topRows(d_nope);
    uv.middleRows(h * d, d) = up.middleRows(d_nope + (h / group) * d, d);
  }
  out.w_q_nope = to_row_major(qn);
  out.w_q_rope = to_row_major(qr);
  out.w_uk = to_row_major(uk);
  out.w_uv = to_row_major(uv);

  if (stats) {
    stats->alpha = alpha;
    stats->latent_energy_kept = kept_energy;
    stats->full_width = full;
    stats->rope_energy_kept = 1;
    if (d_rope < hkv * hp.n_rot) {
      const double kept = covariance(k_rope, calib).trace();
      const double removed = covariance(k_nope.topRows(d_nope - hkv * (d - hp.n_rot)), calib).trace();
      stats->rope_energy_kept = kept + removed > 0 ? kept / (kept + removed) : 1.0;
    }
  }
  return out;
}

void check_layer(const ModelHParams& hp, const std::vector<double>& wq, const std::vector<double>& wk,
                 const std::vector<double>& wv) {
  hp.validate("MLA conversion");
  check_weight(wq, hp.n_head * hp.head_dim, hp.n_embd, "wq");
  check_weight(wk, hp.n_head_kv * hp.head_dim, hp.n_embd, "wk");
  check_weight(wv, hp.n_head_kv * hp.head_dim, hp.n_embd, "wv");
}

RoRopeBasis basis_unchecked(const ModelHParams& hp, const std::vector<double>& wk_v,
                            const MlaCalibration& calib, int mf) {
  const std::int64_t e = hp.n_embd, hkv = hp.n_head_kv, d = hp.head_dim;
  const std::int64_t groups = hp.n_rot / 2 / mf, n = hkv * mf;
  const RowMap wk(wk_v.data(), hkv * d, e);
  RoRopeBasis b;
  b.freqfold = mf;
  b.n = n;
  for (std::int64_t f = 0; f < groups; ++f) {
    // The x and y halves of the group's pairs: same U for both, so their covariances add
    // (TransMLA stacks them as extra samples).
    Matrix kx(n, e), ky(n, e);
    for (std::int64_t g = 0; g < hkv; ++g)
      for (std::int64_t m = 0; m < mf; ++m) {
        kx.row(g * mf + m) = wk.row(pair_row(g, d, f, mf, m, 0));
        ky.row(g * mf + m) = wk.row(pair_row(g, d, f, mf, m, 1));
      }
    Matrix s = covariance(kx, calib) + covariance(ky, calib);
    s.diagonal().array() += kRoRopeDamping * s.trace() / static_cast<double>(n);
    const decomp::dense::SymEig eig = eig_descending(s, "RoRoPE key covariance");
    b.u.push_back(to_row_major(eig.vectors));
    b.eigenvalues.emplace_back(eig.values.data(), eig.values.data() + n);
  }
  return b;
}

}  // namespace

std::int64_t mla_rope_dims(const ModelHParams& hp, const MlaOptions& opt) {
  if (opt.rope_dims != 0) {
    check_rope_dims(hp, opt.rope_dims);
    return opt.rope_dims;
  }
  NUMATTN_CHECK_OPTION(opt.rope_heads >= 1 && opt.rope_heads <= hp.n_head_kv, "rope_heads",
                       "must be in 1..{} (the model's KV heads), got {}", hp.n_head_kv, opt.rope_heads);
  return opt.rope_heads * hp.n_rot;
}

std::vector<std::int64_t> rope_components(const ModelHParams& hp, int freqfold, std::int64_t rope_dims) {
  check_freqfold(hp, freqfold);
  check_rope_dims(hp, rope_dims);
  const std::int64_t groups = hp.n_rot / 2 / freqfold, pairs = rope_dims / 2;
  std::vector<std::int64_t> keep(static_cast<std::size_t>(groups));
  // Spread evenly (the first groups, highest frequencies, take the remainder): with rope_dims a
  // multiple of n_rot/freqfold every group keeps the same count, as in TransMLA.
  for (std::int64_t f = 0; f < groups; ++f) keep[static_cast<std::size_t>(f)] = pairs / groups + (f < pairs % groups ? 1 : 0);
  return keep;
}

std::int64_t rope_member(std::int64_t component, std::int64_t kept, int freqfold) {
  NUMATTN_ASSERT(component >= 0 && component < kept && freqfold >= 1);
  const std::int64_t m = freqfold, full = kept / m * m;
  if (component < full) return component % m;
  const std::int64_t rest = kept - full, j = component - full;
  return j * m / rest;  // the last, partial round: members spaced evenly over the group
}

std::vector<double> mla_rope_theta(const ModelHParams& hp, int freqfold, std::int64_t rope_dims) {
  const std::vector<std::int64_t> keep = rope_components(hp, freqfold, rope_dims);
  std::vector<double> out;
  out.reserve(static_cast<std::size_t>(rope_dims / 2));
  for (std::size_t f = 0; f < keep.size(); ++f)
    for (std::int64_t k = 0; k < keep[f]; ++k)
      out.push_back(rope_freq(hp, static_cast<std::int64_t>(f) * freqfold + rope_member(k, keep[f], freqfold)));
  return out;
}

RoRopeBasis rorope_basis(const ModelHParams& hp, const std::vector<double>& wk,
                         const MlaCalibration& calib, int freqfold) {
  hp.validate("MLA conversion");
  check_weight(wk, hp.n_head_kv * hp.head_dim, hp.n_embd, "wk");
  check_calibration(hp, calib);
  check_freqfold(hp, freqfold);
  return basis_unchecked(hp, wk, calib, freqfold);
}

double rorope_captured_energy(const RoRopeBasis& basis, std::int64_t keep) {
  NUMATTN_CHECK(keep >= 0 && keep <= basis.n, "rorope_captured_energy: keep = {} outside 0..{}",
                keep, basis.n);
  double s = 0;
  for (const std::vector<double>& ev : basis.eigenvalues)
    for (std::int64_t k = 0; k < keep; ++k) s += ev[static_cast<std::size_t>(k)];
  return s;
}

MlaLayerWeights rorope_merge(const ModelHParams& hp, const std::vector<double>& wq,
                             const std::vector<double>& wk, const std::vector<double>& wv,
                             const RoRopeBasis& basis) {
  check_layer(hp, wq, wk, wv);
  check_freqfold(hp, basis.freqfold);
  return build(hp, wq, wk, wv, MlaCalibration{}, basis, hp.n_head_kv * hp.n_rot, 0, 1.0, nullptr);
}

MlaLayerWeights convert_layer_to_mla(const ModelHParams& hp, const std::vector<double>& wq,
                                     const std::vector<double>& wk, const std::vector<double>& wv,
                                     const MlaCalibration& calib, const MlaOptions& opt,
                                     MlaConversionStats* stats) {
  check_layer(hp, wq, wk, wv);
  check_calibration(hp, calib);
  NUMATTN_CHECK_OPTION(opt.rank >= 0, "mla_rank", "the latent rank must be >= 0 (0 = no truncation), got {}",
                       opt.rank);
  check_freqfold(hp, opt.freqfold);
  NUMATTN_CHECK_OPTION(std::isfinite(opt.balance) && opt.balance > 0, "balance",
                       "the key/value balance multiplier must be a positive number, got {}", opt.balance);
  const std::int64_t rope_dims = mla_rope_dims(hp, opt);
  NUMATTN_CHECK_OPTION(!opt.low_rank_query, "low_rank_query",
                       "a low-rank query is not implemented: the MLA layer has no query latent, so "
                       "it would save no cache and only add error");
  // With every component kept as RoPE no rotation is needed: the plain merge (U = I).
  const RoRopeBasis basis = rope_dims == hp.n_head_kv * hp.n_rot ? identity_basis(hp, opt.freqfold)
                                                                 : basis_unchecked(hp, wk, calib, opt.freqfold);
  return build(hp, wq, wk, wv, calib, basis, rope_dims, opt.rank, opt.balance, stats);
}

MlaLayerWeights convert_layer_to_mla(const ModelHParams& hp, const std::vector<double>& wq,
                                     const std::vector<double>& wk, const std::vector<double>& wv,
                                     const MlaCalibration& calib, const MlaOptions& opt) {
  return convert_layer_to_mla(hp, wq, wk, wv, calib, opt, nullptr);
}

}  // namespace numattn::transform
