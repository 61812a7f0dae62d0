#include "attention/exact/flash.h"

#include "attention/method_def.h"
#include "numattn/attention/blocks/flash.h"
#include "numattn/core/cpu.h"

namespace numattn {

namespace {

const bool kRegistered = (register_kernel_family("exact.flash", CpuPath::kAvx512), true);

blocks::FlashConfig config_of(const ParamValues& pv) {
  return {pv.get_int("block_q"), pv.get_int("block_k"), pv.get_int("split_kv"), pv.get_int("key_lanes")};
}

}  // namespace

// Block sizes, measured on the 2-core Sapphire Rapids VM (AVX-512), 1 thread, B=1 H=8 N=1024,
// GFLOP/s per CPU-second (the machine is shared, so CPU time is steadier than wall time), best
// of 7; OpenBLAS's own SkylakeX sgemm kernel gives ~150 on 1024³ there:
//   D=128: block_k 64/128/256 → 129/135/135;  block_q 32/48/64 (block_k=128) → 134/127/135
//   D=64:  block_k 64/128/256 → 127/131/130;  block_q 32/48/64 (block_k=128) → 130/128/131
// The optimum is flat within noise; the defaults (64 rows, 256 keys) keep per-tile overheads
// (softmax statistics, accumulator rescale, tile classification) lowest. Decoding (8 rows,
// block_k 32..256): 2.8..2.9 ms for Nk = 32768, flat too.
const MethodInfo& FlashAttention::describe() {
  static const MethodInfo info = [] {
    MethodInfo m;
    m.name = "exact.flash";
    m.family = "exact";
    m.summary =
        "tiled online-softmax attention in float32 with SIMD micro-kernels, never forms Nq×Nk; "
        "GQA heads share K/V tiles; split-KV decode";
    m.citation = "Dao et al., FlashAttention, NeurIPS 2022";
    m.time_complexity = "O(Nq·Nk·(Dk+Dv)), about half with causal";
    m.memory_complexity = "O(threads·block_q·(Dk+Dv+block_k)) (+ split-KV partials)";
    m.params = {
        {"block_q", ParamType::kInt, "64", 1, 4096, {},
         "query rows per block (rows of a GQA group count together); rounded up to whole SIMD "
         "vectors, at most 64 rows"},
        {"block_k", ParamType::kInt, "256", 1, 65536, {}, "keys per tile"},
        {"split_kv", ParamType::kInt, "0", 0, 1024,
         {}, "key-range splits per query block (0 = automatic: split when blocks < 2×threads)"},
        {"key_lanes", ParamType::kInt, "-1", -1, 64, {},
         "a (batch, kv head) with at most this many rows (GQA group × queries) runs in key lanes, "
         "the decoding kernel (-1 = automatic: fewer rows than SIMD lanes; 0 = never)"},
    };
    m.caps = {.exact = true, .causal = true, .gqa = true, .bool_mask = true, .additive_mask = true,
              .window = true, .lse = true, .decode = true, .half_kv = true, .half_io = true,
              .head_mask = true};
    // One SIMD vector of rows, ragged key tiles and forced splits reach the branches the
    // defaults do not (partial blocks, 1..RJ-1 key tails, split-KV merging at every shape);
    // key_lanes = 64 runs every problem of up to 64 rows per kv head in key lanes (all row
    // groups, key and dim tails), key_lanes = 0 runs decoding in query lanes.
    m.accuracy = AccuracyContract::exact({{{"block_q", "16"}, {"block_k", "7"}},
                                          {{"block_q", "40"}, {"block_k", "33"}, {"split_kv", "3"}},
                                          {{"split_kv", "2"}},
                                          {{"key_lanes", "64"}, {"block_k", "13"}},
                                          {{"key_lanes", "64"}, {"split_kv", "3"}},
                                          {{"key_lanes", "0"}}});
    return m;
  }();
  return info;
}

Status FlashAttention::can_run(const AttentionProblem& p) const { return AttentionMethod::can_run(p); }

std::size_t FlashAttention::workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const {
  return blocks::flash_workspace_bytes(p, config_of(params_), ctx.num_threads());
}

void FlashAttention::forward(const AttentionProblem& p, const ExecContext& ctx) const {
  blocks::flash_attention(p, config_of(params_), ctx);
}

NUMATTN_DEFINE_METHOD(FlashAttention)

}  // namespace numattn
