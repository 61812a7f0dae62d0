/// @file random_features.h
/// Random projection directions for random-feature kernel estimators (Performer): i.i.d.
/// Gaussian rows, or orthogonal random features (ORF).
///
/// ORF (Yu et al., NeurIPS 2016; Choromanski et al., ICLR 2021): the M × d matrix is built from
/// ⌊M/d⌋ full d × d blocks and one partial block (its first M mod d rows). Each block is the Q
/// factor of the QR decomposition of a d × d Gaussian matrix (signs fixed so that Q is Haar
/// distributed), so its rows are orthonormal; each row is then rescaled either by an independent
/// χ_d norm (the norm of a fresh N(0, I_d) vector: every row is marginally N(0, I_d), Performer's
/// `ortho_scaling = 0`) or by √d (`ortho_scaling = 1`). Rows inside a block are exactly
/// orthogonal; different blocks are independent.
///
/// Cost: O(⌈M/d⌉·d³) for the QRs (Eigen, float64), O(M·d) memory. Draws come from the counter
/// RNG keyed by (seed, stream), so a head can have its own stream and the result never depends on
/// the thread count.
#pragma once

#include <cstdint>
#include <vector>

#include "numattn/core/tensor.h"

namespace numattn::decomp {

/// Row norms of orthogonal random features.
enum class FeatureNorm {
  kChi,    ///< independent χ_d norms (rows marginally N(0, I_d)); Performer's default
  kSqrtD,  ///< every row has norm √d
};

/// M × d row-major matrix of i.i.d. N(0, 1) entries from stream `stream` of `seed`.
std::vector<double> gaussian_features(index_t m, index_t d, std::uint64_t seed, std::uint64_t stream);

/// M × d row-major matrix of orthogonal random features (see the file comment): rows m and m'
/// of the same block (m / d == m' / d) are orthogonal.
std::vector<double> orthogonal_features(index_t m, index_t d, std::uint64_t seed, std::uint64_t stream,
                                        FeatureNorm norm = FeatureNorm::kChi);

}  // namespace numattn::decomp
