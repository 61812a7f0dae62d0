/// @file kmeans.h
/// k-means clustering of float32 rows (Lloyd's algorithm), the shared building block of the
/// clustering attention methods (sparse.routing, sparse.clustered, sparse.multipole).
///
/// Input: X, `n` rows of dimension `d` with row stride `ldx` (elements). Output: `k` centroids
/// (k = min(requested k, n)), the nearest-centroid assignment of every row, cluster sizes, the
/// inertia Σᵢ dist(xᵢ, c_{a(i)}) and the number of Lloyd iterations run.
///
/// - Initialisation: k-means++ (Arthur & Vassilvitskii 2007: each next centre drawn with
///   probability ∝ D(x)², the squared distance to the nearest chosen centre; run on a uniform
///   subsample of max(16·k, 1024) rows when n is larger, since its k passes are sequential) or k distinct rows
///   drawn uniformly; all draws come from the counter RNG (seed, stream), so the result is a
///   pure function of (X, options) and independent of the thread count (k-means itself runs on
///   the calling thread; callers parallelise over independent problems, e.g. heads).
/// - Lloyd step: scores X·Cᵀ by one blas::sgemm per block of rows, dist = ‖x‖² − 2x·c + ‖c‖²
///   (ties: the lower centroid index); means accumulated in float64. Stops after `iters`
///   iterations or when no assignment changes.
/// - Spherical (cosine) variant: rows and centroids are unit-normalised (zero rows stay zero),
///   nearest = largest x·c, inertia Σ (1 − x·c).
/// - Empty clusters are re-seeded deterministically: each takes the row farthest from its
///   current centroid (ties: lower row index) among rows not already taken this step.
///
/// Cost: O(n·k·d) per iteration (GEMM-shaped) plus O(min(n, 16k)·k·d) for k-means++; memory O((n + k)·k)
/// floats with rows processed in blocks. Non-finite rows are the caller's concern: the result is
/// deterministic but meaningless (methods screen them out first).
#pragma once

#include <cstdint>
#include <vector>

#include "numattn/core/tensor.h"

namespace numattn::decomp {

struct KMeansOptions {
  index_t k = 8;            ///< clusters requested (clamped to n)
  int iters = 10;           ///< Lloyd iterations at most (0: initial centres only)
  bool spherical = false;   ///< cosine k-means on unit-normalised rows
  bool plusplus = true;     ///< k-means++ initialisation (else uniform distinct rows)
  std::uint64_t seed = 0, stream = 0;  ///< counter-RNG key of the initialisation
};

struct KMeansResult {
  index_t k = 0, d = 0;
  std::vector<float> centroids;      ///< k × d, row-major
  std::vector<std::int32_t> assign;  ///< n: nearest centroid of each row (for `centroids`)
  std::vector<index_t> sizes;        ///< k: rows per cluster under `assign`
  double inertia = 0;                ///< Σ dist(x, nearest centroid): squared Euclidean, or 1 − cos
  int iterations = 0;                ///< Lloyd update steps performed
  bool converged = false;            ///< an assignment step changed nothing
};

/// Runs k-means on X (see the file comment). `n == 0` gives an empty result.
KMeansResult kmeans(const float* x, index_t n, index_t d, index_t ldx, const KMeansOptions& opt);

/// S = X·Cᵀ (n × k, row-major, leading dimension k) by blas::sgemm: the scores behind every
/// nearest-centroid and top-w decision.
void centroid_scores(const float* x, index_t n, index_t d, index_t ldx, const float* c, index_t k, float* s);

/// Balanced ("top-w") assignment (Routing Transformer): for each column c of the n × k score
/// matrix S (larger = closer), the `w` rows with the largest S(·, c) (ties: lower row index),
/// returned in ascending row order. A row can be in several columns' lists or in none.
/// O(n·k) expected time.
std::vector<std::vector<index_t>> top_w_members(const float* s, index_t n, index_t k, index_t w);

/// Copies `n` rows of X into `out` (n × d contiguous), each divided by its Euclidean norm
/// (rows of norm 0 stay 0). Norms are accumulated in float64.
void normalized_rows(const float* x, index_t n, index_t d, index_t ldx, float* out);

}  // namespace numattn::decomp
