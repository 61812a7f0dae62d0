/// @file lsh.h
/// Locality-sensitive hashing and bucket sorting for the sparse attention methods. One
/// projection step, three hash families, two sorts:
///
/// - **Angular / cross-polytope** (Reformer; Andoni et al. 2015): with a Gaussian R ∈ R^{d×k},
///   h(x) = argmax_c [xR, −xR]_c ∈ {0..2k−1}. Collisions concentrate on small angles; the code is
///   invariant to positive scaling of x.
/// - **SimHash / sign random projection** (Charikar 2002; HyperAttention, KDEformer):
///   h(x) = Σ_b 2^b·1[⟨w_b, x⟩ > 0], 2^k buckets; P[bit b agrees] = 1 − θ(x, y)/π. Sorting by
///   `gray_rank(h)` puts buckets that differ in one bit next to each other: the position of a
///   code in the reflected Gray sequence perm(1) = [0, 1], perm(n) = [perm(n−1),
///   reverse(perm(n−1)) + 2^{n−1}] (the sequence is gray_code(i) = i ⊕ (i >> 1)).
/// - **E2LSH / p-stable** (Datar et al. 2004; SMYRF): h(x) = ⌊(⟨w, x⟩ + b)/r⌋ with b ~ U[0, r).
///
/// Projections are drawn from the counter RNG keyed by (seed, stream): a caller gives each
/// (head, round) its own stream, so codes never depend on the thread count. A NaN or ±inf input
/// yields a valid code (never an out-of-range bucket); the method's attention then carries the
/// non-finite value to the output rows that read it.
///
/// Cost: projection 2·rows·d·k flops (one sgemm); codes O(rows·k); sorts O(n + buckets) (counting
/// sort) or O(n log n) (float argsort).
#pragma once

#include <cstdint>
#include <vector>

#include "numattn/core/tensor.h"

namespace numattn::blocks {

/// d × k row-major Gaussian projection directions (N(0, 1) entries) of stream `stream`.
std::vector<float> lsh_projections(index_t dim, index_t k, std::uint64_t seed, std::uint64_t stream);

/// proj = X·R: X is `rows` × `dim` with row stride `ld`, R is `dim` × `k` (from lsh_projections),
/// proj is `rows` × `k`, contiguous.
void lsh_project(const float* x, index_t rows, index_t ld, index_t dim, const float* r, index_t k,
                 float* proj);

/// Angular codes from projections (`rows` × `k`): argmax_c [p, −p]_c in [0, 2k); ties go to the
/// lowest c; a row of NaN gets code 0.
void angular_codes(const float* proj, index_t rows, index_t k, std::int32_t* codes);

/// SimHash codes from projections (`rows` × `k`, k ≤ 31): bit b is 1[p_b > 0].
void simhash_codes(const float* proj, index_t rows, index_t k, std::uint32_t* codes);

/// The i-th word of the reflected Gray sequence: i ⊕ (i >> 1).
std::uint32_t gray_code(std::uint32_t i);
/// The position of `code` in the reflected Gray sequence (inverse of gray_code): codes whose
/// ranks differ by one differ in exactly one bit.
std::uint32_t gray_rank(std::uint32_t code);

/// E2LSH codes ⌊(p + offset)/width⌋ from one projection per row (`proj` has `rows` entries);
/// width > 0. Non-finite projections get code 0; codes saturate at ±2^62.
void e2lsh_codes(const float* proj, index_t rows, double offset, double width, std::int64_t* codes);

/// Stable counting sort by key: `perm[s]` = the index of the s-th row in ascending (key, index)
/// order. Keys must be < `key_range`.
void stable_sort_by_key(const std::uint32_t* keys, index_t n, std::uint32_t key_range, index_t* perm);

/// Stable argsort of floats, ascending (NaN last, in index order): `perm[s]` as above.
void stable_argsort(const float* values, index_t n, index_t* perm);

/// inv[perm[s]] = s.
void invert_permutation(const index_t* perm, index_t n, index_t* inv);

}  // namespace numattn::blocks
