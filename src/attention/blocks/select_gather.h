// Internal building block of the methods that attend each query row to a chosen subset of the
// keys it sees (sparse.topk, lowrank.loki): choosing the k largest entries of a row of scores,
// and exact softmax attention of one query row over chosen keys gathered from K and V.
//
// Selection is exact (the same set as a full sort): a sample of the row brackets the k-th
// largest value between two thresholds, counting passes narrow the bracket, nth_element runs on
// the values of the band left between them, and one pass writes the positions at or above the
// k-th largest. Its cost is a few vector passes over the row instead of a partial sort of it.
//
// The loops are compiled per instruction-set path (core/cpu.h: portable, avx2, avx512) and
// chosen at run time; every path gives the same selection, and the same logits and outputs up
// to the order of float32 sums.
#pragma once

#include <cstdint>
#include <vector>

#include "numattn/core/tensor.h"

namespace numattn::blocks {

/// Reusable buffers of `select_top` (one per thread).
struct SelectScratch {
  std::vector<float> vals;
  std::vector<std::int32_t> band;  ///< positions before the final cut
};

/// Positions of the k largest entries of s[0..n): every entry above the k-th largest value, then
/// the entries equal to it in increasing position until k are taken (a stable sort's choice).
/// Entries equal to −inf (hidden keys) and NaN are never taken, so fewer than k come back when
/// fewer are left; +inf is the largest value. Writes `base + position`, increasing, to `out`,
/// which has room for min(k, n) + 16 entries (the vector loops store whole registers). Returns
/// the number written.
index_t select_top(const float* s, index_t n, index_t k, std::int32_t base, std::int32_t* out, SelectScratch& w);

/// Packs k rows 0..nk (row stride ldk, length dk) 16 at a time, transposed: panel p is
/// kt[p·16·dk + d·16 + c] = k_{16p+c}[d], zero past nk. kt has room for 16·dk·ceil(nk/16) floats.
void pack_key_panels(const float* k, index_t ldk, index_t nk, index_t dk, float* kt);

/// s[r·lds + j] = scale·(q_r · k_j) for r < m and j < 16·npanel: the logits of m query rows
/// (stride ldq) against packed keys (pack_key_panels; kt at panel 0 of the run), register-blocked
/// over rows and 16 keys so that no horizontal sums and no per-call packing are needed.
void panel_scores(const float* q, index_t ldq, index_t m, index_t dk, const float* kt, index_t npanel, float scale,
                  float* s, index_t lds);

/// l[t] = scale·(q · k_{idx[t]}) for t < n (k rows of length dk, row stride ldk).
void gather_logits(const float* q, index_t dk, const float* k, index_t ldk, const std::int32_t* idx, index_t n,
                   float scale, float* l);

/// dst[t·d + c] = src[idx[t]·ld + c] for t < n, c < d: rows idx gathered into a contiguous buffer.
void gather_rows(const float* src, index_t ld, const std::int32_t* idx, index_t n, index_t d, float* dst);

/// Softmax over the n logits l (overwritten with their weights), applied to the gathered value
/// rows: out = Σ_t e^{l_t − m} v_{idx[t]} / Σ_t e^{l_t − m}. Returns log Σ_t e^{l_t} (the LSE of
/// the chosen keys). n = 0 gives out = 0 and −inf; a logit that is NaN or +inf (an overflow, an
/// input the row reads) gives out = NaN and NaN, for `AttentionMethod::run` to settle.
float softmax_gather_values(float* l, index_t n, const float* v, index_t ldv, index_t dv, const std::int32_t* idx,
                            float* out);

/// One query row of `attend_chosen`.
struct ChosenRow {
  const float* q = nullptr;            ///< Dk
  const std::int32_t* keys = nullptr;  ///< the chosen keys, increasing
  index_t n = 0;
  const float* add = nullptr;          ///< additive mask row, indexed by key (null: none)
  float* out = nullptr;                ///< Dv
  float* lse = nullptr;                ///< null: not wanted
};

/// Reusable buffers of `attend_chosen` (one per thread).
struct AttendScratch {
  std::vector<float> l, acc, z;
  std::vector<index_t> off, cur;
};

/// `softmax_gather_values` ∘ `gather_logits` (+ the additive mask) for each of `nrows` rows over
/// the same k and v rows, computed chunk by chunk of 128 keys: a chunk's k rows (then its v rows)
/// are read from memory once and used by every row that chose keys in it, so that rows sharing
/// keys (neighbours, the heads of a GQA group) run from the L1 cache instead of the memory
/// bandwidth. Two passes (logits, then weighted values) with the softmax in between.
void attend_chosen(const ChosenRow* rows, index_t nrows, const float* k, index_t ldk, const float* v, index_t ldv,
                   index_t dk, index_t dv, float scale, AttendScratch& w);

}  // namespace numattn::blocks
