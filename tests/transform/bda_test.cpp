// BDA transform and fused BD projection: float32 accuracy against the float64 reference with a
// κ-scaled tolerance (docs/bd.md), RoPE refusal, biases, GQA/MQA sharing, dense fallback,
// bit-exact integer construction through the float32 kernel, BD apply = dense apply.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "numattn/core/blas.h"
#include "numattn/core/error.h"
#include "numattn/core/rng.h"
#include "numattn/transform/bda.h"
#include "numattn/transform/bda_eval.h"
#include "support/test_util.h"

namespace numattn::transform {
namespace {
namespace NUMATTN_UNITY_ID {

using decomp::BasisStrategy;
using decomp::MatrixXd;

/// Tolerance of BDA in float32 (docs/bd.md): rel. error of logits and of the layer output
/// ≤ kBdaC · u · max(κ_max, 1), u = float32 unit roundoff.
constexpr double kBdaC = 8.0;
constexpr double kInf = std::numeric_limits<double>::infinity();

double bound(double kappa) { return kBdaC * test::kEpsF32 * std::max(1.0, kappa); }

struct Shape {
  index_t d, dkv, heads, kv_heads, dh;
  const char* name;
};

TEST(Bda, Float32AgainstFloat64ReferenceWithKappaTolerance) {
  const Shape shapes[] = {{128, 0, 8, 8, 16, "MHA"},
                          {128, 0, 8, 2, 16, "GQA"},
                          {96, 0, 6, 1, 16, "MQA"},
                          {192, 64, 4, 4, 16, "latent d_kv=64"}};
  ExecContext ctx{2};
  for (const Shape& s : shapes) {
    for (BasisStrategy st : {BasisStrategy::kMaxMin, BasisStrategy::kResidualMin, BasisStrategy::kFirst}) {
      const RandomLayer rl = random_layer(s.d, s.dkv, s.heads, s.kv_heads, s.dh, false, test::base_seed());
      BdaOptions opt;
      opt.pairs = BdaPairs::kQKVO;
      opt.strategy = st;
      opt.kappa_threshold = kInf;
      const BdaLayer L = bda_transform(rl.view(), opt);
      const BdaAccuracy a = evaluate_bda(rl.view(), L, 64, test::base_seed() + 1, ctx);
      const std::string tag = std::string(s.name) + "/" + decomp::to_string(st);
      EXPECT_LE(a.out_err_bda, bound(a.kappa_max)) << tag << " κ=" << a.kappa_max;
      EXPECT_LE(a.logit_err_bda, bound(L.qk.kappa_max)) << tag << " κ_qk=" << L.qk.kappa_max;
      EXPECT_LE(a.out_err_plain, bound(1)) << tag;
      // Parameter saving: dh·dh per KV head and pair.
      EXPECT_EQ(L.params_before - L.params_after, 2 * s.kv_heads * s.dh * s.dh) << tag;
      RecordProperty(tag + "_ratio", std::to_string(a.out_err_bda / (test::kEpsF32 * a.kappa_max)));
    }
  }
}

TEST(Bda, RefusesQkWithRope) {
  const RandomLayer rl = random_layer(64, 0, 4, 2, 16, false, 1);
  AttentionLayerWeights w = rl.view();
  w.rope_dims = 16;
  BdaOptions opt;
  for (BdaPairs p : {BdaPairs::kQK, BdaPairs::kQKVO}) {
    opt.pairs = p;
    try {
      bda_transform(w, opt);
      ADD_FAILURE() << "QK with RoPE must be refused";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("RoPE"), std::string::npos) << e.what();
    }
  }
  w.rope_dims = 8;  // partial rotary is refused as well
  opt.pairs = BdaPairs::kQK;
  EXPECT_THROW(bda_transform(w, opt), Error);
  // VO never carries RoPE.
  w.rope_dims = 16;
  opt.pairs = BdaPairs::kVO;
  const BdaLayer L = bda_transform(w, opt);
  EXPECT_TRUE(L.vo.applied);
  EXPECT_FALSE(L.qk.applied);
  EXPECT_FALSE(L.k_proj.is_bd());
  EXPECT_THROW(parse_bda_pairs("kv"), Error);
}

TEST(Bda, BiasIdentities) {
  ExecContext ctx{2};
  const RandomLayer rl = random_layer(96, 0, 6, 2, 16, true, test::base_seed() + 5);
  for (KeyBias kb : {KeyBias::kDrop, KeyBias::kTransform}) {
    for (ValueBias vb : {ValueBias::kFoldIntoOutput, ValueBias::kTransform}) {
      BdaOptions opt;
      opt.pairs = BdaPairs::kQKVO;
      opt.key_bias = kb;
      opt.value_bias = vb;
      opt.kappa_threshold = kInf;
      const BdaLayer L = bda_transform(rl.view(), opt);
      EXPECT_EQ(L.key_bias_dropped, kb == KeyBias::kDrop);
      const BdaAccuracy a = evaluate_bda(rl.view(), L, 48, 3, ctx);
      EXPECT_LE(a.out_err_bda, bound(a.kappa_max))
          << "key bias " << static_cast<int>(kb) << " value bias " << static_cast<int>(vb);
      EXPECT_LE(a.logit_err_bda, bound(a.kappa_max));
      EXPECT_EQ(L.bo.size(), static_cast<std::size_t>(96));
      EXPECT_EQ(L.bq.size(), static_cast<std::size_t>(96));
    }
  }
}

TEST(Bda, GqaAndMqaShareOneBasisPerKvHead) {
  for (index_t g : {index_t{1}, index_t{2}, index_t{8}}) {
    const index_t d = 128, H = 8, dh = 16;
    const RandomLayer rl = random_layer(d, 0, H, g, dh, false, 7);
    BdaOptions opt;
    opt.pairs = BdaPairs::kQKVO;
    opt.kappa_threshold = kInf;
    const BdaLayer L = bda_transform(rl.view(), opt);
    EXPECT_EQ(L.k_proj.out_dim(), g * dh);
    EXPECT_EQ(L.v_proj.out_dim(), g * dh);
    EXPECT_EQ(static_cast<index_t>(L.qk.heads.size()), g);
    EXPECT_EQ(static_cast<index_t>(L.vo.heads.size()), g);
    EXPECT_EQ(L.k_proj.weight_params(), (d - dh) * g * dh);  // one GEMM, inner dim d − dh
    EXPECT_EQ(L.wq.size(), rl.wq.size());                     // Q and O keep their size
    EXPECT_EQ(L.wo.size(), rl.wo.size());
    EXPECT_EQ(L.qk.basis.size(), static_cast<std::size_t>(dh));
    // Every query head of a group multiplies by its KV head's basis block: Q'_j = Q_j·W_k^g[S,:]ᵀ.
    const index_t group = H / g;
    for (index_t j = 0; j < H; ++j) {
      const index_t kv = j / group;
      for (index_t a = 0; a < dh; ++a) {
        double want = 0;
        for (index_t b = 0; b < dh; ++b)
          want += static_cast<double>(rl.wq[static_cast<std::size_t>(0 * H * dh + j * dh + b)]) *
                  rl.wk[static_cast<std::size_t>(L.qk.basis[static_cast<std::size_t>(a)] * g * dh + kv * dh + b)];
        EXPECT_NEAR(L.wq[static_cast<std::size_t>(j * dh + a)], want, 1e-5);
      }
    }
    const BdaAccuracy acc = evaluate_bda(rl.view(), L, 32, 9, ExecContext{1});
    EXPECT_LE(acc.out_err_bda, bound(acc.kappa_max)) << "kv_heads " << g;
  }
}

// Makes KV head `bad` of W_k nearly singular on the first dh input channels: rows 1..dh−1
// become row 0 plus 3e-6 times other (independent) rows, κ ≈ 1e5–1e6.
void make_first_block_near_singular(RandomLayer& rl, index_t bad) {
  const index_t gd = rl.kv_heads * rl.head_dim;
  for (index_t i = 1; i < rl.head_dim; ++i)
    for (index_t j = 0; j < rl.head_dim; ++j) {
      const std::size_t col = static_cast<std::size_t>(bad * rl.head_dim + j);
      rl.wk[static_cast<std::size_t>(i * gd) + col] =
          rl.wk[col] + 3e-6f * rl.wk[static_cast<std::size_t>((rl.head_dim + i) * gd) + col];
    }
}

TEST(Bda, IllConditionedHeadFallsBackToDense) {
  ExecContext ctx{2};
  RandomLayer rl = random_layer(128, 0, 8, 4, 16, false, test::base_seed() + 9);
  make_first_block_near_singular(rl, 1);
  BdaOptions opt;
  opt.pairs = BdaPairs::kQK;
  opt.strategy = BasisStrategy::kFirst;  // forces the bad block
  opt.kappa_threshold = kInf;
  const BdaLayer bad = bda_transform(rl.view(), opt);
  EXPECT_GT(bad.qk.heads[1].kappa, 1e5);
  const BdaAccuracy abad = evaluate_bda(rl.view(), bad, 48, 1, ctx);

  opt.kappa_threshold = 1e4;
  const BdaLayer fb = bda_transform(rl.view(), opt);
  EXPECT_TRUE(fb.qk.heads[1].dense);
  EXPECT_TRUE(fb.k_proj.head_dense(1));
  EXPECT_EQ(fb.qk.fallback_heads, 1);
  for (index_t g : {0, 2, 3}) EXPECT_FALSE(fb.qk.heads[static_cast<std::size_t>(g)].dense);
  const BdaAccuracy afb = evaluate_bda(rl.view(), fb, 48, 1, ctx);
  EXPECT_LE(afb.logit_err_bda, bound(fb.qk.kappa_max));
  EXPECT_LE(afb.out_err_bda, bound(fb.qk.kappa_max));
  EXPECT_LT(afb.logit_err_bda * 10, abad.logit_err_bda) << "fallback must beat the bad block";
  // Query heads 2 and 3 (group of KV head 1) keep their dense W_q.
  for (std::size_t i = 0; i < rl.wq.size(); ++i) {
    const index_t col = static_cast<index_t>(i) % (8 * 16);
    if (col / 16 == 2 || col / 16 == 3) ASSERT_EQ(fb.wq[i], rl.wq[i]);
  }
  // Mixed heads by threshold: every head dense at threshold 0 equals the plain layer.
  opt.kappa_threshold = 0;
  opt.pairs = BdaPairs::kQKVO;
  const BdaLayer all = bda_transform(rl.view(), opt);
  EXPECT_EQ(all.qk.fallback_heads, 4);
  EXPECT_EQ(all.vo.fallback_heads, 4);
  const BdaAccuracy aall = evaluate_bda(rl.view(), all, 48, 1, ctx);
  EXPECT_LE(aall.out_err_bda, bound(1));
}

TEST(BdProjection, ApplyThroughBdEqualsDenseApply) {
  const index_t d = 80, H = 5, dh = 8, n = 37;
  std::vector<double> w64(static_cast<std::size_t>(d * H * dh));
  fill_normal(w64, test::base_seed(), 3);
  const MatrixXd w = Eigen::Map<MatrixXd>(w64.data(), d, H * dh);
  std::vector<double> b(static_cast<std::size_t>(H * dh));
  fill_normal(b, test::base_seed(), 4);
  std::vector<float> x(static_cast<std::size_t>(n * d));
  fill_normal(x, test::base_seed(), 5);
  std::vector<BdHeadReport> rep;
  std::vector<MatrixXd> blocks;
  BdProjection p = build_bd_projection(d, H, dh, w, b, BasisStrategy::kMaxMin, kInf, &rep, &blocks);
  ASSERT_TRUE(p.is_bd());
  EXPECT_EQ(p.macs_per_token(), (d - dh) * H * dh);
  for (index_t rows : {index_t{0}, index_t{5}}) {
    p.set_block_rows(rows);
    std::vector<float> y(static_cast<std::size_t>(n * H * dh)), yp(y.size());
    p.project(x.data(), n, d, y.data(), H * dh, InputOrder::kOriginal, ExecContext{2});
    // Pre-permuted input (the offline permutation) gives the same bits.
    std::vector<float> xp(x.size());
    for (index_t t = 0; t < n; ++t)
      for (index_t k = 0; k < d; ++k)
        xp[static_cast<std::size_t>(t * d + k)] =
            x[static_cast<std::size_t>(t * d + p.permutation()[static_cast<std::size_t>(k)])];
    p.project(xp.data(), n, d, yp.data(), H * dh, InputOrder::kPermuted, ExecContext{2});
    EXPECT_EQ(0, std::memcmp(y.data(), yp.data(), sizeof(float) * y.size()));
    // Y'_h·W_h[S,:] = X·W_h + b_h (float64 check of the float32 kernel).
    double num = 0, den = 0;
    for (index_t t = 0; t < n; ++t)
      for (index_t h = 0; h < H; ++h) {
        Eigen::RowVectorXd yh(dh), ref(dh);
        for (index_t j = 0; j < dh; ++j) {
          yh(j) = y[static_cast<std::size_t>(t * H * dh + h * dh + j)];
          double acc = b[static_cast<std::size_t>(h * dh + j)];
          for (index_t k = 0; k < d; ++k) acc += x[static_cast<std::size_t>(t * d + k)] * w(k, h * dh + j);
          ref(j) = acc;
        }
        num += (yh * blocks[static_cast<std::size_t>(h)] - ref).squaredNorm();
        den += ref.squaredNorm();
      }
    double kmax = 1;
    for (const auto& r : rep) kmax = std::max(kmax, r.kappa);
    EXPECT_LE(std::sqrt(num / den), bound(kmax));
  }
  // effective_weight(): X·W_eff + b' equals the kernel (mixed heads: threshold between κs).
  {
    std::vector<double> ks;
    for (const auto& r : rep) ks.push_back(r.kappa);
    std::sort(ks.begin(), ks.end());
    BdProjection mixed = build_bd_projection(d, H, dh, w, b, BasisStrategy::kMaxMin, ks[2]);
    EXPECT_GT(mixed.dense_head_count(), 0);
    EXPECT_LT(mixed.dense_head_count(), H);
    const std::vector<float> weff = mixed.effective_weight();
    std::vector<float> y(static_cast<std::size_t>(n * H * dh));
    mixed.project(x.data(), n, d, y.data(), H * dh, InputOrder::kOriginal, ExecContext{1});
    std::vector<float> zeros(static_cast<std::size_t>(n * d), 0.f), bias_only(y.size());
    mixed.project(zeros.data(), n, d, bias_only.data(), H * dh, InputOrder::kOriginal, ExecContext{1});
    for (index_t t = 0; t < n; ++t)
      for (index_t c = 0; c < H * dh; ++c) {
        double acc = bias_only[static_cast<std::size_t>(t * H * dh + c)];
        for (index_t k = 0; k < d; ++k)
          acc += static_cast<double>(x[static_cast<std::size_t>(t * d + k)]) * weff[static_cast<std::size_t>(k * H * dh + c)];
        ASSERT_NEAR(y[static_cast<std::size_t>(t * H * dh + c)], acc, 1e-3 * (1 + std::abs(acc)));
      }
  }
  // All heads dense (threshold 0): the kernel computes X·W + b itself.
  BdProjection dense_all = build_bd_projection(d, H, dh, w, b, BasisStrategy::kMaxMin, 0.0);
  EXPECT_EQ(dense_all.dense_head_count(), H);
  std::vector<float> w32(w64.begin(), w64.end()), b32(b.begin(), b.end());
  BdProjection plain = BdProjection::dense(d, H, dh, w32, b32);
  std::vector<float> y1(static_cast<std::size_t>(n * H * dh)), y2(y1.size());
  dense_all.project(x.data(), n, d, y1.data(), H * dh, InputOrder::kOriginal, ExecContext{1});
  plain.project(x.data(), n, d, y2.data(), H * dh, InputOrder::kOriginal, ExecContext{1});
  for (std::size_t i = 0; i < y1.size(); ++i)
    ASSERT_NEAR(y1[i], y2[i], 1e-4 * (1 + std::abs(y2[i]))) << i;
}

// The integer construction through the float32 transform and kernel: W_k^g = [L_g; D_g·L_g] with
// small integers, S = first dh; all products are integers below 2^24, so BDA logits equal MHA
// logits bit for bit in float32 too.
TEST(Bda, BitExactIntegerLayerInFloat32) {
  const index_t d = 20, H = 4, G = 2, dh = 4, n = 9;
  CounterRng rng(test::base_seed(), 123);
  std::uint64_t ctr = 0;
  auto si = [&](int lo, int hi) {
    return static_cast<float>(lo + static_cast<int>(rng.uniform(ctr++) * (hi - lo + 1)));
  };
  RandomLayer rl = random_layer(d, 0, H, G, dh, false, 1);
  for (auto& v : rl.wq) v = si(-2, 2);
  for (auto& v : rl.wv) v = si(-2, 2);
  for (auto& v : rl.wo) v = si(-2, 2);
  const index_t gd = G * dh;
  for (index_t g = 0; g < G; ++g) {
    MatrixXd l = MatrixXd::Identity(dh, dh), dm(d - dh, dh);
    for (index_t i = 0; i < dh; ++i)
      for (index_t j = 0; j < i; ++j) l(i, j) = si(-1, 1);
    for (index_t i = 0; i < d - dh; ++i)
      for (index_t j = 0; j < dh; ++j) dm(i, j) = si(-1, 1);
    const MatrixXd rest = dm * l;
    for (index_t i = 0; i < d; ++i)
      for (index_t j = 0; j < dh; ++j)
        rl.wk[static_cast<std::size_t>(i * gd + g * dh + j)] =
            static_cast<float>(i < dh ? l(i, j) : rest(i - dh, j));
  }
  BdaOptions opt;
  opt.pairs = BdaPairs::kQK;
  opt.strategy = BasisStrategy::kFirst;
  opt.kappa_threshold = kInf;
  const BdaLayer L = bda_transform(rl.view(), opt);
  std::vector<float> x(static_cast<std::size_t>(n * d));
  for (auto& v : x) v = si(-3, 3);
  auto mm = [&](const std::vector<float>& a, index_t m, index_t k, const float* b, index_t nn) {
    std::vector<float> c(static_cast<std::size_t>(m * nn));
    blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, m, nn, k, 1.f, a.data(), k, b, nn, 0.f, c.data(), nn);
    return c;
  };
  const auto q = mm(x, n, d, rl.wq.data(), H * dh), k = mm(x, n, d, rl.wk.data(), gd);
  const auto qp = mm(x, n, d, L.wq.data(), H * dh);
  std::vector<float> kp(static_cast<std::size_t>(n * gd));
  L.k_proj.project(x.data(), n, d, kp.data(), gd, InputOrder::kOriginal, ExecContext{1});
  for (index_t j = 0; j < H; ++j) {
    const index_t g = j / (H / G);
    for (index_t a = 0; a < n; ++a)
      for (index_t b = 0; b < n; ++b) {
        float mha = 0, bda = 0;
        for (index_t t = 0; t < dh; ++t) {
          mha += q[static_cast<std::size_t>(a * H * dh + j * dh + t)] * k[static_cast<std::size_t>(b * gd + g * dh + t)];
          bda += qp[static_cast<std::size_t>(a * H * dh + j * dh + t)] * kp[static_cast<std::size_t>(b * gd + g * dh + t)];
        }
        ASSERT_EQ(mha, bda) << "head " << j << " (" << a << "," << b << ")";
      }
  }
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn::transform

namespace numattn::transform {
namespace {
namespace NUMATTN_UNITY_ID {

// The [out, in] layout (GGUF / PyTorch, what model/llama.h stores) gives the same rewrite.
TEST(Bda, OutInLayoutMatchesInOut) {
  const index_t d = 64, H = 4, G = 2, dh = 8;
  const RandomLayer rl = random_layer(d, 0, H, G, dh, true, 21);
  auto transpose = [](const std::vector<float>& a, index_t rows, index_t cols) {
    std::vector<float> t(a.size());
    for (index_t i = 0; i < rows; ++i)
      for (index_t j = 0; j < cols; ++j)
        t[static_cast<std::size_t>(j * rows + i)] = a[static_cast<std::size_t>(i * cols + j)];
    return t;
  };
  const auto wq = transpose(rl.wq, d, H * dh), wk = transpose(rl.wk, d, G * dh),
             wv = transpose(rl.wv, d, G * dh), wo = transpose(rl.wo, H * dh, d);
  AttentionLayerWeights oi = rl.view();
  oi.layout = WeightLayout::kOutIn;
  oi.wq = wq;
  oi.wk = wk;
  oi.wv = wv;
  oi.wo = wo;
  BdaOptions opt;
  opt.pairs = BdaPairs::kQKVO;
  const BdaLayer a = bda_transform(rl.view(), opt), b = bda_transform(oi, opt);
  EXPECT_EQ(transpose(a.wq, d, H * dh), b.wq);
  EXPECT_EQ(transpose(a.wo, H * dh, d), b.wo);
  EXPECT_EQ(a.k_proj.effective_weight(), b.k_proj.effective_weight());
  EXPECT_EQ(a.v_proj.effective_weight(), b.v_proj.effective_weight());
  EXPECT_EQ(a.bo, b.bo);
  EXPECT_EQ(a.qk.basis, b.qk.basis);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn::transform

namespace numattn::transform {
namespace {
namespace NUMATTN_UNITY_ID {

// The default model's shape (SmolLM2-135M: d 576, 9 query heads, 3 KV heads, dh 64, full RoPE):
// only "vo" is allowed, and it is accurate to the κ tolerance.
TEST(Bda, SmolLmShapeVoOnly) {
  const RandomLayer rl = random_layer(576, 0, 9, 3, 64, false, test::base_seed() + 3);
  AttentionLayerWeights w = rl.view();
  w.rope_dims = 64;
  BdaOptions opt;
  opt.pairs = parse_bda_pairs("qkvo");
  EXPECT_THROW(bda_transform(w, opt), Error);
  opt.pairs = parse_bda_pairs("vo");
  const BdaLayer L = bda_transform(w, opt);
  EXPECT_EQ(L.vo.fallback_heads, 0);
  EXPECT_EQ(L.params_before - L.params_after, 3 * 64 * 64);
  const BdaAccuracy a = evaluate_bda(rl.view(), L, 64, 5, ExecContext{2});
  EXPECT_LE(a.out_err_bda, bound(a.kappa_max)) << "κ_vo " << L.vo.kappa_max;
  // QK untouched: the same logits up to float32 rounding (the BD-projected keys may go through
  // another kernel than the dense ones, and BLAS kernels round differently between CPUs).
  EXPECT_NEAR(a.logit_err_bda, a.logit_err_plain, 1e-6);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn::transform
