/// @file bd_projection_builder.h
/// Builds a BD projection (transform/bd_projection.h) from a projection's weights, in float64
/// with Eigen. Offline work (a weight transform), kept out of the runtime header so that the
/// model headers, which only run projections, do not pull Eigen into every translation unit.
#pragma once

#include <span>
#include <vector>

#include "numattn/decomp/basis_decomposition.h"
#include "numattn/transform/bd_projection.h"

namespace numattn::transform {

/// What the BD of one projection found, per head.
struct BdHeadReport {
  double kappa = 1;    ///< cond(W_h[S,:])
  bool dense = false;  ///< kept dense (κ above threshold): output is Y_h, not Y'_h
};

/// BD of a projection given in float64 (d_in × heads·head_dim row-major `w`): one shared
/// basis S (|S| = head_dim) chosen by `strategy` over the heads' W_h (row form; maxmin for
/// several heads, pivoted for one, see decomp/basis_decomposition.h), coefficients in float64,
/// stored in float32. Heads with κ > `kappa_threshold` stay dense (pass +inf to never fall
/// back, 0 to keep every head dense; negative or NaN is refused). `bias` (optional) is the
/// projection's bias b; the stored bias is b_h·T_h.
/// `report`, if given, gets S, κ and dense flags per head, and `basis_blocks` gets W_h[S,:]
/// (= T_h^{-1}, what the partner side Q or O multiplies by).
/// Throws numattn::Error if head_dim > d_in, the shapes disagree or `w` is not finite.
BdProjection build_bd_projection(index_t d_in, index_t heads, index_t head_dim,
                                 const decomp::MatrixXd& w, std::span<const double> bias,
                                 decomp::BasisStrategy strategy, double kappa_threshold,
                                 std::vector<BdHeadReport>* report = nullptr,
                                 std::vector<decomp::MatrixXd>* basis_blocks = nullptr);

}  // namespace numattn::transform
