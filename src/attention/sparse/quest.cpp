// sparse/quest.h: the method, and the portable variant of its page scoring (quest_kernels.h).
#define NUMATTN_ISA 0
#include "attention/sparse/quest_kernels.h"

#include "attention/sparse/quest.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "attention/method_def.h"
#include "attention/sparse/kept_keys_budget.h"
#include "core/isa_dispatch.h"
#include "numattn/attention/blocks/flash.h"
#include "numattn/quant/quant.h"

namespace numattn {

namespace {

const bool kRegistered = (register_kernel_family("attention.quest (page bounds)", CpuPath::kAvx512), true);

const quest_ops::Ops& ops_now() {
  return *pick_isa_variant(quest_ops::portable::ops(), quest_ops::avx2::ops(), quest_ops::avx512::ops());
}

/// Row (b, h, j) of K (`key`) or V as float32, whatever the problem's element type.
void load_row(const AttentionProblem& p, bool key, index_t b, index_t h, index_t j, float* out) {
  const index_t n = key ? p.d_qk() : p.d_v();
  if (!p.half_kv()) {
    const float* src = key ? p.k.row(b, h, j) : p.v.row(b, h, j);
    std::copy_n(src, n, out);
    return;
  }
  widen_row(key ? p.k16_row(b, h, j) : p.v16_row(b, h, j), p.half.type, n, out);
}

struct Budget {
  index_t page, pages, sinks, recent;
  index_t kept() const { return sinks + recent + pages * page; }
};

Budget budget_of(const ParamValues& pv) {
  return {pv.get_int("page"), pv.get_int("pages"), pv.get_int("sinks"), pv.get_int("recent")};
}

}  // namespace

const MethodInfo& QuestAttention::describe() {
  static const MethodInfo info = [] {
    MethodInfo m;
    m.name = "sparse.quest";
    m.family = "sparse";
    m.summary =
        "query-aware page selection: per page of keys the per-dimension min/max, Quest's upper "
        "bound on the page's logits, the top pages plus sinks and a recent window, exact softmax "
        "over them; page summaries kept across decode steps";
    m.citation =
        "Tang, Zhao, Zhu, Xiao, Kasikci, Han, Quest: Query-Aware Sparsity for Efficient Long-Context "
        "LLM Inference, ICML 2024";
    m.time_complexity = "O(Nq·((Nk/page)·G·Dk + (sinks+recent+pages·page)·(Dk+Dv)))";
    m.memory_complexity = "O(B·Hkv·Nq·pages) ranges + 2·B·Hkv·(Nk/page)·Dk floats of page summaries";
    m.params = {
        {"page", ParamType::kInt, "16", 1, 4096, {}, "keys per page"},
        {"pages", ParamType::kInt, "64", 0, 1e9, {}, "pages each row attends to, chosen by their bound"},
        {"sinks", ParamType::kInt, "16", 0, 1e9, {}, "first visible keys every row attends to"},
        {"recent", ParamType::kInt, "256", 0, 1e9, {}, "last visible keys every row attends to"},
    };
    m.caps = {.exact = false, .causal = true, .gqa = true, .bool_mask = false, .additive_mask = false,
              .window = false, .lse = true, .decode = true, .half_kv = true};
    AccuracyContract& a = m.accuracy;
    a.max_rel_fro_error = [](const BudgetInput& in) {
      const index_t kept = budget_of(in.params).kept();
      return sparse_detail::kept_keys_budget(in, 1.5, 1.5, [&](index_t, KeyRange) { return kept; });
    };
    a.limit_case = [](const AttentionProblem& p) { return ParamOverrides{{"pages", std::to_string(p.n_kv())}}; };
    a.convergence.param = "pages";
    a.convergence.values = [](const AttentionProblem& p) {
      return std::vector<std::string>{"0", "2", "8", std::to_string(p.n_kv())};
    };
    a.samples = {{{"page", "4"}, {"pages", "2"}, {"sinks", "1"}, {"recent", "4"}},
                 {{"page", "8"}, {"pages", "3"}, {"sinks", "0"}, {"recent", "8"}},
                 {{"page", "1"}, {"pages", "5"}, {"sinks", "2"}, {"recent", "1"}}};
    return m;
  }();
  return info;
}

index_t QuestAttention::keys_read(const AttentionProblem& p, index_t i) const {
  const Budget bg = budget_of(params());
  const KeyRange r = p.key_range(i);
  const index_t n = r.empty() ? 0 : r.end - r.begin;
  if (n <= bg.kept()) return n;
  const index_t row = p.d_qk() + p.d_v();
  return bg.kept() + (2 * p.d_qk() + row - 1) / row * ((r.end + bg.page - 1) / bg.page);
}

std::size_t QuestAttention::workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const {
  const Budget bg = budget_of(params());
  const auto pages = static_cast<std::size_t>(p.n_kv() / bg.page);
  const auto groups = static_cast<std::size_t>(p.batch() * p.kv_heads() * p.n_q());
  // The flash block's scratch (as for a decode step), the chosen ranges of every group, the
  // summaries.
  return blocks::flash_workspace_bytes(p, blocks::FlashConfig{}, ctx.num_threads()) +
         groups * sizeof(KeyRange) * static_cast<std::size_t>(std::min(p.n_kv(), bg.pages + 2)) +
         (p.half_kv() ? 2 : sizeof(float)) * 2 * pages * static_cast<std::size_t>(p.batch() * p.kv_heads() * p.d_qk());
}

void QuestAttention::summarise(const AttentionProblem& p) const {
  const index_t pg = params().get_int("page"), B = p.batch(), Hk = p.kv_heads(), D = p.d_qk();
  const void* base = p.half_kv() ? static_cast<const void*>(p.half.k) : static_cast<const void*>(p.k.data);
  Summary& s = sum_;
  // Reuse only what a KV cache's next decode step can: the same buffer and layout, one new row
  // (the batch stride of a one-sequence cache view grows with n_kv: not compared then).
  const bool same = base == s.base && s.type == p.half.type && s.stride[1] == p.k.stride[1] &&
                    s.stride[2] == p.k.stride[2] && (B == 1 || s.stride[0] == p.k.stride[0]) &&
                    s.shape[0] == B && s.shape[1] == Hk && s.shape[3] == D && s.shape[2] + 1 == p.n_kv() &&
                    p.n_q() == 1;
  const bool half = p.half_kv();
  const auto groups = static_cast<std::size_t>(B * Hk);
  if (!same) {
    s.pages = 0;
    s.rows.assign(half ? 0 : groups, {});
    s.rows16.assign(half ? groups : 0, {});
  }
  s.base = base;
  s.type = p.half.type;
  s.stride = p.k.stride;
  s.shape = p.k.shape;
  const index_t want = p.n_kv() / pg;
  std::uint16_t (*narrow)(float) = p.half.type == KvType::kBf16 ? fp32_to_bf16 : fp32_to_fp16;
  std::vector<float> row(static_cast<std::size_t>(D)), mm(static_cast<std::size_t>(2 * D));
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < Hk; ++h) {
      const auto grp = static_cast<std::size_t>(b * Hk + h);
      for (index_t P = s.pages; P < want; ++P) {
        // [max | min], the order of the bound's dot product (quest_kernels.h).
        std::fill(mm.begin(), mm.begin() + D, -std::numeric_limits<float>::infinity());
        std::fill(mm.begin() + D, mm.end(), std::numeric_limits<float>::infinity());
        for (index_t j = P * pg; j < P * pg + pg; ++j) {
          load_row(p, true, b, h, j, row.data());
          for (index_t d = 0; d < D; ++d) {
            const auto u = static_cast<std::size_t>(d);
            mm[u] = std::max(mm[u], row[u]), mm[u + row.size()] = std::min(mm[u + row.size()], row[u]);
          }
        }
        if (half) {
          // Minima and maxima of 16-bit values are 16-bit values: narrowing is exact.
          for (const float x : mm) s.rows16[grp].push_back(narrow(x));
        } else {
          s.rows[grp].insert(s.rows[grp].end(), mm.begin(), mm.end());
        }
      }
    }
  s.pages = want;
}

void QuestAttention::forward(const AttentionProblem& p, const ExecContext& ctx) const {
  const std::lock_guard<std::mutex> lock(mu_);
  summarise(p);
  const Budget bg = budget_of(params());
  const index_t Hk = p.kv_heads(), G = p.group(), dk = p.d_qk();
  const auto scale = static_cast<float>(p.effective_scale());
  const Summary& s = sum_;
  // The row's key ranges, sorted: all of them, or sinks, the chosen pages of the middle, recent;
  // adjacent chosen pages coalesce into one range, so the kernel streams runs of the cache.
  blocks::flash_attention_selected(p, [&](index_t b, index_t hk, index_t qi, std::vector<KeyRange>& out) {
    const KeyRange r = p.key_range(qi);
    if (r.empty()) return;
    if (r.end - r.begin <= bg.kept()) {
      out.push_back(r);
      return;
    }
    const index_t s_end = r.begin + bg.sinks, r0 = r.end - bg.recent;
    const index_t first = s_end / bg.page, last = (r0 - 1) / bg.page;
    thread_local std::vector<float> qpm, bound, nth;
    thread_local std::vector<index_t> pick;
    // [s·q⁺ | s·q⁻] per query head of the group: the bound as one dot product with [max | min].
    qpm.resize(static_cast<std::size_t>(G * 2 * dk));
    for (index_t g = 0; g < G; ++g) {
      const float* q = p.q.row(b, hk * G + g, qi);
      float* o = qpm.data() + g * 2 * dk;
      for (index_t d = 0; d < dk; ++d) {
        const float x = scale * q[d];
        o[d] = std::max(x, 0.f), o[dk + d] = std::min(x, 0.f);
      }
    }
    pick.clear();
    // The `pages` best of the summarised pages; ties go to the lower page index, so the choice
    // does not depend on the selection's internals, and a NaN bound (a NaN key) ranks as +inf,
    // so that the NaN reaches the row. Pages past the summarised ones (the partial last page)
    // are always attended.
    const index_t scored_end = std::min(last + 1, s.pages), ns = std::max<index_t>(0, scored_end - first);
    const index_t keep = std::min(bg.pages, ns);
    if (keep > 0) {
      const auto grp = static_cast<std::size_t>(b * Hk + hk);
      const void* rows = p.half_kv() ? static_cast<const void*>(s.rows16[grp].data() + first * 2 * dk)
                                     : static_cast<const void*>(s.rows[grp].data() + first * 2 * dk);
      bound.resize(static_cast<std::size_t>(ns));
      ops_now().bounds(rows, s.type, ns, 2 * dk, qpm.data(), G, bound.data());
      for (float& x : bound)
        if (std::isnan(x)) x = std::numeric_limits<float>::infinity();
      float thr = -std::numeric_limits<float>::infinity();
      index_t ties = ns;
      if (keep < ns) {
        nth.assign(bound.begin(), bound.end());
        std::nth_element(nth.begin(), nth.begin() + (keep - 1), nth.end(), std::greater<float>());
        thr = nth[static_cast<std::size_t>(keep - 1)];
        ties = keep - static_cast<index_t>(std::count_if(bound.begin(), bound.end(), [&](float x) { return x > thr; }));
      }
      for (index_t P = first; P < scored_end; ++P) {
        const float x = bound[static_cast<std::size_t>(P - first)];
        if (x > thr || (x == thr && ties-- > 0)) pick.push_back(P);
      }
    }
    for (index_t P = std::max(first, scored_end); P <= last; ++P) pick.push_back(P);
    const auto add = [&](KeyRange kr) {
      if (kr.empty()) return;
      if (!out.empty() && out.back().end == kr.begin) out.back().end = kr.end;
      else out.push_back(kr);
    };
    add({r.begin, s_end});
    for (const index_t P : pick) add({std::max(P * bg.page, s_end), std::min(P * bg.page + bg.page, r0)});
    add({r0, r.end});
  }, blocks::FlashConfig{}, ctx);
}

NUMATTN_DEFINE_METHOD(QuestAttention)

}  // namespace numattn
