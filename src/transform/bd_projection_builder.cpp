// The float64 builder of a BD projection (transform/bd_projection_builder.h).
#include "numattn/transform/bd_projection_builder.h"

#include <utility>

#include "numattn/core/error.h"
#include "numattn/decomp/dense.h"

namespace numattn::transform {

using decomp::MatrixXd;

BdProjection build_bd_projection(index_t d_in, index_t heads, index_t head_dim, const MatrixXd& w,
                                 std::span<const double> bias, decomp::BasisStrategy strategy,
                                 double kappa_threshold, std::vector<BdHeadReport>* report,
                                 std::vector<MatrixXd>* basis_blocks) {
  NUMATTN_CHECK(d_in >= 1 && heads >= 1 && head_dim >= 1,
                "projection needs d_in, heads, head_dim >= 1 (got {}, {}, {})", d_in, heads,
                head_dim);
  NUMATTN_CHECK(head_dim <= d_in,
                "BD needs head_dim <= input dim (head_dim {} > d_in {}): the basis is head_dim "
                "input channels", head_dim, d_in);
  const index_t out = heads * head_dim;
  NUMATTN_CHECK(w.rows() == d_in && w.cols() == out, "projection weight is {}x{}, expected {}x{}",
                w.rows(), w.cols(), d_in, out);
  NUMATTN_CHECK(bias.empty() || static_cast<index_t>(bias.size()) == out,
                "projection bias has {} values, expected {}", bias.size(), out);
  NUMATTN_CHECK(w.allFinite(), "projection weight has NaN or Inf entries");
  // NaN would compare false with every κ (every head silently dense).
  NUMATTN_CHECK(kappa_threshold >= 0,
                "kappa_threshold {} must be >= 0 (below 1 every head stays dense, as κ >= 1; +inf "
                "keeps none dense)", kappa_threshold);

  std::vector<MatrixXd> hw;
  hw.reserve(static_cast<std::size_t>(heads));
  for (index_t h = 0; h < heads; ++h) hw.emplace_back(w.middleCols(h * head_dim, head_dim));
  decomp::BasisDecomposition bd;
  bd.set_rank(head_dim).set_form(decomp::BdForm::kRows).set_strategy(strategy).compute(hw);
  NUMATTN_CHECK(bd.info() != decomp::ComputationInfo::kInvalidInput, "BD of the projection: {}",
                bd.message());
  // kNumericalIssue (a singular head block) is not an error here: that head falls back.

  const index_t r = head_dim;
  BdProjection::Parts p;
  p.d_in = d_in;
  p.heads = heads;
  p.head_dim = head_dim;
  p.rank = r;
  const auto& s = bd.basis();
  const auto& sc = bd.complement();
  p.perm.assign(s.begin(), s.end());
  p.perm.insert(p.perm.end(), sc.begin(), sc.end());
  std::vector<char> dense(static_cast<std::size_t>(heads), 0);
  for (index_t h = 0; h < heads; ++h) {
    const double k = bd.cond_basis(h);
    const bool bad = !(k <= kappa_threshold) || !bd.coefficients(h).allFinite();
    dense[static_cast<std::size_t>(h)] = bad ? 1 : 0;
    if (bad) p.dense_heads.push_back(h);
    if (report) report->push_back({k, bad});
    if (basis_blocks) basis_blocks->push_back(bd.basis_block(h));
  }
  const index_t nd = static_cast<index_t>(p.dense_heads.size());
  p.rest.assign(static_cast<std::size_t>((d_in - r) * out), 0.f);
  p.top.assign(static_cast<std::size_t>(r * nd * head_dim), 0.f);
  for (index_t h = 0; h < heads; ++h) {
    const index_t c0 = h * head_dim;
    if (!dense[static_cast<std::size_t>(h)]) {
      const MatrixXd& c = bd.coefficients(h);  // (d−r) × r, rows in S^c order
      for (index_t i = 0; i < d_in - r; ++i)
        for (index_t j = 0; j < head_dim; ++j)
          p.rest[static_cast<std::size_t>(i * out + c0 + j)] = static_cast<float>(c(i, j));
    } else {
      for (index_t i = 0; i < d_in - r; ++i)
        for (index_t j = 0; j < head_dim; ++j)
          p.rest[static_cast<std::size_t>(i * out + c0 + j)] =
              static_cast<float>(w(sc[static_cast<std::size_t>(i)], c0 + j));
    }
  }
  for (index_t k = 0; k < nd; ++k) {
    const index_t h = p.dense_heads[static_cast<std::size_t>(k)];
    for (index_t i = 0; i < r; ++i)
      for (index_t j = 0; j < head_dim; ++j)
        p.top[static_cast<std::size_t>(i * nd * head_dim + k * head_dim + j)] =
            static_cast<float>(w(s[static_cast<std::size_t>(i)], h * head_dim + j));
  }
  if (!bias.empty()) {
    p.bias.resize(static_cast<std::size_t>(out));
    for (index_t h = 0; h < heads; ++h) {
      Eigen::RowVectorXd bh(head_dim);
      for (index_t j = 0; j < head_dim; ++j) bh(j) = bias[static_cast<std::size_t>(h * head_dim + j)];
      if (!dense[static_cast<std::size_t>(h)]) {
        // b'_h = b_h·T_h = b_h·B_h^{-1}, i.e. B_hᵀ·b'_hᵀ = b_hᵀ.
        bh = decomp::dense::lu_solve(bd.basis_block(h).transpose(), bh.transpose()).x.transpose();
      }
      for (index_t j = 0; j < head_dim; ++j)
        p.bias[static_cast<std::size_t>(h * head_dim + j)] = static_cast<float>(bh(j));
    }
  }
  // The stored form goes through the one constructor that checks every size and index.
  return BdProjection::from_parts(std::move(p));
}

}  // namespace numattn::transform
