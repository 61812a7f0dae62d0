/// @file flash.h
/// The flash block: exact softmax attention in float32 by tiled online softmax (FlashAttention's
/// forward pass), the kernel behind `exact.flash`, `blocks::dense_softmax_attention` and every
/// method that attends exactly over a subset of keys (attention-specific building block).
///
/// Shapes: q `[B, Hq, Nq, Dk]`, k `[B, Hkv, Nk, Dk]`, v `[B, Hkv, Nk, Dv]` → out
/// `[B, Hq, Nq, Dv]`, lse `[B, Hq, Nq, 1]` (problem.h; any row strides, last dim contiguous).
///
/// Work item: a block of up to 64 rows of one (batch, kv head), where the rows of a kv head are
/// the (query, head) pairs of its GQA group, so the query heads that share a K/V tile read it
/// once (decoding with 8 heads on 1 kv head is one 8-row block). Key/value tiles of `block_k`
/// keys stream through cache; the running maximum m, normaliser l and unnormalised output are
/// rescaled by exp(m_old − m_new) as each tile arrives, so no Nq × Nk buffer ever exists.
/// Tiles that the causal rule or window hide from every row of the block are skipped; tiles
/// are cut at the edges of the key range every row of the block sees, so only narrow boundary
/// tiles (or every tile, with a mask) are masked element by element. When there are
/// fewer blocks than 2 × threads (decoding), each block's key range is split and the partial
/// (m, l, acc) merge exactly through log-sum-exp, in a fixed order. Threads take work units
/// (block, split) from a shared counter, grouped by (batch, kv head) and heaviest first within
/// a group; since a unit's result does not depend on which thread computes it, the output is
/// bitwise reproducible for a given thread count.
///
/// Kernels (src/attention/blocks/flash_kernels.h): query rows sit in the SIMD lanes, so
/// S = K·(scale·Q)ᵀ and O += Vᵀ·P are register-blocked broadcast-FMA loops that read K and V rows
/// in place, and the softmax statistics are vertical vector ops. Decoding, where a kv head has
/// fewer rows (G·Nq) than half a vector, would leave most lanes idle: there the head dimension
/// sits in the lanes ("key lanes"), a logit is a dot product reduced across lanes, P·V
/// broadcasts a probability against a V row, and one block holds the rows of as many kv heads as
/// 64 rows allow, so a tile of the KV cache's [position, kv head, dim] rows is read as one stream
/// (1.1–5× faster per decode step on AVX2 for G = 1..4, docs/model-runner.md). AVX-512 (16
/// lanes), AVX2+FMA (8 lanes) or a portable fallback, each compiled in its own variant unit and
/// chosen at run time by the library's CPU path (core/cpu.h); all give the same algorithm. The
/// register tile holds 4 query vectors on AVX-512 and 2 on AVX2 (its 16 registers): each group
/// of keys of a 64-row block goes through one register tile on AVX-512 and four on AVX2, from L1.
///
/// Half-precision K/V (problem.h HalfKv, a KV cache in binary16 or bfloat16): the key-lane
/// kernels read the 16-bit elements in place, W at a time, widened in registers (F16C's
/// vcvtph2ps for binary16, a zero-extension and 16-bit shift for bfloat16; a scalar conversion
/// on the portable path), so a decode step reads half the bytes and converts nothing else;
/// blocks in query lanes (a prefill) run on packed panels (below). Every half value is a
/// float32, so the result is bitwise the float32 kernels' on the widened values.
///
/// Packed K/V: in query lanes every block of rows streams its (batch, kv head)'s whole K and V.
/// When those rows are half precision, or float32 rows not adjacent in memory ([B, N, H, D]
/// storage: k.stride[2] = H·D, 2 rows per 4 KiB page, few cache sets; measured 1.1–1.3× slower)
/// and more than one block reads them, the visible rows are first copied into contiguous float32
/// rows in one parallel pass (O(B·Hkv·Nk·(Dk+Dv)) time and workspace, against
/// O(B·Hq·Nq·Nk·(Dk+Dv)) of attention). Decoding (key lanes) reads rows in place.
///
/// Half-precision Q and output (problem.h HalfQ, HalfOut; `Capabilities::half_io`): each q row
/// is converted to float32 as its block is loaded, each output row rounded to nearest even as it
/// is written; no whole-tensor copy. Q·K runs in float32 FMAs on every path: AVX-512 BF16
/// (`vdpbf16ps`) is not used (docs/numerics.md, "Half-precision queries and output").
///
/// Cost: 2·Nq·Nk·(Dk+Dv) flops per query head (about half for causal), no BLAS calls;
/// workspace O(threads·64·(Dk + Dv + block_k)) floats plus, when split, 64·(Dv+2) floats per
/// (block, split). Error: logits are rounded once more than in `exact.naive` (scale folded
/// into q); probabilities below e^-64 of the row maximum are flushed to 0 (below float32
/// resolution); P·V is summed per tile and then added to the running output (blocked
/// summation). Edges (problem.h): no pass over K or V looks for NaN, ±inf or overflow; the
/// kernels carry them into the row instead (exp_cut keeps NaN, l = NaN is not an empty row, and
/// a lane whose smallest raw logit is -inf, which the softmax would drop without a trace, gets
/// l = NaN); the caller's `run` settles those rows in float64.
/// Dao et al., FlashAttention, NeurIPS 2022; Milakov & Gimelshein, Online normalizer
/// calculation for softmax, 2018; split-KV as in flash-decoding (Dao et al., 2023).
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "numattn/attention/problem.h"
#include "numattn/core/exec.h"

namespace numattn::blocks {

/// Blocking of the flash block (`exact.flash`'s parameters of the same names).
struct FlashConfig {
  index_t block_q = 64;     ///< query rows per block (rounded up to whole SIMD vectors, ≤ 64)
  index_t block_k = 256;    ///< keys per tile
  index_t split_kv = 0;     ///< key-range splits per block (0 = automatic: when blocks < 2×threads)
  index_t key_lanes = -1;   ///< most rows per kv head run in key lanes (-1 = half a vector; 0 = never)
};

/// Writes `p.out` (and `p.lse` when not empty). `p` must satisfy `validate`.
void flash_attention(const AttentionProblem& p, const FlashConfig& cfg, const ExecContext& ctx);

/// Bytes of workspace `flash_attention` allocates for `p` on `threads` threads.
std::size_t flash_workspace_bytes(const AttentionProblem& p, const FlashConfig& cfg, int threads);

/// The keys that the G rows of one (batch, kv head, query) group attend: sorted, disjoint,
/// non-empty ranges within [0, Nk), appended to `out` (which arrives empty). Called once per
/// group, concurrently for different groups.
using SelectKeys = std::function<void(index_t b, index_t kv_head, index_t qi, std::vector<KeyRange>& out)>;

/// Exact softmax attention of every (batch, kv head, query) group over the key ranges `select`
/// gives it (each row still sees only the part of them inside its own visible range and mask):
/// the gather form of a sparse method without the gather. The keys are read in place (float32
/// or half precision) by the key-lane kernels, one group's rows per block; ranges that every row
/// of the group sees whole (no mask) are packed side by side into tiles of up to `block_k` keys
/// (one softmax update per tile, however short the ranges), the next tile's rows prefetched
/// while one is computed (scattered short runs are beyond the hardware prefetcher); a group's ranges
/// split across threads when groups are fewer than 2 × threads (decoding), the partial states
/// merged through log-sum-exp in a fixed order, so the result is bitwise reproducible for a
/// given thread count. A row with no selected key is a zero row with lse = -inf.
/// Cost: 2·G·(selected keys)·(Dk+Dv) flops per group plus `select`; workspace as
/// `flash_workspace_bytes` for a decode step, plus the ranges.
void flash_attention_selected(const AttentionProblem& p, const SelectKeys& select, const FlashConfig& cfg,
                              const ExecContext& ctx);

}  // namespace numattn::blocks
