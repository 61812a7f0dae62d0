// MLA layers in the model runner (model/mla_model.h): the float64 executions agree, the float32
// path follows them, the model's prefill/decode and cache work, and an exact GQA→MLA merge
// written out here reproduces the GQA model.
#include "numattn/model/mla_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "numattn/attention/registry.h"
#include "numattn/core/error.h"
#include "numattn/core/rng.h"
#include "numattn/model/bda_model.h"
#include "numattn/model/gguf.h"
#include "numattn/model/llama.h"
#include "numattn/model/mla_convert.h"
#include "support/test_util.h"
#include "support/tiny_llama.h"

namespace numattn {
namespace {

struct MlaShape {
  std::int64_t E, H, r, dn, dr, dv;
};

std::vector<double> randd(std::size_t n, std::uint64_t stream, double scale) {
  std::vector<double> v(n);
  fill_normal(v, 4321, stream);
  for (double& x : v) x *= scale;
  return v;
}

MlaLayerWeights random_mla(const MlaShape& s, std::uint64_t seed) {
  MlaLayerWeights w;
  w.n_head = s.H;
  w.rank = s.r;
  w.d_nope = s.dn;
  w.d_rope = s.dr;
  w.d_v = s.dv;
  w.softmax_scale = 1.0 / std::sqrt(static_cast<double>(std::max<std::int64_t>(1, s.dn + s.dr)));
  for (std::int64_t j = 0; j < s.dr / 2; ++j)
    w.rope_theta.push_back(std::pow(10000.0, -2.0 * static_cast<double>(j) / static_cast<double>(s.dr)));
  const double se = 1.5 / std::sqrt(static_cast<double>(s.E)), sr = 1.0 / std::sqrt(static_cast<double>(s.r));
  auto n = [](std::int64_t a, std::int64_t b) { return static_cast<std::size_t>(a * b); };
  w.w_dkv = randd(n(s.r, s.E), seed * 10 + 0, se);
  w.w_kr = randd(n(s.dr, s.E), seed * 10 + 1, se);
  w.w_q_nope = randd(n(s.H * s.dn, s.E), seed * 10 + 2, se);
  w.w_q_rope = randd(n(s.H * s.dr, s.E), seed * 10 + 3, se);
  w.w_uk = randd(n(s.H * s.dn, s.r), seed * 10 + 4, 2 * sr);
  w.w_uv = randd(n(s.H * s.dv, s.r), seed * 10 + 5, sr);
  return w;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

const std::vector<MlaShape> kShapes = {
    {32, 4, 12, 6, 4, 8},   // even sizes
    {13, 3, 5, 3, 2, 7},    // odd sizes, d_v != d_nope + d_rope
    {16, 2, 7, 0, 6, 5},    // no NoPE part (all positional)
    {16, 5, 9, 4, 0, 3},    // no RoPE part (DeepSeek without decoupled key)
};

// Identity of model/mla.h's two executions, in float64 (issue 11 acceptance: 1e-12).
TEST(MlaModel, AbsorbedEqualsNaiveInFloat64) {
  for (const MlaShape& s : kShapes) {
    const MlaLayerWeights w = random_mla(s, 1);
    const std::int64_t n = 11, p0 = 37;
    const std::vector<double> xn = randd(static_cast<std::size_t>(n * s.E), 99, 1.0);
    const auto a = mla_attention_f64(w, xn, n, s.E, p0, MlaExec::kNaive);
    const auto b = mla_attention_f64(w, xn, n, s.E, p0, MlaExec::kAbsorbed);
    double err = 0;
    for (std::size_t i = 0; i < a.size(); ++i) err = std::max(err, std::abs(a[i] - b[i]));
    EXPECT_LE(err, 1e-12 * max_abs(a)) << "E=" << s.E << " H=" << s.H << " r=" << s.r;
    EXPECT_GT(max_abs(a), 0.1);
  }
}

// The float32 path the model runs (projections, RoPE, cache rows, the attention method with
// Dk != Dv and MQA over the latent, W_uv) against the float64 transcription. Tolerance
// (docs/numerics.md): max abs error <= 2e-5 · max |ref| for these O(1) sizes.
TEST(MlaModel, Float32PathsFollowFloat64) {
  const auto method = create_method("exact.flash");
  for (const MlaShape& s : kShapes) {
    const MlaLayerWeights w = random_mla(s, 2);
    const MlaLayer L = MlaLayer::from_weights(w, s.E);
    // The float64 reference gets the float32-rounded weights, so only the arithmetic differs.
    const MlaLayerWeights w32 = L.to_weights(s.E);
    const std::int64_t n = 9, p0 = 1000;
    const std::vector<double> xd = randd(static_cast<std::size_t>(n * s.E), 7, 1.0);
    std::vector<float> xf(xd.begin(), xd.end());
    const std::vector<double> xr(xf.begin(), xf.end());
    for (MlaExec e : {MlaExec::kNaive, MlaExec::kAbsorbed}) {
      const auto ref = mla_attention_f64(w32, xr, n, s.E, p0, e);
      const auto got = mla_attention_f32(L, xf, n, s.E, p0, e, *method, ExecContext{2});
      ASSERT_EQ(got.size(), ref.size());
      double err = 0;
      for (std::size_t i = 0; i < ref.size(); ++i) err = std::max(err, std::abs(got[i] - ref[i]));
      EXPECT_LE(err, 2e-5 * max_abs(ref)) << to_string(e) << " E=" << s.E << " r=" << s.r;
    }
  }
}

TEST(MlaModel, RefusesInconsistentWeights) {
  const MlaShape s{16, 2, 6, 4, 4, 4};
  MlaLayerWeights w = random_mla(s, 3);
  EXPECT_NO_THROW(validate_mla_weights(w, 16, "t"));
  EXPECT_THROW(validate_mla_weights(w, 17, "t"), Error);  // wrong model width
  MlaLayerWeights odd = w;
  odd.d_rope = 3;
  EXPECT_THROW(validate_mla_weights(odd, 16, "t"), Error);
  MlaLayerWeights bad = w;
  bad.w_uv[5] = NAN;
  EXPECT_THROW(validate_mla_weights(bad, 16, "t"), Error);
  MlaLayerWeights scale = w;
  scale.softmax_scale = 0;
  EXPECT_THROW(validate_mla_weights(scale, 16, "t"), Error);
  MlaLayerWeights theta = w;
  theta.rope_theta.pop_back();
  EXPECT_THROW(MlaLayer::from_weights(theta, 16), Error);
  EXPECT_THROW(parse_mla_exec("fast"), OptionError);
}

// ---- the model ----------------------------------------------------------------------------

LlamaModel tiny_f32(bool tied = false) {
  const test::TinyTensors T = test::make_tiny(tied);
  return LlamaModel::load(test::write_gguf(T, "mla_tiny.gguf"), ExecContext{1}, WeightStorage::kF32);
}

// Every layer of the tiny model replaced by a random MLA layer of shape s (W_o resized).
LlamaModel random_mla_model(const MlaShape& s0) {
  LlamaModel base = tiny_f32();
  LlamaHParams hp = base.hparams();
  LlamaWeights w = base.weights();
  const MlaShape s{hp.n_embd, hp.n_head, s0.r, s0.dn, s0.dr, s0.dv};
  for (std::size_t l = 0; l < w.layers.size(); ++l) {
    LlamaLayer& L = w.layers[l];
    L.wqkv.clear();
    L.mla = std::make_shared<const MlaLayer>(MlaLayer::from_weights(random_mla(s, 10 + l), hp.n_embd));
    std::vector<float> wo(static_cast<std::size_t>(hp.n_embd * hp.n_head * s.dv));
    fill_normal(wo, 5, 100 + l);
    for (float& v : wo) v *= 0.3f;
    L.wo = std::move(wo);
  }
  return LlamaModel(hp, std::move(w));
}

std::vector<std::int32_t> tokens(std::size_t n) {
  std::vector<std::int32_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<std::int32_t>((i * 37 + 11) % 64);
  return t;
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0, s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, static_cast<double>(std::abs(a[i] - b[i])));
    s = std::max(s, static_cast<double>(std::abs(b[i])));
  }
  return m / s;
}

// Token-by-token decoding (Nq = 1 over a growing latent cache) and a chunked prefill
// (Nq = 4 ≠ Nk = 9) give the one-prefill logits, in both executions; naive == absorbed.
TEST(MlaModel, DecodeEqualsPrefillAndExecutionsAgree) {
  for (const MlaShape& s : {MlaShape{0, 0, 12, 6, 4, 8}, MlaShape{0, 0, 5, 3, 2, 7}}) {
    LlamaModel m = random_mla_model(s);
    EXPECT_TRUE(m.has_mla());
    EXPECT_EQ(m.kv_bytes_per_token(), 2 * 4 * (s.r + s.dr));
    const auto toks = tokens(9);
    const std::int64_t V = m.hparams().n_vocab;
    std::vector<float> by_exec[2];
    for (MlaExec e : {MlaExec::kNaive, MlaExec::kAbsorbed}) {
      m.set_mla_exec(e);
      KvCache full = m.make_cache(9);
      EXPECT_EQ(full.bytes_per_token(), m.kv_bytes_per_token());
      const auto ref = m.forward(toks, full, ExecContext{2});
      KvCache c = m.make_cache(9);
      std::vector<float> dec;
      for (std::int32_t t : toks) {
        const auto lg = m.forward({t}, c, ExecContext{1});
        dec.insert(dec.end(), lg.begin(), lg.end());
      }
      EXPECT_LE(rel_diff(dec, ref), 1e-5) << to_string(e);
      KvCache c2 = m.make_cache(9);
      m.forward(std::vector<std::int32_t>(toks.begin(), toks.begin() + 5), c2, ExecContext{1});
      const auto tail = m.forward(std::vector<std::int32_t>(toks.begin() + 5, toks.end()), c2, ExecContext{2});
      EXPECT_LE(rel_diff(tail, std::vector<float>(ref.begin() + 5 * V, ref.end())), 1e-5) << to_string(e);
      by_exec[e == MlaExec::kNaive ? 0 : 1] = ref;
    }
    EXPECT_LE(rel_diff(by_exec[1], by_exec[0]), 1e-5);
    // A GQA cache is refused by the MLA model.
    KvCache gqa(m.hparams(), 9);
    EXPECT_THROW(m.forward(toks, gqa, ExecContext{1}), Error);
  }
}

// The exact GQA→MLA merge (TransMLA step 1 with every RoPE dimension kept in the decoupled
// key), written out independently of transform/mla.h: latent = values (r = Hkv·D), k_rope =
// W_k·xn with each head's RoPE frequencies repeated per KV head (θ = 0 past n_rot), q_rope of
// head h = W_q[h] placed in the block of its group, W_uv[h] = the selector of its group.
// Logits equal the GQA model's to float32 rounding, in both executions.
TEST(MlaModel, ExactMergeReproducesTheGqaModel) {
  LlamaModel g = tiny_f32(true);
  const LlamaHParams hp = g.hparams();
  const std::int64_t E = hp.n_embd, D = hp.head_dim, Hq = hp.n_head, Hkv = hp.n_head_kv;
  LlamaWeights w = g.weights();
  for (LlamaLayer& L : w.layers) {
    MlaLayerWeights m;
    m.n_head = Hq;
    m.rank = Hkv * D;
    m.d_nope = 0;
    m.d_rope = Hkv * D;
    m.d_v = D;
    m.softmax_scale = 1.0 / std::sqrt(static_cast<double>(D));
    for (std::int64_t k = 0; k < Hkv; ++k)
      for (std::int64_t i = 0; i < D / 2; ++i)
        m.rope_theta.push_back(i < hp.n_rot / 2 ? std::pow(hp.rope_base, -2.0 * i / static_cast<double>(hp.n_rot)) : 0.0);
    const float* q = L.wqkv.data();
    const float* k = q + Hq * D * E;
    const float* v = k + Hkv * D * E;
    m.w_dkv.assign(v, v + Hkv * D * E);
    m.w_kr.assign(k, k + Hkv * D * E);
    m.w_q_rope.assign(static_cast<std::size_t>(Hq * Hkv * D * E), 0.0);
    m.w_uv.assign(static_cast<std::size_t>(Hq * D * Hkv * D), 0.0);
    for (std::int64_t h = 0; h < Hq; ++h) {
      const std::int64_t grp = h / (Hq / Hkv);
      std::copy(q + h * D * E, q + (h + 1) * D * E, m.w_q_rope.begin() + (h * Hkv * D + grp * D) * E);
      for (std::int64_t d = 0; d < D; ++d)
        m.w_uv[static_cast<std::size_t>((h * D + d) * Hkv * D + grp * D + d)] = 1.0;
    }
    L.wqkv.clear();
    L.mla = std::make_shared<const MlaLayer>(MlaLayer::from_weights(m, E));
  }
  LlamaModel mla(hp, std::move(w));
  EXPECT_EQ(mla.kv_bytes_per_token(), g.kv_bytes_per_token());
  const auto toks = tokens(20);
  KvCache cg = g.make_cache(20);
  const auto ref = g.forward(toks, cg, ExecContext{2});
  for (MlaExec e : {MlaExec::kNaive, MlaExec::kAbsorbed}) {
    mla.set_mla_exec(e);
    KvCache c = mla.make_cache(20);
    const auto got = mla.forward(toks, c, ExecContext{2});
    EXPECT_LE(rel_diff(got, ref), 1e-5) << to_string(e);
  }
}

// BD Attention on the NoPE QK pair of every MLA layer: the same logits up to float32 rounding
// amplified by κ (docs/bd.md: c·u·κ_max), in both executions and in decode; fewer weights and
// MACs; the VO pair is refused by name.
TEST(MlaModel, BdaQkOnMlaLayersKeepsTheLogits) {
  LlamaModel m = random_mla_model(MlaShape{0, 0, 12, 6, 4, 8});
  const auto toks = tokens(12);
  LlamaModel dense = m;
  LlamaModel refused = m;
  try {
    apply_bda(refused, "vo");
    ADD_FAILURE() << "vo on MLA must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("VO pair"), std::string::npos) << e.what();
  }
  const ModelBdaReport rep = apply_bda(m, "qk");
  EXPECT_EQ(rep.layers.size(), 2u);
  EXPECT_LT(rep.params_after, rep.params_before);
  EXPECT_GT(rep.macs_saved_per_token, 0);
  EXPECT_TRUE(m.weights().layers[0].mla->uk_bd != nullptr);
  EXPECT_THROW(apply_bda(m, "qk"), Error);  // already applied
  const double tol = 64 * 6e-8 * std::max(1.0, rep.kappa_max);
  for (MlaExec e : {MlaExec::kNaive, MlaExec::kAbsorbed}) {
    m.set_mla_exec(e);
    dense.set_mla_exec(e);
    KvCache c1 = m.make_cache(12), c2 = dense.make_cache(12);
    const auto got = m.forward(toks, c1, ExecContext{2});
    const auto ref = dense.forward(toks, c2, ExecContext{2});
    EXPECT_LE(rel_diff(got, ref), tol) << to_string(e) << " kappa_max " << rep.kappa_max;
    // Decode through the BD form (absorbed: q̃ = [q' | C·q'] over the latent cache).
    KvCache c3 = m.make_cache(12);
    std::vector<float> dec;
    for (std::int32_t t : toks) {
      const auto lg = m.forward({t}, c3, ExecContext{1});
      dec.insert(dec.end(), lg.begin(), lg.end());
    }
    EXPECT_LE(rel_diff(dec, ref), tol) << to_string(e);
  }
}

// An MLA model written as a numattn-mla GGUF loads back (both storages) with identical weights
// and bitwise identical logits; hostile MLA metadata is refused by key before any allocation.
TEST(MlaModel, GgufRoundTripAndHostileFiles) {
  const test::TinyTensors T = test::make_tiny(false);
  const std::string src_path = test::write_gguf(T, "mla_src.gguf");
  const GgufFile src = GgufFile::open(src_path);
  LlamaModel m = random_mla_model(MlaShape{0, 0, 7, 3, 4, 8});  // d_v = D = 8: W_o unchanged shape
  transform::MlaOptions opt;
  opt.rank = 7;
  const std::string out = test::temp_path("mla_out.gguf");
  // W_o of the random model is not the source's: write the model's own W_o via a copy that
  // keeps the source W_o (what a conversion does).
  LlamaWeights w = m.weights();
  LlamaModel src_model = LlamaModel::load(src, ExecContext{1});
  for (std::size_t l = 0; l < w.layers.size(); ++l) w.layers[l].wo = src_model.weights().layers[l].wo;
  LlamaModel mm(m.hparams(), std::move(w));
  write_mla_gguf(src, mm, opt, out);
  EXPECT_THROW(write_mla_gguf(src, src_model, opt, test::temp_path("mla_bad.gguf")), Error);  // not MLA
  const GgufFile back_file = GgufFile::open(out);
  EXPECT_EQ(back_file.architecture(), "numattn-mla");
  EXPECT_EQ(back_file.get_int("numattn-mla.mla.kv_lora_rank"), 7);
  const auto toks = tokens(10);
  KvCache c0 = mm.make_cache(10);
  const auto ref = mm.forward(toks, c0, ExecContext{1});
  for (WeightStorage st : {WeightStorage::kF32, WeightStorage::kInPlace}) {
    LlamaModel back = LlamaModel::load(out, ExecContext{1}, st);
    ASSERT_TRUE(back.has_mla());
    for (std::size_t l = 0; l < back.weights().layers.size(); ++l) {
      const MlaLayer& a = *mm.weights().layers[l].mla;
      const MlaLayer& b = *back.weights().layers[l].mla;
      EXPECT_EQ(a.w_in, b.w_in);
      EXPECT_EQ(a.w_uk, b.w_uk);
      EXPECT_EQ(a.w_uv, b.w_uv);
      EXPECT_EQ(a.rope_theta, b.rope_theta);
    }
    KvCache c = back.make_cache(10);
    const auto got = back.forward(toks, c, ExecContext{1});
    if (st == WeightStorage::kF32) {
      EXPECT_EQ(got, ref);
    } else {
      EXPECT_LE(rel_diff(got, ref), 1e-5);  // other weights in place: summation order only
    }
  }
  auto expect_refused = [&](const test::GgufEdit& e, const std::string& what) {
    const std::string bad = test::rewrite_gguf(out, e, "mla_hostile.gguf");
    try {
      LlamaModel::load(bad, ExecContext{1}, WeightStorage::kF32);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find(what), std::string::npos) << err.what();
    }
  };
  expect_refused({{{"numattn-mla.mla.kv_lora_rank", GgufValue::u32(8)}}, {}, {}}, "attn_kv_a_mqa.weight");
  expect_refused({{{"numattn-mla.mla.kv_lora_rank", GgufValue::u32(0)}}, {}, {}}, "kv_lora_rank");
  expect_refused({{{"numattn-mla.mla.rope_dim", GgufValue::u32(3)}}, {}, {}}, "rope_dim");
  expect_refused({{{"numattn-mla.mla.softmax_scale", GgufValue::f64(-1.0)}}, {}, {}}, "softmax_scale");
  expect_refused({{{"numattn-mla.mla.rope_theta.1", GgufValue::array(std::vector<double>{1.0})}}, {}, {}},
                 "rope_theta.1");
  expect_refused({{{"numattn-mla.mla.rope_theta.0", GgufValue::array(std::vector<double>{1.0, NAN})}}, {}, {}},
                 "not finite");
  expect_refused({{}, {}, {"blk.1.attn_kv_b.weight"}}, "attn_kv_b.weight");
}

}  // namespace
}  // namespace numattn
