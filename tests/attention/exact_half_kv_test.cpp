// exact.flash over half-precision K/V (problem.h HalfKv) on every CPU path the machine runs:
// the key-lane kernels (decoding) read binary16 / bfloat16 in place and must give bitwise the
// result of the same kernels on the widened float32 copy, and both the float64 reference's
// result on the rounded values within the exact tolerance (docs/numerics.md; the portable path
// is held to the tolerance only, see below); the query-lane
// path (a prefill) runs on the widened copy. Shapes: odd D, GQA ratios, Nk = 1, Nq > Nk
// (empty rows), logits ×100.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "numattn/attention/kv_reads.h"
#include "numattn/attention/random_problem.h"
#include "numattn/attention/reference.h"
#include "numattn/analysis/metrics.h"
#include "numattn/attention/registry.h"
#include "numattn/core/cpu.h"
#include "numattn/quant/quant.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

/// A random problem whose K and V are also held as halves of type `t` (rounded to nearest
/// even), viewed through `half()`.
struct HalfProblem {
  RandomProblem prob;
  KvType type;
  std::vector<std::uint16_t> k16, v16;
  HalfProblem(const ProblemConfig& cfg, KvType t) : prob(cfg), type(t) {
    std::uint16_t (*round)(float) = t == KvType::kF16 ? fp32_to_fp16 : fp32_to_bf16;
    for (float x : prob.k_data()) k16.push_back(round(x));
    for (float x : prob.v_data()) v16.push_back(round(x));
  }
  AttentionProblem half() const {
    AttentionProblem p = prob.problem();
    p.k.data = nullptr;
    p.v.data = nullptr;
    p.half = HalfKv{type, k16.data(), v16.data()};
    return p;
  }
};

struct Shape {
  index_t hq, hkv, nq, nk, d, dv;
  double logit_scale;
};

std::vector<Shape> shapes() {
  return {
      {1, 1, 1, 1, 64, 64, 1},      // one key
      {3, 1, 1, 17, 3, 3, 1},       // G = 3, D below one vector
      {9, 3, 1, 1000, 64, 64, 1},   // SmolLM2's decode step
      {8, 2, 1, 300, 59, 59, 1},    // G = 4, odd D (vector and scalar tails)
      {4, 4, 1, 257, 127, 127, 1},  // G = 1, D = 127
      {6, 2, 2, 1, 16, 16, 1},      // Nq > Nk: row 0 sees no key
      {2, 1, 1, 333, 64, 33, 100},  // huge logits, Dk != Dv
      {16, 2, 1, 200, 32, 32, 1},   // G = 8: one wide pass (AVX-512), passes of 3 (AVX2)
      {9, 1, 1, 600, 192, 128, 1},  // an MLA decode step: 9 heads over one latent head
      {13, 1, 1, 100, 70, 37, 30},  // two wide passes (6 + 7 rows), D and Dv tails, large logits
      {4, 2, 40, 90, 24, 24, 1},    // a prefill block: query lanes
  };
}

TEST(ExactHalfKv, FlashReadsHalvesAsTheirFloatValuesOnEveryPath) {
  std::uint64_t seed = test::base_seed() + 2600;
  for (KvType t : {KvType::kF16, KvType::kBf16})
    for (const Shape& s : shapes())
      for (CpuPath path : runnable_cpu_paths())
        for (const char* spec : {"exact.flash", "exact.flash(split_kv=3,block_k=13)"}) {
          const CpuPathScope scope(path);
          SCOPED_TRACE(fmt::format("{} {} {} Hq={} Hkv={} Nq={} Nk={} D={} Dv={} x{}", spec, to_string(t),
                                   cpu_path_name(path), s.hq, s.hkv, s.nq, s.nk, s.d, s.dv, s.logit_scale));
          ProblemConfig cfg;
          cfg.heads = s.hq;
          cfg.kv_heads = s.hkv;
          cfg.n = s.nq;
          cfg.n_kv = s.nk;
          cfg.d = s.d;
          cfg.dv = s.dv;
          cfg.causal = Causal::kBottomRight;
          cfg.logit_scale = s.logit_scale;
          cfg.layout = Layout::kBNHD;  // a KV cache's [position, head, dim] rows
          cfg.seed = seed++;
          HalfProblem hp(cfg, t);
          hp.prob.set_lse(true);
          const auto m = create_method(spec);
          const ExecContext ctx{2};
          const AttentionProblem half = hp.half();
          m->run(half, ctx);
          const std::vector<float> out_half = hp.prob.out_data();

          // The same kernels on the widened copy: the same float32 values, the same arithmetic.
          const WidenedKv w = widen_kv(half);
          m->run(w.problem, ctx);
          // (The portable path's lane loops are left to the compiler, whose FMA contraction may
          // differ between element types: there the reference check below is the test.)
          if (path != CpuPath::kPortable)
            EXPECT_EQ(std::memcmp(out_half.data(), hp.prob.out_data().data(), out_half.size() * sizeof(float)), 0);

          // Against float64 on the rounded values.
          const ReferenceRows ref = reference_sample(w.problem, s.nq * s.hq, cfg.seed + 1, ctx);
          const ErrorMetrics e = compare_with_reference(w.problem, ref);
          const ExactTolerance tol = exact_f32_tolerance(e.logit_magnitude);
          EXPECT_TRUE(e.finite);
          EXPECT_LE(e.max_scaled_error, tol.max_scaled_error);
          EXPECT_LE(e.rel_fro_error, tol.rel_fro_error);
          EXPECT_LE(e.lse_max_abs_error, tol.lse_max_abs_error);
        }
}

// sparse.window reads the band through exact.flash and a float32 copy of the sink rows only:
// bitwise the method on the widened copy; and it reads band ∪ sinks (kv_rows_read).
TEST(ExactHalfKv, WindowReadsItsBandAndSinksFromHalves) {
  std::uint64_t seed = test::base_seed() + 2700;
  for (KvType t : {KvType::kF16, KvType::kBf16})
    for (index_t nk : {1, 6, 200}) {
      SCOPED_TRACE(fmt::format("{} Nk={}", to_string(t), nk));
      ProblemConfig cfg;
      cfg.heads = 6;
      cfg.kv_heads = 2;
      cfg.n = 1;
      cfg.n_kv = nk;
      cfg.d = 40;
      cfg.causal = Causal::kBottomRight;
      cfg.layout = Layout::kBNHD;
      cfg.seed = seed++;
      HalfProblem hp(cfg, t);
      const auto m = create_method("sparse.window(left=20,sinks=3)");
      const ExecContext ctx{2};
      m->run(hp.half(), ctx);
      const std::vector<float> out_half = hp.prob.out_data();
      const WidenedKv w = widen_kv(hp.half());
      m->run(w.problem, ctx);
      EXPECT_EQ(std::memcmp(out_half.data(), hp.prob.out_data().data(), out_half.size() * sizeof(float)), 0);
      EXPECT_EQ(kv_rows_read(*m, w.problem, 0), std::min<index_t>(nk, 21 + 3));
      EXPECT_EQ(kv_rows_read(*create_method("exact.flash"), w.problem, 0), nk);
    }
}

TEST(ExactHalfKv, MethodsThatReadFloat32RefuseHalves) {
  ProblemConfig cfg;
  cfg.heads = 2;
  cfg.kv_heads = 1;
  cfg.n = 1;
  cfg.n_kv = 20;
  cfg.d = 8;
  HalfProblem hp(cfg, KvType::kF16);
  const AttentionProblem half = hp.half();
  const auto naive = create_method("exact.naive");
  const Status s = naive->can_run(half);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.reason().find("cannot read f16"), std::string::npos) << s.reason();
  EXPECT_THROW(naive->run(half, ExecContext{1}), Error);
  EXPECT_TRUE(create_method("exact.flash")->can_run(half).is_ok());
}

TEST(ExactHalfKv, InfiniteHalfKeyIsRefusedByName) {
  ProblemConfig cfg;
  cfg.heads = 3;
  cfg.kv_heads = 1;
  cfg.n = 1;
  cfg.n_kv = 50;
  cfg.d = 16;
  cfg.causal = Causal::kBottomRight;
  cfg.layout = Layout::kBNHD;
  HalfProblem hp(cfg, KvType::kF16);
  hp.k16[7 * 16 + 3] = 0x7c00;  // +inf at key 7, dim 3
  try {
    create_method("exact.flash")->run(hp.half(), ExecContext{1});
    FAIL() << "no error";
  } catch (const NonFiniteInput& e) {
    EXPECT_EQ(e.tensor(), "k");
    EXPECT_EQ(e.index(), (std::vector<index_t>{0, 0, 7, 3}));
  }
}

TEST(ExactHalfKv, KvTypesParseAndRefuseOthers) {
  for (KvType t : {KvType::kF32, KvType::kF16, KvType::kBf16}) EXPECT_EQ(parse_kv_type(to_string(t)), t);
  EXPECT_EQ(kv_type_bytes(KvType::kF16), 2);
  EXPECT_EQ(kv_type_bytes(KvType::kF32), 4);
  try {
    parse_kv_type("f8");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f16, bf16, f32"), std::string::npos) << e.what();
  }
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
