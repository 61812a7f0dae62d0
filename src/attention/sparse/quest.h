#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <vector>

#include "numattn/attention/method.h"

namespace numattn {

/// `sparse.quest(page=16, pages=64, sinks=16, recent=256)`: query-aware page selection (Tang et
/// al., "Quest: Query-Aware Sparsity for Efficient Long-Context LLM Inference", ICML 2024), with
/// StreamingLLM's sinks and a recent window.
///
/// The keys of each kv head are cut into pages of `page` positions from key 0; a page P keeps
/// the per-dimension minimum and maximum of its keys, m_P and M_P. For query row i and the G
/// query heads of a GQA group, a page's score is the largest over the group of Quest's upper
/// bound on its logits, Σ_d max(s·q_d·m_P,d, s·q_d·M_P,d) (s the softmax scale). Row i attends, by
/// exact softmax (the flash block reading the chosen ranges of the cache in place,
/// blocks::flash_attention_selected, split across threads in a decode step), to: its `sinks` first visible keys, its
/// `recent` last ones, and the `pages` best-scoring pages between them (clipped to that middle
/// range; a page without a summary, the partial last one, always counts); a row that sees at
/// most sinks + recent + pages·page keys attends to all of them (exact). The same choice per row
/// in a prefill (`ppl`) as in a decode step.
///
/// Page summaries persist between calls on the same K buffer (a KV cache): a call with one query
/// row over keys that extend the previous call's summarises only the pages completed since, so
/// a decode step reads the summaries (2·Dk values per page and kv head, in the cache's element
/// type), the chosen pages and the sinks and recent rows: not the rest of the cache. A call with several rows, over another
/// buffer, or over fewer keys than were summarised recomputes them (O(Nk·Dk)). This assumes that
/// the rows of a buffer below the previous call's n_kv are unchanged while n_kv grows one call
/// to the next, as in a KV cache (positions are appended, never rewritten); concurrent calls on
/// one instance are serialised by a mutex.
///
/// Reads half-precision K/V in place (problem.h HalfKv). Shapes as problem.h; no masks or
/// window. Cost per row: O((Nk/page)·G·Dk) for the scores (in float32: the bound is the dot
/// product of [s·q⁺ | s·q⁻] with the page's [max | min], q⁺ = max(q, 0), q⁻ = min(q, 0), computed
/// by SIMD kernels per CPU path), O(kept·(Dk + Dv)) for the attention; workspace: the flash
/// block's, the chosen ranges, and the summaries, 2·B·Hkv·(Nk/page)·Dk values.
/// Limit case: pages·page ≥ Nk is exact softmax attention.
class QuestAttention final : public AttentionMethod {
 public:
  using AttentionMethod::AttentionMethod;
  static const MethodInfo& describe();
  const MethodInfo& info() const override { return describe(); }
  std::size_t workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const override;
  void forward(const AttentionProblem& p, const ExecContext& ctx) const override;
  /// Rows row i reads: sinks + recent + pages·page among its visible keys, plus its summaries
  /// counted in rows of the cache: ⌈2·Dk / (Dk + Dv)⌉ per page (the summaries are kept in the
  /// cache's element type).
  index_t keys_read(const AttentionProblem& p, index_t i) const;

 private:
  /// Page maxima and minima of the buffer `base` (layout `stride`): per (b, kv head) group one
  /// row [max | min] (2·Dk values) per page, pages in order, so that a decode step streams its
  /// group's rows; float32 for a float32 cache (`rows`), else in the cache's 16-bit type
  /// (`rows16`), which holds a minimum or maximum of its own values exactly (half the bytes).
  struct Summary {
    const void* base = nullptr;
    std::array<index_t, 4> stride{}, shape{};
    KvType type = KvType::kF32;
    index_t pages = 0;
    std::vector<std::vector<float>> rows;
    std::vector<std::vector<std::uint16_t>> rows16;
  };
  void summarise(const AttentionProblem& p) const;
  mutable std::mutex mu_;
  mutable Summary sum_;
};

}  // namespace numattn
