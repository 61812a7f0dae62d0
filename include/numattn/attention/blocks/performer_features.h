/// @file performer_features.h
/// The random directions of Performer's softmax-kernel feature maps (FAVOR+; Choromanski et
/// al., Rethinking Attention with Performers, ICLR 2021), shared by the methods that build
/// φ(x) = M^{-1/2} exp(ω_mᵀx − ‖x‖²/2) and its signed variants from them: kernel.performer and
/// the low-rank part of sparse.scatterbrain (Chen et al., Scatterbrain, NeurIPS 2021).
///
/// The directions are a pure function of (M, d, seed, stream, orthogonal): orthogonal random
/// features with χ_d row norms, or i.i.d. Gaussian rows (decomp/random_features.h), drawn from
/// the counter RNG keyed by (seed, stream), so the result never depends on the thread count and
/// two methods given the same key draw the same ω.
#pragma once

#include <cstdint>
#include <vector>

#include "numattn/core/tensor.h"

namespace numattn::blocks {

/// The M × d row-major directions ω (float64, before any √scale folding) for stream `stream` of
/// `seed` (a method's KV head, or 0 for one draw shared by every head). Cost: O(⌈M/d⌉·d³) for
/// the QRs of an orthogonal draw, O(M·d) for a Gaussian one; a process-wide cache of the last 32
/// draws (they cost more than a small problem, and methods are often re-created per call) makes a
/// repeated key O(M·d). Thread-safe.
std::vector<double> performer_directions(index_t m, index_t d, std::uint64_t seed,
                                         std::uint64_t stream, bool orthogonal);

}  // namespace numattn::blocks
