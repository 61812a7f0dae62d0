// Gemma 3 in the model runner: the tiny random gemma3 model (support/tiny_llama.h) against a
// float64 transcription of the architecture written here, the sliding-window layers, the
// per-kind attention selectors, and the refusals of what does not apply to it.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "numattn/arch/arch.h"
#include "numattn/core/error.h"
#include "numattn/core/rng.h"
#include "numattn/gguf/gguf.h"
#include "numattn/model/llama.h"
#include "support/test_util.h"
#include "support/tiny_llama.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

using test::TinyTensors;

// ---- independent float64 transcription of Gemma 3's decoder -----------------------------
// (Team Gemma, "Gemma 3 Technical Report", 2025; llama.cpp's gemma3 graph for the GGUF
// conventions: norm weights already hold 1 + w, rotate-half RoPE, the window rule
// query − key < W.)
struct Ref {
  const TinyTensors& T;
  std::int64_t window = 4;
  double base_global = 10000, base_local = 100, softcap = 30;
  bool local(int l) const { return l % 2 == 0; }  // sliding_window_pattern 2: layers 0 and 2

  std::vector<double> linear(const std::vector<double>& x, const std::string& w, std::int64_t in,
                             std::int64_t out) const {
    const std::vector<float>& W = T.get(w);
    std::vector<double> y(static_cast<std::size_t>(out), 0.0);
    for (std::int64_t o = 0; o < out; ++o)
      for (std::int64_t i = 0; i < in; ++i) y[o] += static_cast<double>(W[o * in + i]) * x[i];
    return y;
  }
  std::vector<double> rms(const double* x, std::int64_t n, const std::string& g) const {
    const std::vector<float>& G = T.get(g);
    double ss = 0;
    for (std::int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(n) + T.hp.rms_eps);
    std::vector<double> y(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] * r * G[i];
    return y;
  }
  void rotate_half(double* v, std::int64_t D, std::int64_t pos, double base) const {
    for (std::int64_t i = 0; i < D / 2; ++i) {
      const double th = static_cast<double>(pos) * std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(D));
      const double a = v[i], b = v[i + D / 2];
      v[i] = a * std::cos(th) - b * std::sin(th);
      v[i + D / 2] = b * std::cos(th) + a * std::sin(th);
    }
  }
  std::vector<std::vector<double>> logits(const std::vector<std::int32_t>& toks) const {
    const ModelHParams& h = T.hp;
    const std::int64_t E = h.n_embd, D = h.head_dim, Hq = h.n_head, Hkv = h.n_head_kv, F = h.n_ff, V = h.n_vocab;
    const auto N = static_cast<std::int64_t>(toks.size());
    const std::vector<float>& emb = T.get("token_embd.weight");
    std::vector<std::vector<double>> x(static_cast<std::size_t>(N));
    const double scale = std::sqrt(static_cast<float>(E));  // float32 √E, as llama.cpp scales
    for (std::int64_t t = 0; t < N; ++t)
      for (std::int64_t e = 0; e < E; ++e) x[t].push_back(emb[toks[t] * E + e] * scale);
    for (int l = 0; l < h.n_layer; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      std::vector<std::vector<double>> q(N), k(N), v(N);
      for (std::int64_t t = 0; t < N; ++t) {
        const auto xn = rms(x[t].data(), E, p + "attn_norm.weight");
        q[t] = linear(xn, p + "attn_q.weight", E, Hq * D);
        k[t] = linear(xn, p + "attn_k.weight", E, Hkv * D);
        v[t] = linear(xn, p + "attn_v.weight", E, Hkv * D);
        for (std::int64_t hh = 0; hh < Hq; ++hh) {
          const auto n = rms(q[t].data() + hh * D, D, p + "attn_q_norm.weight");
          std::copy(n.begin(), n.end(), q[t].begin() + hh * D);
          rotate_half(q[t].data() + hh * D, D, t, local(l) ? base_local : base_global);
        }
        for (std::int64_t hh = 0; hh < Hkv; ++hh) {
          const auto n = rms(k[t].data() + hh * D, D, p + "attn_k_norm.weight");
          std::copy(n.begin(), n.end(), k[t].begin() + hh * D);
          rotate_half(k[t].data() + hh * D, D, t, local(l) ? base_local : base_global);
        }
      }
      for (std::int64_t t = 0; t < N; ++t) {
        std::vector<double> att(static_cast<std::size_t>(Hq * D), 0.0);
        for (std::int64_t hh = 0; hh < Hq; ++hh) {
          const std::int64_t g = hh / (Hq / Hkv);
          const std::int64_t j0 = local(l) ? std::max<std::int64_t>(0, t - window + 1) : 0;
          std::vector<double> s;
          double mx = -1e300;
          for (std::int64_t j = j0; j <= t; ++j) {
            double d = 0;
            for (std::int64_t i = 0; i < D; ++i) d += q[t][hh * D + i] * k[j][g * D + i];
            s.push_back(d / std::sqrt(static_cast<double>(D)));
            mx = std::max(mx, s.back());
          }
          double z = 0;
          for (double& e : s) z += (e = std::exp(e - mx));
          for (std::int64_t j = j0; j <= t; ++j)
            for (std::int64_t i = 0; i < D; ++i) att[hh * D + i] += s[j - j0] / z * v[j][g * D + i];
        }
        const auto o = linear(att, p + "attn_output.weight", Hq * D, E);
        const auto on = rms(o.data(), E, p + "post_attention_norm.weight");
        for (std::int64_t e = 0; e < E; ++e) x[t][e] += on[e];
        const auto xn = rms(x[t].data(), E, p + "ffn_norm.weight");
        const auto gt = linear(xn, p + "ffn_gate.weight", E, F), up = linear(xn, p + "ffn_up.weight", E, F);
        std::vector<double> a(static_cast<std::size_t>(F));
        for (std::int64_t i = 0; i < F; ++i)
          a[i] = 0.5 * gt[i] * (1 + std::tanh(std::sqrt(2 / M_PI) * (gt[i] + 0.044715 * gt[i] * gt[i] * gt[i]))) * up[i];
        const auto f = linear(a, p + "ffn_down.weight", F, E);
        const auto fn = rms(f.data(), E, p + "post_ffw_norm.weight");
        for (std::int64_t e = 0; e < E; ++e) x[t][e] += fn[e];
      }
    }
    std::vector<std::vector<double>> out(static_cast<std::size_t>(N));
    for (std::int64_t t = 0; t < N; ++t) {
      out[t] = linear(rms(x[t].data(), E, "output_norm.weight"), "token_embd.weight", E, V);
      for (double& z : out[t]) z = softcap * std::tanh(z / softcap);
    }
    return out;
  }
};

std::vector<std::int32_t> tokens(std::size_t n, std::uint64_t seed) {
  CounterRng r(seed, 0);
  std::vector<std::int32_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<std::int32_t>(r.uniform(i) * 64) % 64;
  return t;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<std::vector<double>>& ref) {
  double m = 0, s = 0;
  for (std::size_t t = 0; t < ref.size(); ++t)
    for (std::size_t v = 0; v < ref[t].size(); ++v) {
      m = std::max(m, std::abs(a[t * ref[t].size() + v] - ref[t][v]));
      s = std::max(s, std::abs(ref[t][v]));
    }
  return m / std::max(1.0, s);
}

const std::string& gemma_path() {
  static const std::string p = test::write_gguf(test::make_tiny_gemma(), "tiny_gemma3.gguf");
  return p;
}

TEST(Gemma3, HyperParametersFromTheFile) {
  const ModelHParams hp = LlamaModel::read_hparams(GgufFile::open(gemma_path()));
  EXPECT_EQ(hp.rope_layout, RopeLayout::kHalves);
  EXPECT_EQ(hp.ffn_gate, FfnGate::kGeluTanh);
  EXPECT_TRUE(hp.qk_norm && hp.post_norms);
  EXPECT_EQ(hp.head_dim, 16);
  EXPECT_EQ(hp.sliding_window, 4);
  EXPECT_EQ(hp.local_layers, (std::vector<std::uint8_t>{1, 0, 1}));
  EXPECT_DOUBLE_EQ(hp.rope_base_local, 100.0);
  EXPECT_DOUBLE_EQ(hp.layer_rope_base(1), 10000.0);
  EXPECT_DOUBLE_EQ(hp.logit_softcap, 30.0);
  EXPECT_DOUBLE_EQ(hp.attn_scale, 0.25);
  EXPECT_FLOAT_EQ(static_cast<float>(hp.embed_scale), std::sqrt(32.f));
}

// Every storage, attention method and thread count against the float64 transcription; the
// window matters (13 tokens over a window of 4).
TEST(Gemma3, TinyModelMatchesFloat64Reference) {
  const TinyTensors T = test::make_tiny_gemma();
  const auto toks = tokens(13, 3);
  const auto ref = Ref{T}.logits(toks);
  for (WeightStorage ws : {WeightStorage::kInPlace, WeightStorage::kF32})
    for (int threads : {1, 2}) {
      ExecContext ctx{threads};
      LlamaModel m = LlamaModel::load(gemma_path(), ctx, ws);
      for (const char* spec : {"exact.flash", "exact.naive", "exact.reference"}) {
        m.set_attention(spec);
        KvCache c = m.make_cache(16);
        EXPECT_LT(max_rel_diff(m.forward(toks, c, ctx), ref), 2e-5)
            << spec << " storage " << weight_storage_name(ws) << " threads " << threads;
      }
    }
  // The reference does see the window: without it the logits move.
  Ref wide{T};
  wide.window = 100;
  ExecContext ctx{1};
  LlamaModel m = LlamaModel::load(gemma_path(), ctx);
  KvCache c = m.make_cache(16);
  EXPECT_GT(max_rel_diff(m.forward(toks, c, ctx), wide.logits(toks)), 1e-3);
}

TEST(Gemma3, DecodeEqualsPrefillAcrossTheWindow) {
  ExecContext ctx{2};
  LlamaModel m = LlamaModel::load(gemma_path(), ctx);
  const auto toks = tokens(14, 9);
  KvCache full = m.make_cache(14);
  const auto ref = m.forward(toks, full, ctx);
  KvCache c = m.make_cache(14);
  std::vector<float> got = m.forward({toks.begin(), toks.begin() + 3}, c, ctx);
  for (std::size_t i = 3; i < toks.size(); ++i) {
    const auto one = m.forward({toks[i]}, c, ctx);
    got.insert(got.end(), one.begin(), one.end());
  }
  ASSERT_EQ(got.size(), ref.size());
  double err = 0;
  for (std::size_t i = 0; i < got.size(); ++i) err = std::max(err, double(std::abs(got[i] - ref[i])));
  EXPECT_LT(err, 1e-4);
}

// The local layers are exact sparse.window by construction: the model's own window rule (the
// problem's window_left, run by exact.flash), sparse.window over it, and sparse.window with
// the same band on the local layers give the same logits.
TEST(Gemma3, LocalLayersAreSparseWindowAndSelectorsPickLayers) {
  ExecContext ctx{1};
  LlamaModel m = LlamaModel::load(gemma_path(), ctx);
  const auto toks = tokens(12, 4);
  auto run = [&](const std::string& spec) {
    m.set_attention(spec);
    KvCache c = m.make_cache(12);
    return m.forward(toks, c, ctx);
  };
  const auto native = run("exact.flash");
  const auto band = run("local:sparse.window(left=3,right=0,sinks=0)");
  ASSERT_EQ(native.size(), band.size());
  for (std::size_t i = 0; i < native.size(); ++i) ASSERT_NEAR(native[i], band[i], 1e-5) << i;
  // A selector sets exactly its kind: the local layers get the method, the global one the default.
  m.set_attention("local:exact.naive");
  EXPECT_EQ(m.attention(0).info().name, "exact.naive");
  EXPECT_EQ(m.attention(1).info().name, "exact.flash");
  EXPECT_EQ(m.attention(2).info().name, "exact.naive");
  m.set_attention("global:exact.naive;local:exact.reference");
  EXPECT_EQ(m.attention(1).info().name, "exact.naive");
  EXPECT_EQ(m.attention(0).info().name, "exact.reference");
  // A narrower band on the local layers is an approximation: the logits move.
  const auto narrow = run("local:sparse.window(left=1,right=0,sinks=0)");
  double d = 0;
  for (std::size_t i = 0; i < native.size(); ++i) d = std::max(d, double(std::abs(native[i] - narrow[i])));
  EXPECT_GT(d, 1e-3);
  // Selector errors: mixing, repeating, and local: on a model without local layers.
  EXPECT_THROW(m.set_attention("local:exact.naive;exact.flash"), Error);
  EXPECT_THROW(m.set_attention("local:exact.naive;local:exact.flash"), Error);
  LlamaModel llama = LlamaModel::load(test::write_gguf(test::make_tiny(true), "tiny_for_selector.gguf"), ctx);
  EXPECT_THROW(llama.set_attention("local:exact.naive"), Error);
  EXPECT_NO_THROW(llama.set_attention("global:exact.naive"));
}

// A method without window support cannot replace a local layer's attention, and says so.
TEST(Gemma3, MethodWithoutWindowRefusesLocalLayers) {
  ExecContext ctx{1};
  LlamaModel m = LlamaModel::load(gemma_path(), ctx);
  const auto toks = tokens(8, 5);
  m.set_attention("global:kernel.linear");
  KvCache c = m.make_cache(8);
  EXPECT_NO_THROW(m.forward(toks, c, ctx));
  m.set_attention("kernel.linear");
  KvCache c2 = m.make_cache(8);
  EXPECT_THROW(m.forward(toks, c2, ctx), Error);
}

// Hostile gemma3 keys are refused by name.
TEST(Gemma3, BadKeysAreRefused) {
  auto refused = [](const std::string& key, const GgufValue& v, const std::string& name) {
    test::GgufEdit e;
    e.keys.emplace_back(key, v);
    const std::string p = test::rewrite_gguf(gemma_path(), e, name);
    try {
      LlamaModel::read_hparams(GgufFile::open(p));
      ADD_FAILURE() << key << " accepted";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find(key), std::string::npos) << err.what();
    }
  };
  refused("gemma3.rope.freq_base_swa", GgufValue::f32(-1.f), "g_bad_swa_base.gguf");
  refused("gemma3.rope.freq_base_swa", GgufValue::f32(std::nanf("")), "g_nan_swa_base.gguf");
  refused("gemma3.final_logit_softcapping", GgufValue::f32(-3.f), "g_bad_cap.gguf");
  refused("gemma3.attention.sliding_window", GgufValue::i32(-4), "g_bad_window.gguf");
  refused("gemma3.attention.sliding_window_pattern", GgufValue::u32(1000), "g_bad_pattern.gguf");
  refused("gemma3.attention.sliding_window_pattern", GgufValue::string("6"), "g_str_pattern.gguf");
  // A missing q-norm tensor names the tensor.
  test::GgufEdit e;
  e.drop_tensors.push_back("blk.1.attn_q_norm.weight");
  try {
    LlamaModel::read_hparams(GgufFile::open(test::rewrite_gguf(gemma_path(), e, "g_no_qnorm.gguf")));
    ADD_FAILURE() << "missing q norm accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("blk.1.attn_q_norm.weight"), std::string::npos) << err.what();
  }
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
