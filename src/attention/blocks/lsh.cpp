#include "numattn/attention/blocks/lsh.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <span>

#include "numattn/core/blas.h"
#include "numattn/core/error.h"
#include "numattn/core/rng.h"

namespace numattn::blocks {

std::vector<float> lsh_projections(index_t dim, index_t k, std::uint64_t seed, std::uint64_t stream) {
  NUMATTN_CHECK(dim > 0 && k > 0, "lsh_projections: dim and k must be positive");
  std::vector<float> r(static_cast<std::size_t>(dim * k));
  fill_normal(std::span<float>(r), seed, stream);
  return r;
}

void lsh_project(const float* x, index_t rows, index_t ld, index_t dim, const float* r, index_t k,
                 float* proj) {
  if (rows == 0) return;
  blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, rows, k, dim, 1.0f, x, ld, r, k, 0.0f, proj, k);
}

void angular_codes(const float* proj, index_t rows, index_t k, std::int32_t* codes) {
  for (index_t i = 0; i < rows; ++i) {
    const float* p = proj + i * k;
    float best = -std::numeric_limits<float>::infinity();
    std::int32_t arg = 0;
    // [p, −p]: index c < k is +p_c, index k + c is −p_c; strict > keeps the lowest index on ties.
    for (index_t c = 0; c < k; ++c)
      if (p[c] > best) { best = p[c]; arg = static_cast<std::int32_t>(c); }
    for (index_t c = 0; c < k; ++c)
      if (-p[c] > best) { best = -p[c]; arg = static_cast<std::int32_t>(k + c); }
    codes[i] = arg;
  }
}

void simhash_codes(const float* proj, index_t rows, index_t k, std::uint32_t* codes) {
  NUMATTN_CHECK(k <= 31, "simhash_codes: at most 31 bits");
  for (index_t i = 0; i < rows; ++i) {
    const float* p = proj + i * k;
    std::uint32_t c = 0;
    for (index_t b = 0; b < k; ++b)
      if (p[b] > 0.0f) c |= 1u << b;
    codes[i] = c;
  }
}

std::uint32_t gray_code(std::uint32_t i) { return i ^ (i >> 1); }

std::uint32_t gray_rank(std::uint32_t code) {
  // Prefix XOR from the top bit down inverts i ⊕ (i >> 1).
  std::uint32_t r = code;
  for (std::uint32_t s = 1; s < 32; s <<= 1) r ^= r >> s;
  return r;
}

void e2lsh_codes(const float* proj, index_t rows, double offset, double width, std::int64_t* codes) {
  NUMATTN_CHECK(width > 0 && std::isfinite(width), "e2lsh_codes: width must be positive");
  constexpr double kSat = 4611686018427387904.0;  // 2^62
  for (index_t i = 0; i < rows; ++i) {
    const double v = std::floor((static_cast<double>(proj[i]) + offset) / width);
    codes[i] = std::isfinite(v) ? static_cast<std::int64_t>(std::clamp(v, -kSat, kSat)) : 0;
  }
}

void stable_sort_by_key(const std::uint32_t* keys, index_t n, std::uint32_t key_range, index_t* perm) {
  std::vector<index_t> start(static_cast<std::size_t>(key_range) + 1, 0);
  for (index_t i = 0; i < n; ++i) {
    NUMATTN_CHECK(keys[i] < key_range, "stable_sort_by_key: key out of range");
    ++start[keys[i] + 1];
  }
  for (std::size_t b = 1; b < start.size(); ++b) start[b] += start[b - 1];
  for (index_t i = 0; i < n; ++i) perm[start[keys[i]]++] = i;
}

void stable_argsort(const float* values, index_t n, index_t* perm) {
  std::iota(perm, perm + n, index_t{0});
  std::stable_sort(perm, perm + n, [values](index_t a, index_t b) {
    const bool na = std::isnan(values[a]), nb = std::isnan(values[b]);
    if (na || nb) return !na && nb;
    return values[a] < values[b];
  });
}

void invert_permutation(const index_t* perm, index_t n, index_t* inv) {
  for (index_t s = 0; s < n; ++s) inv[perm[s]] = s;
}

}  // namespace numattn::blocks
