// MLA layers in the model runner (model/mla_model.h): the float64 executions agree, the float32
// path follows them, the model's prefill/decode and cache work, and an exact GQA→MLA merge
// written out here reproduces the GQA model.
#include "numattn/model/mla_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include "numattn/attention/registry.h"
#include "numattn/core/error.h"
#include "numattn/core/rng.h"
#include "numattn/decomp/dense.h"
#include "numattn/gguf/gguf.h"
#include "numattn/model/bda_model.h"
#include "numattn/model/llama.h"
#include "numattn/model/mla_convert.h"
#include "numattn/quant/quant.h"
#include "support/test_util.h"
#include "support/tiny_llama.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

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

// Identity of arch/mla_weights.h's two executions, in float64: absorbed equals naive within 1e-12.
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

// ---- quantized storage (quantize_mla_layer) ------------------------------------------------

// A layer whose queries are a product through a source W_q (as the conversion makes them):
// W_q_nope[h] = A_h·Ĝ_h and W_q_rope[h] = R_h·Ĝ_h with Ĝ the dequantized source `src`
// [H·D, E], quantized to `src_type` into `bytes`.
struct FactoredLayer {
  MlaLayerWeights w;
  QuantMatrix src;
  std::vector<std::uint8_t> bytes;
};
FactoredLayer factored_mla(const MlaShape& s, std::int64_t D, GgmlType src_type, std::uint64_t seed) {
  FactoredLayer f;
  f.w = random_mla(s, seed);
  std::vector<float> g(static_cast<std::size_t>(s.H * D * s.E));
  fill_normal(g, 77, seed);
  for (float& v : g) v *= static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.E)));
  f.bytes = quantize(src_type, g.data(), static_cast<std::int64_t>(g.size()));
  f.src.append(src_type, f.bytes.data(), s.H * D, s.E);
  const std::vector<float> gh = f.src.dequantize();
  const std::vector<double> a = randd(static_cast<std::size_t>(s.H * (s.dn + s.dr) * D), seed * 10 + 7, 0.5);
  for (std::int64_t h = 0; h < s.H; ++h)
    for (std::int64_t i = 0; i < s.dn + s.dr; ++i)
      for (std::int64_t e = 0; e < s.E; ++e) {
        double acc = 0;
        for (std::int64_t k = 0; k < D; ++k)
          acc += a[static_cast<std::size_t>((h * (s.dn + s.dr) + i) * D + k)] *
                 gh[static_cast<std::size_t>((h * D + k) * s.E + e)];
        if (i < s.dn)
          f.w.w_q_nope[static_cast<std::size_t>((h * s.dn + i) * s.E + e)] = acc;
        else
          f.w.w_q_rope[static_cast<std::size_t>((h * s.dr + i - s.dn) * s.E + e)] = acc;
      }
  return f;
}

// The absorbed execution on quantized storage equals the float64 transcription of the weights
// it multiplies by (MlaLayer::quantized_weights) within the float32 tolerance of
// docs/numerics.md, on every CPU path, for decode-sized (quant_gemv) and prefill-sized (dequantized
// tile + GEMM) blocks; factored and direct query forms; widths that Q8_0's block of 32 does not
// divide fall back to F32 parts.
TEST(MlaModel, QuantizedAbsorbedFollowsFloat64OnItsWeights) {
  const auto method = create_method("exact.flash");
  struct Case {
    MlaShape s;
    std::int64_t D;
    GgmlType big, src;
    bool factored;
  };
  const std::vector<Case> cases = {
      {{64, 3, 32, 48, 16, 32}, 32, GgmlType::Q4_1, GgmlType::Q4_1, true},
      {{64, 3, 32, 48, 16, 32}, 32, GgmlType::Q8_0, GgmlType::Q8_0, false},  // direct (no source)
      {{64, 2, 12, 6, 4, 7}, 16, GgmlType::Q4_0, GgmlType::Q8_0, true},      // q_up, q_uv in F32
      {{40, 3, 5, 3, 2, 7}, 8, GgmlType::Q8_0, GgmlType::F32, true},         // E = 40: F32 everywhere
      {{64, 2, 32, 0, 6, 32}, 32, GgmlType::Q4_1, GgmlType::Q4_1, true},     // no NoPE part
      {{64, 5, 32, 4, 0, 3}, 32, GgmlType::Q8_0, GgmlType::Q4_1, true},      // no RoPE part
  };
  for (const Case& c : cases) {
    const FactoredLayer f = factored_mla(c.s, c.D, c.src, 3);
    MlaLayer L = MlaLayer::from_weights(f.w, c.s.E);
    quantize_mla_layer(L, c.s.E, c.big, GgmlType::Q8_0, c.factored ? &f.src : nullptr);
    ASSERT_TRUE(L.quantized());
    EXPECT_EQ(L.q_head_dim, c.factored ? c.D : 0) << "E=" << c.s.E << " r=" << c.s.r;
    const MlaLayerWeights wq = L.quantized_weights(c.s.E);
    // The quantized layer is the float one up to the quantization (a loose check that
    // quantized_weights describes this layer): the latent projection and each head's absorbed
    // query W_uk[h]ᵀ·W_q_nope[h] within 15% relative Frobenius (4-bit blocks of Gaussian rows
    // are about 10% off).
    auto rel = [](const std::vector<double>& a, const std::vector<double>& b) {
      double d = 0, n = 0;
      for (std::size_t i = 0; i < a.size(); ++i) d += (a[i] - b[i]) * (a[i] - b[i]), n += b[i] * b[i];
      return std::sqrt(d / std::max(n, 1e-300));
    };
    EXPECT_LE(rel(wq.w_dkv, f.w.w_dkv), 0.15);
    EXPECT_LE(rel(wq.w_kr, f.w.w_kr), 0.15);
    std::vector<double> absorbed(static_cast<std::size_t>(c.s.H * c.s.r * c.s.E), 0.0);
    for (std::int64_t h = 0; h < c.s.H; ++h)
      for (std::int64_t a = 0; a < c.s.dn; ++a)
        for (std::int64_t b = 0; b < c.s.r; ++b)
          for (std::int64_t e = 0; e < c.s.E; ++e)
            absorbed[static_cast<std::size_t>((h * c.s.r + b) * c.s.E + e)] +=
                f.w.w_uk[static_cast<std::size_t>((h * c.s.dn + a) * c.s.r + b)] *
                f.w.w_q_nope[static_cast<std::size_t>((h * c.s.dn + a) * c.s.E + e)];
    if (c.s.dn > 0) EXPECT_LE(rel(wq.w_q_nope, absorbed), 0.15);
    EXPECT_LE(rel(wq.w_q_rope, f.w.w_q_rope), 0.15);
    EXPECT_LE(rel(wq.w_uv, f.w.w_uv), 0.15);
    for (CpuPath path : available_cpu_paths()) {
      CpuPathScope scope(path);
      for (std::int64_t n : {1, 3, 9}) {
        const std::int64_t p0 = 500;
        const std::vector<double> xd = randd(static_cast<std::size_t>(n * c.s.E), 8 + n, 1.0);
        const std::vector<float> xf(xd.begin(), xd.end());
        const std::vector<double> xr(xf.begin(), xf.end());
        const auto ref = mla_attention_f64(wq, xr, n, c.s.E, p0, MlaExec::kAbsorbed);
        const auto got = mla_attention_f32(L, xf, n, c.s.E, p0, MlaExec::kAbsorbed, *method, ExecContext{2});
        ASSERT_EQ(got.size(), ref.size());
        double err = 0;
        for (std::size_t i = 0; i < ref.size(); ++i) err = std::max(err, std::abs(got[i] - ref[i]));
        EXPECT_LE(err, 2e-5 * max_abs(ref))
            << cpu_path_name(path) << " n=" << n << " E=" << c.s.E << " r=" << c.s.r;
      }
    }
  }
}

// A source W_q that the queries are not a product through (unrelated rows) leaves the direct
// form; a layer with a BD form is refused; the weight storage names parse.
TEST(MlaModel, QuantizedStorageFormsAndRefusals) {
  const MlaShape s{64, 3, 32, 48, 16, 32};
  const FactoredLayer f = factored_mla(s, 32, GgmlType::Q8_0, 4);
  FactoredLayer other = factored_mla(s, 32, GgmlType::Q8_0, 5);
  MlaLayer L = MlaLayer::from_weights(f.w, s.E);
  quantize_mla_layer(L, s.E, GgmlType::Q8_0, GgmlType::Q8_0, &other.src);
  EXPECT_EQ(L.q_head_dim, 0);
  EXPECT_EQ(L.q_proj.rows(), s.r + s.dr + s.H * (s.r + s.dr));
  quantize_mla_layer(L, s.E, GgmlType::Q4_1, GgmlType::Q8_0, &f.src);
  EXPECT_EQ(L.q_head_dim, 32);
  EXPECT_EQ(L.q_proj.type_string(), "Q4_1+Q8_0");  // W_dkv|W_kr re-quantized, then the source's W_q
  EXPECT_EQ(L.q_up.rows(), s.H * (s.r + s.dr));
  EXPECT_EQ(L.weights(s.E), L.q_proj.rows() * s.E + L.q_up.rows() * 32 + s.H * s.dv * s.r);
  // K-quants are not quantizable here: Q8_0 in their place.
  quantize_mla_layer(L, s.E, GgmlType::Q4_K, GgmlType::Q6_K, nullptr);
  EXPECT_EQ(L.q_proj.type_string(), "Q8_0");
  EXPECT_EQ(L.q_uv.type_string(), "Q8_0");
  EXPECT_EQ(parse_mla_weights("source"), MlaWeights::kSource);
  EXPECT_EQ(std::string(to_string(MlaWeights::kQ8_0)), "q8_0");
  EXPECT_THROW(parse_mla_weights("q4"), OptionError);
  EXPECT_THROW(MlaLayer::from_weights(f.w, s.E).quantized_weights(s.E), Error);
}

// ---- the model ----------------------------------------------------------------------------

LlamaModel tiny_f32(bool tied = false) {
  const test::TinyTensors T = test::make_tiny(tied);
  return LlamaModel::load(test::write_gguf(T, "mla_tiny.gguf"), ExecContext{1}, WeightStorage::kF32);
}

// Every layer of the tiny model replaced by a random MLA layer of shape s (W_o resized);
// `edit`, if given, changes each layer's float64 weights first.
LlamaModel random_mla_model(const MlaShape& s0,
                            const std::function<void(MlaLayerWeights&)>& edit = {}) {
  LlamaModel base = tiny_f32();
  ModelHParams hp = base.hparams();
  LlamaWeights w = base.weights();
  const MlaShape s{hp.n_embd, hp.n_head, s0.r, s0.dn, s0.dr, s0.dv};
  for (std::size_t l = 0; l < w.layers.size(); ++l) {
    LlamaLayer& L = w.layers[l];
    L.wqkv.clear();
    MlaLayerWeights mw = random_mla(s, 10 + l);
    if (edit) edit(mw);
    L.mla = std::make_shared<const MlaLayer>(MlaLayer::from_weights(mw, hp.n_embd));
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

// A BD-rewritten MLA model `m` against its dense twin, in both executions: prefill, decode one
// token at a time and, when `split` > 0, a prefill of `split` tokens followed by the rest.
void expect_matches_dense(LlamaModel& m, LlamaModel& dense, const std::vector<std::int32_t>& toks,
                          double tol, std::size_t split) {
  const std::int64_t n = static_cast<std::int64_t>(toks.size()), V = m.hparams().n_vocab;
  for (MlaExec e : {MlaExec::kNaive, MlaExec::kAbsorbed}) {
    m.set_mla_exec(e);
    dense.set_mla_exec(e);
    KvCache c1 = m.make_cache(n), c2 = dense.make_cache(n);
    const auto got = m.forward(toks, c1, ExecContext{2});
    const auto ref = dense.forward(toks, c2, ExecContext{2});
    EXPECT_LE(rel_diff(got, ref), tol) << to_string(e);
    KvCache c3 = m.make_cache(n);
    std::vector<float> dec;
    for (std::int32_t t : toks) {
      const auto lg = m.forward({t}, c3, ExecContext{1});
      dec.insert(dec.end(), lg.begin(), lg.end());
    }
    EXPECT_LE(rel_diff(dec, ref), tol) << to_string(e);
    if (split == 0) continue;
    const auto mid = toks.begin() + static_cast<std::ptrdiff_t>(split);
    KvCache c4 = m.make_cache(n);
    m.forward(std::vector<std::int32_t>(toks.begin(), mid), c4, ExecContext{1});
    const auto tail = m.forward(std::vector<std::int32_t>(mid, toks.end()), c4, ExecContext{2});
    EXPECT_LE(rel_diff(tail, std::vector<float>(ref.begin() + static_cast<std::ptrdiff_t>(split) * V, ref.end())), tol)
        << to_string(e);
  }
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
    // Half-precision latent caches: token-by-token decoding equals the prefill over the same cache
    // type (absorbed reads the halves in place, naive widens them), and the rounding stays small.
    for (KvType t : {KvType::kF16, KvType::kBf16}) {
      std::vector<float> half_by_exec[2];
      for (MlaExec e : {MlaExec::kNaive, MlaExec::kAbsorbed}) {
        m.set_mla_exec(e);
        KvCache full = m.make_cache(9, t);
        EXPECT_EQ(full.bytes_per_token(), m.kv_bytes_per_token(t));
        const auto ref = m.forward(toks, full, ExecContext{2});
        KvCache c = m.make_cache(9, t);
        std::vector<float> dec;
        for (std::int32_t tk : toks) {
          const auto lg = m.forward({tk}, c, ExecContext{2});
          dec.insert(dec.end(), lg.begin(), lg.end());
        }
        EXPECT_LE(rel_diff(dec, ref), 1e-5) << to_string(e) << " " << to_string(t);
        EXPECT_LE(rel_diff(ref, by_exec[1]), t == KvType::kF16 ? 2e-3 : 2e-2) << to_string(e) << " " << to_string(t);
        half_by_exec[e == MlaExec::kNaive ? 0 : 1] = ref;
      }
      EXPECT_LE(rel_diff(half_by_exec[1], half_by_exec[0]), 1e-5) << to_string(t);
    }
    // A GQA cache is refused by the MLA model.
    KvCache gqa(m.hparams(), 9);
    EXPECT_THROW(m.forward(toks, gqa, ExecContext{1}), Error);
  }
}

// A model whose MLA layers read quantized storage (quantize_mla_model, Q8_0, direct form): decode
// over an f16 latent cache equals its prefill, and the logits stay near the float32 layers'.
TEST(MlaModel, QuantizedModelDecodesOverAHalfCache) {
  const MlaShape s{0, 0, 32, 16, 16, 32};
  const LlamaModel f = random_mla_model(s);
  LlamaModel m = f;
  quantize_mla_model(m, {}, MlaWeights::kQ8_0);
  ASSERT_TRUE(m.weights().layers[0].mla->quantized());
  EXPECT_LT(m.weight_bytes_per_token(false), f.weight_bytes_per_token(false));
  const auto toks = tokens(9);
  KvCache full = m.make_cache(9, KvType::kF16);
  const auto ref = m.forward(toks, full, ExecContext{2});
  KvCache c = m.make_cache(9, KvType::kF16);
  std::vector<float> dec;
  for (std::int32_t t : toks) {
    const auto lg = m.forward({t}, c, ExecContext{2});
    dec.insert(dec.end(), lg.begin(), lg.end());
  }
  EXPECT_LE(rel_diff(dec, ref), 1e-5);
  KvCache cf = f.make_cache(9);
  const auto fl = f.forward(toks, cf, ExecContext{2});
  EXPECT_LE(rel_diff(ref, fl), 5e-2);
  EXPECT_GT(rel_diff(ref, fl), 0.0);
  // kF32 keeps the float layers; kSource without a source W_q too.
  LlamaModel g = f;
  quantize_mla_model(g, {}, MlaWeights::kF32);
  quantize_mla_model(g, {}, MlaWeights::kSource);
  EXPECT_FALSE(g.weights().layers[0].mla->quantized());
}

// The exact GQA→MLA merge (TransMLA step 1 with every RoPE dimension kept in the decoupled
// key), written out independently of transform/mla.h: latent = values (r = Hkv·D), k_rope =
// W_k·xn with each head's RoPE frequencies repeated per KV head (θ = 0 past n_rot), q_rope of
// head h = W_q[h] placed in the block of its group, W_uv[h] = the selector of its group.
// Logits equal the GQA model's to float32 rounding, in both executions.
TEST(MlaModel, ExactMergeReproducesTheGqaModel) {
  LlamaModel g = tiny_f32(true);
  const ModelHParams hp = g.hparams();
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
// MACs.
TEST(MlaModel, BdaQkOnMlaLayersKeepsTheLogits) {
  // r > d_nope, and r == d_nope (every latent channel in the basis: W_uk'[h] = I, no coefficients).
  for (const MlaShape& s : {MlaShape{0, 0, 12, 6, 4, 8}, MlaShape{0, 0, 6, 6, 2, 8}}) {
  LlamaModel m = random_mla_model(s);
  const auto toks = tokens(12);
  LlamaModel dense = m;
  const ModelBdaReport rep = apply_bda(m, "qk");
  EXPECT_EQ(rep.layers.size(), 2u);
  EXPECT_LT(rep.params_after, rep.params_before);
  EXPECT_GT(rep.macs_saved_per_token, 0);
  EXPECT_TRUE(m.weights().layers[0].mla->uk_bd != nullptr);
  EXPECT_THROW(apply_bda(m, "qk"), Error);  // already applied
  const double tol = 64 * 6e-8 * std::max(1.0, rep.kappa_max);
  // Decode through the BD form too (absorbed: q̃ = [q' | C·q'] over the latent cache).
  expect_matches_dense(m, dense, toks, tol, 0);
  }
}

// ---- BD Attention's VO pair on MLA layers ------------------------------------------------

// Float64 BD form of one head's [d, r] row-major block W of an up-projection (W_uk[h] or
// W_uv[h]) for the basis S = perm[0..d): B = W[:,S] and W' = B⁻¹·W (I on S, C on S^c). Written
// apart from transform/bda.cpp (LAPACK LU here).
struct HeadBd {
  Eigen::MatrixXd B, Wp;
};
HeadBd head_bd_f64(const double* w, std::int64_t d, std::int64_t r, const std::vector<index_t>& perm) {
  Eigen::MatrixXd W(d, r), B(d, d);
  for (std::int64_t i = 0; i < d; ++i)
    for (std::int64_t j = 0; j < r; ++j) W(i, j) = w[i * r + j];
  for (std::int64_t k = 0; k < d; ++k) B.col(k) = W.col(perm[static_cast<std::size_t>(k)]);
  return {B, decomp::dense::lu_solve(B, W).x};
}

// y = att·W_oᵀ for att [n, K] and W_o [E, K] row-major, float64.
std::vector<double> out_proj(const std::vector<double>& wo, const std::vector<double>& att, std::int64_t n,
                             std::int64_t E, std::int64_t K) {
  std::vector<double> y(static_cast<std::size_t>(n * E), 0.0);
  for (std::int64_t t = 0; t < n; ++t)
    for (std::int64_t e = 0; e < E; ++e)
      for (std::int64_t k = 0; k < K; ++k)
        y[static_cast<std::size_t>(t * E + e)] += wo[static_cast<std::size_t>(e * K + k)] * att[static_cast<std::size_t>(t * K + k)];
  return y;
}

// A stored float32 value against its float64 definition: one rounding (u = 6e-8) plus the
// float64 solves' own error (≤ 1e-11 of the matrix's largest entry for κ ≤ 1e4).
void expect_rounded(float got, double want, double scale, const char* what) {
  EXPECT_LE(std::abs(static_cast<double>(got) - want), 1e-7 * std::abs(want) + 1e-11 * scale) << what;
}

// W_uv of every head h > 0 replaced by that of head h − 1 when h is odd: query heads in pairs
// share their value up-projection, as after a GQA→MLA conversion (Hq = 4 from Hkv = 2).
void gqa_origin_values(MlaLayerWeights& w) {
  const std::int64_t blk = w.d_v * w.rank;
  for (std::int64_t h = 1; h < w.n_head; h += 2)
    std::copy_n(w.w_uv.begin() + (h - 1) * blk, blk, w.w_uv.begin() + h * blk);
}

// Head 1's W_uv made rank one plus 1e-9 noise: every basis block has κ ≈ 1e9 > 1e4, so the head
// keeps its dense form.
void ill_conditioned_head(MlaLayerWeights& w) {
  const std::int64_t dv = w.d_v, r = w.rank;
  double* b = w.w_uv.data() + dv * r;
  for (std::int64_t i = 0; i < dv; ++i)
    for (std::int64_t j = 0; j < r; ++j)
      b[i * r + j] = (1.0 + 0.1 * static_cast<double>(i)) * std::cos(0.7 * static_cast<double>(j)) +
                     1e-9 * std::sin(static_cast<double>(13 * i + 7 * j));
}

struct VoCase {
  MlaShape s;
  const char* pairs;
  std::function<void(MlaLayerWeights&)> edit;
  const char* name;
};

const std::vector<VoCase>& vo_cases() {
  static const std::vector<VoCase> c = {
      {{0, 0, 12, 6, 4, 8}, "vo", {}, "even"},
      {{0, 0, 12, 6, 4, 8}, "qkvo", {}, "even qkvo"},
      {{0, 0, 5, 3, 2, 3}, "vo", {}, "odd"},
      {{0, 0, 5, 3, 2, 3}, "qkvo", {}, "odd qkvo"},
      {{0, 0, 8, 6, 2, 8}, "qkvo", {}, "r == d_v"},
      {{0, 0, 12, 6, 4, 8}, "vo", gqa_origin_values, "GQA origin"},
      {{0, 0, 12, 6, 4, 8}, "qkvo", ill_conditioned_head, "dense fallback"},
  };
  return c;
}

// The VO pair (and QK with it) of every MLA layer in float64: the BD form built from the
// library's bases (S_h per head for VO, the shared S for QK) gives W_o'·att' = W_o·att to 1e-12
// relative through both float64 executions (naive: v'_h = W_uv'[h]·c per token; absorbed:
// W_uv'[h]·o_lat_h); the stored float32 coefficients and W_o' are that form rounded once; the
// float32 layer (uv_bd in both executions) follows its float64 transcription within 2e-5.
TEST(MlaModel, BdaVoOnMlaLayersIsExactInFloat64) {
  const auto method = create_method("exact.flash");
  for (const VoCase& vc : vo_cases()) {
    SCOPED_TRACE(vc.name);
    LlamaModel dense = random_mla_model(vc.s, vc.edit);
    LlamaModel m = dense;
    const ModelBdaReport rep = apply_bda(m, vc.pairs);
    const std::int64_t E = m.hparams().n_embd;
    for (std::size_t l = 0; l < m.weights().layers.size(); ++l) {
      const MlaLayer& Md = *dense.weights().layers[l].mla;
      const MlaLayer& Mb = *m.weights().layers[l].mla;
      const std::int64_t H = Md.n_head, r = Md.rank, dn = Md.d_nope, dv = Md.d_v;
      const MlaLayerWeights Wd = Md.to_weights(E), Wstored = Mb.to_weights(E);
      const std::vector<double> WO(dense.weights().layers[l].wo.begin(), dense.weights().layers[l].wo.end());
      const std::vector<float>& WOstored = m.weights().layers[l].wo;
      MlaLayerWeights Wb = Wd;
      std::vector<double> WOb = WO;
      ASSERT_EQ(static_cast<std::int64_t>(Mb.uv_bd.size()), H);
      for (std::int64_t h = 0; h < H; ++h) {
        const transform::BdProjection& p = Mb.uv_bd[static_cast<std::size_t>(h)];
        if (p.head_dense(0)) {
          for (std::int64_t i = 0; i < dv * r; ++i)
            EXPECT_EQ(Mb.w_uv[static_cast<std::size_t>(h * dv * r + i)], Md.w_uv[static_cast<std::size_t>(h * dv * r + i)]);
          for (std::int64_t e = 0; e < E; ++e)
            for (std::int64_t k = 0; k < dv; ++k)
              EXPECT_EQ(WOstored[static_cast<std::size_t>(e * H * dv + h * dv + k)], WO[static_cast<std::size_t>(e * H * dv + h * dv + k)]);
          continue;
        }
        const HeadBd bd = head_bd_f64(Wd.w_uv.data() + h * dv * r, dv, r, p.permutation());
        const double cmax = bd.Wp.cwiseAbs().maxCoeff();
        for (std::int64_t i = 0; i < dv; ++i)
          for (std::int64_t j = 0; j < r; ++j) {
            Wb.w_uv[static_cast<std::size_t>((h * dv + i) * r + j)] = bd.Wp(i, j);
            expect_rounded(Mb.w_uv[static_cast<std::size_t>((h * dv + i) * r + j)], bd.Wp(i, j), cmax, "W_uv'");
          }
        for (std::int64_t e = 0; e < E; ++e) {
          Eigen::RowVectorXd row(dv);
          for (std::int64_t k = 0; k < dv; ++k) row(k) = WO[static_cast<std::size_t>(e * H * dv + h * dv + k)];
          const Eigen::RowVectorXd nr = row * bd.B;
          for (std::int64_t k = 0; k < dv; ++k) {
            WOb[static_cast<std::size_t>(e * H * dv + h * dv + k)] = nr(k);
            expect_rounded(WOstored[static_cast<std::size_t>(e * H * dv + h * dv + k)], nr(k), nr.cwiseAbs().maxCoeff(), "W_o'");
          }
        }
        // GQA origin: heads that share W_uv share their basis and coefficients.
        if (vc.edit && std::string(vc.name) == "GQA origin" && h % 2 == 1) {
          EXPECT_EQ(p.permutation(), Mb.uv_bd[static_cast<std::size_t>(h - 1)].permutation());
          EXPECT_TRUE(std::equal(Mb.w_uv.begin() + h * dv * r, Mb.w_uv.begin() + (h + 1) * dv * r,
                                 Mb.w_uv.begin() + (h - 1) * dv * r));
        }
      }
      if (std::string(vc.pairs) == "qkvo") {
        ASSERT_TRUE(Mb.uk_bd != nullptr);
        for (std::int64_t h = 0; h < H; ++h) {
          if (Mb.uk_bd->head_dense(h)) continue;
          const HeadBd bd = head_bd_f64(Wd.w_uk.data() + h * dn * r, dn, r, Mb.uk_bd->permutation());
          for (std::int64_t i = 0; i < dn; ++i)
            for (std::int64_t j = 0; j < r; ++j) Wb.w_uk[static_cast<std::size_t>((h * dn + i) * r + j)] = bd.Wp(i, j);
          // W_q_nope'[h] = Bᵀ·W_q_nope[h]: q'·k' = q·B·B⁻¹·W_uk·c.
          Eigen::MatrixXd Q(dn, E);
          for (std::int64_t i = 0; i < dn; ++i)
            for (std::int64_t e = 0; e < E; ++e) Q(i, e) = Wd.w_q_nope[static_cast<std::size_t>((h * dn + i) * E + e)];
          const Eigen::MatrixXd Qp = bd.B.transpose() * Q;
          for (std::int64_t i = 0; i < dn; ++i)
            for (std::int64_t e = 0; e < E; ++e) {
              Wb.w_q_nope[static_cast<std::size_t>((h * dn + i) * E + e)] = Qp(i, e);
              expect_rounded(static_cast<float>(Wstored.w_q_nope[static_cast<std::size_t>((h * dn + i) * E + e)]),
                             Qp(i, e), Qp.cwiseAbs().maxCoeff(), "W_q_nope'");
            }
        }
      }
      const std::int64_t n = 7, p0 = 301;
      const std::vector<double> xd = randd(static_cast<std::size_t>(n * E), 40 + l, 1.0);
      std::vector<float> xf(xd.begin(), xd.end());
      const std::vector<double> xr(xf.begin(), xf.end());
      for (MlaExec e : {MlaExec::kNaive, MlaExec::kAbsorbed}) {
        const auto y = out_proj(WO, mla_attention_f64(Wd, xd, n, E, p0, e), n, E, H * dv);
        const auto yb = out_proj(WOb, mla_attention_f64(Wb, xd, n, E, p0, e), n, E, H * dv);
        double err = 0;
        for (std::size_t i = 0; i < y.size(); ++i) err = std::max(err, std::abs(y[i] - yb[i]));
        EXPECT_LE(err, 1e-12 * max_abs(y)) << to_string(e) << " layer " << l;
        EXPECT_GT(max_abs(y), 0.1);
        // The float32 layer with the BD forms against its own float64 transcription.
        const auto ref = mla_attention_f64(Wstored, xr, n, E, p0, e);
        const auto got = mla_attention_f32(Mb, xf, n, E, p0, e, *method, ExecContext{2});
        double e32 = 0;
        for (std::size_t i = 0; i < ref.size(); ++i) e32 = std::max(e32, std::abs(got[i] - ref[i]));
        EXPECT_LE(e32, 2e-5 * max_abs(ref)) << to_string(e) << " layer " << l;
      }
    }
    if (std::string(vc.name) == "dense fallback") {
      EXPECT_GE(rep.fallback_heads, 2);  // head 1 of both layers (VO)
      EXPECT_TRUE(m.weights().layers[0].mla->uv_bd[1].head_dense(0));
    }
  }
}

// The VO pair (alone and with QK) on the model: logits of a prefill, a chunked prefill and
// token-by-token decode equal the dense MLA model's up to c·u·κ_max (docs/numerics.md), in both
// executions; weights and MACs saved are exactly d_v² (and d_nope²) per BD head; r == d_v
// leaves W_uv' a permutation (no coefficients at all); d_v > r is refused and leaves the model
// untouched.
TEST(MlaModel, BdaVoOnMlaModelKeepsTheLogits) {
  for (const VoCase& vc : vo_cases()) {
    SCOPED_TRACE(vc.name);
    LlamaModel dense = random_mla_model(vc.s, vc.edit);
    LlamaModel m = dense;
    const ModelBdaReport rep = apply_bda(m, vc.pairs);
    const bool qk = std::string(vc.pairs) == "qkvo";
    const std::int64_t H = m.hparams().n_head, L = m.hparams().n_layer, E = m.hparams().n_embd;
    const MlaShape& s = vc.s;
    EXPECT_EQ(rep.up_macs_before, L * H * (s.dn + s.dv) * s.r);
    // Only the fallback case has dense heads, all on the VO side (head 1 of each layer).
    const std::int64_t want = (qk ? L * H * s.dn * s.dn : 0) + (L * H - rep.fallback_heads) * s.dv * s.dv;
    EXPECT_EQ(rep.macs_saved_per_token, want);
    EXPECT_EQ(rep.params_saved(), want);
    EXPECT_EQ(rep.params_before, L * H * ((qk ? s.dn * (E + s.r) : 0) + s.dv * s.r + E * s.dv));
    if (s.r == s.dv)
      for (const auto& p : m.weights().layers[0].mla->uv_bd) EXPECT_EQ(p.weight_params(), 0);
    EXPECT_THROW(apply_bda(m, "vo"), Error);  // already applied
    const double tol = 64 * 6e-8 * std::max(1.0, rep.kappa_max);
    const auto toks = tokens(12);
    expect_matches_dense(m, dense, toks, tol, 8);
  }
  // d_v > r: no basis of d_v latent channels; refused by name, model untouched (QK too).
  LlamaModel wide = random_mla_model(MlaShape{0, 0, 6, 4, 2, 8});
  const std::vector<float> wo0 = wide.weights().layers[0].wo;
  for (const char* pairs : {"vo", "qkvo"}) {
    try {
      apply_bda(wide, pairs);
      ADD_FAILURE() << pairs << " with d_v > r must be refused";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("d_v = 8 exceeds the latent rank r = 6"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(wide.weights().layers[0].mla->uv_bd.empty());
    EXPECT_TRUE(wide.weights().layers[0].mla->uk_bd == nullptr);
    EXPECT_EQ(wide.weights().layers[0].wo, wo0);
  }
  EXPECT_NO_THROW(apply_bda(wide, "qk"));
  // The BDA GGUF layout (write_bda_gguf) has no MLA form: refused, not written half right.
  const GgufFile src = GgufFile::open(test::write_gguf(test::make_tiny(false), "mla_bda_src.gguf"));
  EXPECT_THROW(write_bda_gguf(src, wide, test::temp_path("mla_bda_out.gguf")), Error);
}

// An MLA model written as a numattn-mla GGUF loads back (both storages) with identical weights
// and bitwise identical logits; hostile MLA metadata is refused by key before any allocation.
TEST(MlaModel, GgufRoundTripAndHostileFiles) {
  const test::TinyTensors T = test::make_tiny(false);
  const std::string src_path = test::write_gguf(T, "mla_src.gguf");
  const GgufFile src = GgufFile::open(src_path);
  // The file holds what the conversion makes (its keys are checked against the layers): rank 7
  // of the latent width d_nope + Hkv·D = 8 + 16, d_rope = rope_heads·n_rot = 8.
  transform::MlaOptions opt;
  opt.rank = 7;
  const std::string out = test::temp_path("mla_out.gguf");
  LlamaModel src_model = LlamaModel::load(src, ExecContext{1});
  LlamaModel mm = LlamaModel::load(src, ExecContext{1});
  convert_model_to_mla(mm, {}, opt, ExecContext{1});
  write_mla_gguf(src, mm, opt, out);
  EXPECT_THROW(write_mla_gguf(src, src_model, opt, test::temp_path("mla_bad.gguf")), Error);  // not MLA
  // Options that do not give these layers: the file's keys would disagree with them.
  for (auto bad : {transform::MlaOptions{.rank = 8}, transform::MlaOptions{.rank = 7, .rope_dims = 4},
                   transform::MlaOptions{.rank = 7, .rope_heads = 2}, transform::MlaOptions{.rank = 7, .rope_dims = 3}})
    EXPECT_THROW(write_mla_gguf(src, mm, bad, test::temp_path("mla_bad.gguf")), Error);
  // A random MLA model of other dimensions is no conversion of the source.
  EXPECT_THROW(write_mla_gguf(src, random_mla_model(MlaShape{0, 0, 7, 3, 4, 8}), opt, test::temp_path("mla_bad.gguf")),
               Error);
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
  expect_refused({{{"numattn-mla.mla.kv_lora_rank", GgufValue::u32(8)}}, {}, {}}, "rank_option");
  expect_refused({{{"numattn-mla.mla.kv_lora_rank", GgufValue::u32(0)}}, {}, {}}, "kv_lora_rank");
  expect_refused({{{"numattn-mla.mla.rope_dim", GgufValue::u32(3)}}, {}, {}}, "rope_dim");
  expect_refused({{{"numattn-mla.mla.softmax_scale", GgufValue::f64(-1.0)}}, {}, {}}, "softmax_scale");
  expect_refused({{{"numattn-mla.mla.rope_theta.1", GgufValue::array(std::vector<double>{1.0})}}, {}, {}},
                 "rope_theta.1");
  expect_refused({{{"numattn-mla.mla.rope_theta.0", GgufValue::array(std::vector<double>{1.0, NAN})}}, {}, {}},
                 "rope_theta.0");
  expect_refused({{}, {}, {"blk.1.attn_kv_b.weight"}}, "attn_kv_b.weight");
}

// RoPE dims below one head (half of n_rot = 8) with FreqFold 2 (per-member frequencies): the
// converted model runs in both executions, decode equals prefill, and the numattn-mla file holds
// rope_dims and the per-member θ and reads back with bitwise logits; a sequential calibration
// gives such a layer too.
TEST(MlaModel, RopeDimsBelowOneHeadRunsAndRoundTrips) {
  const test::TinyTensors T = test::make_tiny(false);
  const std::string src_path = test::write_gguf(T, "mla_rd_src.gguf");
  const GgufFile src = GgufFile::open(src_path);
  transform::MlaOptions opt;
  opt.rank = 9;
  opt.rope_dims = 4;
  opt.freqfold = 2;
  LlamaModel mm = LlamaModel::load(src, ExecContext{1});
  const ModelHParams hp = mm.hparams();
  ASSERT_EQ(hp.n_rot, 8);
  const auto toks = tokens(12);
  const MlaModelReport rep = convert_model_to_mla_sequential(mm, toks, 5, opt, ExecContext{1});
  EXPECT_EQ(rep.d_rope, 4);
  EXPECT_EQ(rep.rank, 9);
  EXPECT_EQ(rep.d_nope, hp.n_head_kv * hp.head_dim - 4);
  EXPECT_EQ(mm.kv_bytes_per_token(), hp.n_layer * 4 * (9 + 4));
  const double th0 = 1.0, th2 = std::pow(hp.rope_base, -2.0 * 2 / 8.0);  // members 0 of groups {0,1}, {2,3}
  for (const LlamaLayer& L : mm.weights().layers) {
    ASSERT_TRUE(L.mla);
    EXPECT_EQ(L.mla->rope_theta, (std::vector<double>{th0, th2}));
  }
  const std::int64_t V = hp.n_vocab;
  std::vector<float> by_exec[2];
  for (MlaExec e : {MlaExec::kNaive, MlaExec::kAbsorbed}) {
    mm.set_mla_exec(e);
    KvCache full = mm.make_cache(12);
    const auto ref = mm.forward(toks, full, ExecContext{2});
    KvCache c = mm.make_cache(12);
    std::vector<float> dec;
    for (std::int32_t t : toks) {
      const auto lg = mm.forward({t}, c, ExecContext{1});
      dec.insert(dec.end(), lg.begin(), lg.end());
    }
    EXPECT_LE(rel_diff(dec, ref), 1e-5) << to_string(e);
    EXPECT_EQ(static_cast<std::int64_t>(ref.size()), 12 * V);
    by_exec[e == MlaExec::kNaive ? 0 : 1] = ref;
  }
  EXPECT_LE(rel_diff(by_exec[1], by_exec[0]), 1e-5);
  const std::string out = test::temp_path("mla_rd_out.gguf");
  write_mla_gguf(src, mm, opt, out);
  const GgufFile back_file = GgufFile::open(out);
  EXPECT_EQ(back_file.get_int("numattn-mla.mla.rope_dims"), 4);
  EXPECT_EQ(back_file.get_int("numattn-mla.mla.version"), 2);
  LlamaModel back = LlamaModel::load(out, ExecContext{1}, WeightStorage::kF32);
  back.set_mla_exec(MlaExec::kAbsorbed);
  KvCache c = back.make_cache(12);
  EXPECT_EQ(back.forward(toks, c, ExecContext{2}), by_exec[1]);
  // The file's θ must be the per-member ones of its keys.
  const std::string bad = test::rewrite_gguf(
      out, {{{"numattn-mla.mla.rope_theta.0", GgufValue::array(std::vector<double>{th0, 0.5 * (th0 + th2)})}}, {}, {}},
      "mla_rd_bad.gguf");
  EXPECT_THROW(LlamaModel::load(bad, ExecContext{1}, WeightStorage::kF32), Error);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
