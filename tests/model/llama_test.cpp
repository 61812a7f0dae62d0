#include "numattn/model/llama.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "numattn/core/error.h"
#include "numattn/core/rng.h"
#include "numattn/gguf/gguf.h"
#include "numattn/gguf/tensor_data.h"
#include "numattn/model/bda_model.h"
#include "numattn/model/data.h"
#include "numattn/model/ppl.h"
#include "numattn/model/tokenizer.h"
#include "support/test_util.h"
#include "support/tiny_llama.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

using test::make_tiny;
using test::randn;
using test::tiny_hparams;
using test::TinyTensors;
using test::write_gguf;

// ---- independent float64 implementation, in Hugging Face's convention ----------------------
//
// HF's LlamaAttention applies RoPE with rotate_half, pairing dims (i, i + D/2). GGUF files hold
// q/k rows permuted by convert_hf_to_gguf.py (GGUF row 2i + a of a head = HF row a·D/2 + i),
// which turns that into adjacent pairs. This reference un-permutes the rows and uses
// rotate_half, so it checks the layout claim rather than repeating it.
std::vector<std::vector<double>> reference_logits(const TinyTensors& T,
                                                  const std::vector<std::int32_t>& toks) {
  const auto& h = T.hp;
  const std::int64_t E = h.n_embd, D = h.head_dim, F = h.n_ff, Hq = h.n_head, Hkv = h.n_head_kv;
  const auto N = static_cast<std::int64_t>(toks.size());
  auto mat = [&](const std::string& n) { return T.get(n); };
  auto linear = [](const std::vector<double>& x, const std::vector<float>& w, std::int64_t in,
                   std::int64_t out) {
    std::vector<double> y(static_cast<std::size_t>(out), 0.0);
    for (std::int64_t o = 0; o < out; ++o)
      for (std::int64_t i = 0; i < in; ++i) y[o] += static_cast<double>(w[o * in + i]) * x[i];
    return y;
  };
  auto rms = [&](const std::vector<double>& x, const std::vector<float>& g) {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + h.rms_eps);
    std::vector<double> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * g[i];
    return y;
  };
  auto unpermute = [&](const std::vector<float>& w, std::int64_t heads) {
    std::vector<float> hf(w.size());
    for (std::int64_t hh = 0; hh < heads; ++hh)
      for (std::int64_t a = 0; a < 2; ++a)
        for (std::int64_t i = 0; i < D / 2; ++i)
          for (std::int64_t c = 0; c < E; ++c)
            hf[((hh * D) + a * (D / 2) + i) * E + c] = w[((hh * D) + 2 * i + a) * E + c];
    return hf;
  };
  auto rope_hf = [&](std::vector<double>& v, std::int64_t heads, std::int64_t pos) {
    for (std::int64_t hh = 0; hh < heads; ++hh)
      for (std::int64_t i = 0; i < D / 2; ++i) {
        const double th = static_cast<double>(pos) * std::pow(h.rope_base, -2.0 * i / static_cast<double>(D));
        double& a = v[hh * D + i];
        double& b = v[hh * D + i + D / 2];
        const double x0 = a, x1 = b;
        a = x0 * std::cos(th) - x1 * std::sin(th);
        b = x1 * std::cos(th) + x0 * std::sin(th);
      }
  };
  std::vector<std::vector<double>> x(static_cast<std::size_t>(N));
  const auto& emb = mat("token_embd.weight");
  for (std::int64_t t = 0; t < N; ++t)
    x[t].assign(emb.begin() + toks[t] * E, emb.begin() + (toks[t] + 1) * E);
  for (int l = 0; l < h.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const auto wq = unpermute(mat(p + "attn_q.weight"), Hq);
    const auto wk = unpermute(mat(p + "attn_k.weight"), Hkv);
    std::vector<std::vector<double>> q(N), k(N), v(N);
    for (std::int64_t t = 0; t < N; ++t) {
      const auto xn = rms(x[t], mat(p + "attn_norm.weight"));
      q[t] = linear(xn, wq, E, Hq * D);
      k[t] = linear(xn, wk, E, Hkv * D);
      v[t] = linear(xn, mat(p + "attn_v.weight"), E, Hkv * D);
      rope_hf(q[t], Hq, t);
      rope_hf(k[t], Hkv, t);
    }
    for (std::int64_t t = 0; t < N; ++t) {
      std::vector<double> att(static_cast<std::size_t>(Hq * D), 0.0);
      for (std::int64_t hh = 0; hh < Hq; ++hh) {
        const std::int64_t g = hh / (Hq / Hkv);
        std::vector<double> s(static_cast<std::size_t>(t + 1));
        double mx = -1e300;
        for (std::int64_t j = 0; j <= t; ++j) {
          double d = 0;
          for (std::int64_t c = 0; c < D; ++c) d += q[t][hh * D + c] * k[j][g * D + c];
          s[j] = d / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (auto& e : s) z += (e = std::exp(e - mx));
        for (std::int64_t j = 0; j <= t; ++j)
          for (std::int64_t c = 0; c < D; ++c) att[hh * D + c] += s[j] / z * v[j][g * D + c];
      }
      const auto o = linear(att, mat(p + "attn_output.weight"), Hq * D, E);
      for (std::int64_t c = 0; c < E; ++c) x[t][c] += o[c];
      const auto xn = rms(x[t], mat(p + "ffn_norm.weight"));
      const auto g = linear(xn, mat(p + "ffn_gate.weight"), E, F);
      auto u = linear(xn, mat(p + "ffn_up.weight"), E, F);
      for (std::int64_t i = 0; i < F; ++i) u[i] *= g[i] / (1.0 + std::exp(-g[i]));
      const auto d = linear(u, mat(p + "ffn_down.weight"), F, E);
      for (std::int64_t c = 0; c < E; ++c) x[t][c] += d[c];
    }
  }
  bool tied = true;
  for (const auto& [n, d] : T.t) tied = tied && n != "output.weight";
  const auto& wout = mat(tied ? "token_embd.weight" : "output.weight");
  std::vector<std::vector<double>> logits(static_cast<std::size_t>(N));
  for (std::int64_t t = 0; t < N; ++t)
    logits[t] = linear(rms(x[t], mat("output_norm.weight")), wout, E, h.n_vocab);
  return logits;
}

std::vector<std::int32_t> some_tokens(std::size_t n, std::uint64_t seed, std::int32_t vocab) {
  CounterRng r(seed, 0);
  std::vector<std::int32_t> t(n);
  for (std::size_t i = 0; i < n; ++i)
    t[i] = static_cast<std::int32_t>(r.uniform(i) * vocab) % vocab;
  return t;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<std::vector<double>>& ref,
                    std::int64_t V, double* scale) {
  double m = 0, s = 0;
  for (std::size_t t = 0; t < ref.size(); ++t)
    for (std::int64_t v = 0; v < V; ++v) {
      m = std::max(m, std::abs(a[t * V + v] - ref[t][v]));
      s = std::max(s, std::abs(ref[t][v]));
    }
  if (scale) *scale = s;
  return m;
}

TEST(Llama, TinyModelMatchesFloat64ReferenceUntiedAndTied) {
  for (bool tied : {false, true}) {
    const TinyTensors T = make_tiny(tied);
    const std::string path = write_gguf(T, tied ? "tiny_tied.gguf" : "tiny.gguf");
    ExecContext ctx{2};
    LlamaModel m = LlamaModel::load(path, ctx);
    EXPECT_EQ(m.hparams().n_head_kv, 2);
    EXPECT_EQ(m.weights().tied(), tied);
    const auto toks = some_tokens(13, 5, 64);
    for (const char* spec : {"exact.flash", "exact.naive", "exact.reference"}) {
      m.set_attention(spec);
      KvCache c = m.make_cache(32);
      const auto got = m.forward(toks, c, ctx);
      double scale = 0;
      const double err = max_abs_diff(got, reference_logits(T, toks), 64, &scale);
      EXPECT_LT(err, 2e-5 * std::max(1.0, scale)) << spec << " tied=" << tied;
    }
  }
}

TEST(Llama, QuantizedWeightsLoadThroughDequantization) {
  // Q8_0 storage: the model must equal the float reference built from the dequantized values.
  TinyTensors T = make_tiny(false);
  const std::string path = write_gguf(T, "tiny_q8.gguf", GgmlType::Q8_0);
  GgufFile f = GgufFile::open(path);
  for (auto& [name, data] : T.t) data = dequantize_tensor(f.tensor(name));
  ExecContext ctx{1};
  LlamaModel m = LlamaModel::load(f, ctx);
  const auto toks = some_tokens(9, 6, 64);
  KvCache c = m.make_cache(16);
  const auto got = m.forward(toks, c, ctx);
  double scale = 0;
  EXPECT_LT(max_abs_diff(got, reference_logits(T, toks), 64, &scale), 2e-5 * std::max(1.0, scale));
}

TEST(Llama, KvCacheDecodingEqualsBatchedPrefill) {
  const TinyTensors T = make_tiny(false);
  ExecContext ctx{2};
  LlamaModel m = LlamaModel::load(write_gguf(T, "tiny_kv.gguf"), ctx);
  const auto toks = some_tokens(20, 7, 64);
  KvCache full = m.make_cache(20);
  const auto ref = m.forward(toks, full, ctx);
  EXPECT_EQ(full.n_past(), 20);
  for (const char* spec : {"exact.flash", "exact.naive"}) {
    m.set_attention(spec);
    KvCache c = m.make_cache(20);
    // A prefill of 7 tokens, then one token at a time.
    std::vector<std::int32_t> head(toks.begin(), toks.begin() + 7);
    std::vector<float> got = m.forward(head, c, ctx);
    for (std::size_t i = 7; i < toks.size(); ++i) {
      const auto one = m.forward({toks[i]}, c, ctx);
      got.insert(got.end(), one.begin(), one.end());
    }
    ASSERT_EQ(got.size(), ref.size());
    double err = 0;
    for (std::size_t i = 0; i < got.size(); ++i) err = std::max(err, double(std::abs(got[i] - ref[i])));
    EXPECT_LT(err, 1e-5) << spec;
  }
  // Only the last row of logits, as generation asks.
  KvCache c = m.make_cache(20);
  ForwardOptions o;
  o.logits_begin = 19;
  const auto last = m.forward(toks, c, ctx, o);
  ASSERT_EQ(last.size(), 64u);
  for (int v = 0; v < 64; ++v) EXPECT_NEAR(last[v], ref[19 * 64 + v], 1e-5);
  // A full cache refuses more tokens.
  EXPECT_THROW(m.forward({1}, c, ctx), Error);
}

// GQA → MHA: repeat each KV head's rows of Wk and Wv for its Hq/Hkv query heads.
TEST(Llama, GqaEqualsItsExactMhaForm) {
  const TinyTensors T = make_tiny(false);
  ExecContext ctx{2};
  LlamaModel gqa = LlamaModel::load(write_gguf(T, "tiny_gqa.gguf"), ctx, WeightStorage::kF32);
  ModelHParams hp = gqa.hparams();
  LlamaWeights w = gqa.weights();
  const std::int64_t E = hp.n_embd, D = hp.head_dim, Hq = hp.n_head, Hkv = hp.n_head_kv;
  const std::int64_t group = Hq / Hkv;
  for (auto& L : w.layers) {
    std::vector<float> q(L.wqkv.begin(), L.wqkv.begin() + Hq * D * E);
    const float* k = L.wqkv.data() + Hq * D * E;
    const float* v = k + Hkv * D * E;
    std::vector<float> nk, nv;
    for (std::int64_t h = 0; h < Hq; ++h) {
      nk.insert(nk.end(), k + (h / group) * D * E, k + (h / group + 1) * D * E);
      nv.insert(nv.end(), v + (h / group) * D * E, v + (h / group + 1) * D * E);
    }
    L.wqkv = q;
    L.wqkv.insert(L.wqkv.end(), nk.begin(), nk.end());
    L.wqkv.insert(L.wqkv.end(), nv.begin(), nv.end());
  }
  hp.n_head_kv = Hq;
  LlamaModel mha(hp, std::move(w));
  const auto toks = some_tokens(33, 8, 64);
  // Per-token log-probabilities through the perplexity evaluator's log-softmax.
  auto logprobs = [&](const LlamaModel& m) {
    KvCache c = m.make_cache(64);
    const auto lg = m.forward(toks, c, ctx);
    std::vector<double> out, row;
    for (std::size_t t = 0; t + 1 < toks.size(); ++t) {
      log_softmax(lg.data() + t * 64, 64, row);
      out.push_back(row[static_cast<std::size_t>(toks[t + 1])]);
    }
    return out;
  };
  const auto a = logprobs(gqa), b = logprobs(mha);
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-4) << i;
}

TEST(Llama, CaptureHookGivesPreAndPostRope) {
  const TinyTensors T = make_tiny(false);
  ExecContext ctx{1};
  LlamaModel m = LlamaModel::load(write_gguf(T, "tiny_cap.gguf"), ctx);
  const auto toks = some_tokens(6, 9, 64);
  KvCache c = m.make_cache(8);
  int calls = 0;
  ForwardOptions o;
  o.capture = [&](const QkvCapture& cap) {
    ++calls;
    EXPECT_EQ(cap.q_pre.shape, (std::array<index_t, 4>{1, 4, 6, 8}));
    EXPECT_EQ(cap.k_post.shape, (std::array<index_t, 4>{1, 2, 6, 8}));
    EXPECT_EQ(cap.v.shape, (std::array<index_t, 4>{1, 2, 6, 8}));
    // Position 0 is not rotated; position 3 is, by the adjacent-pair rule.
    for (int d = 0; d < 8; ++d) EXPECT_FLOAT_EQ(cap.q_pre(0, 1, 0, d), cap.q_post(0, 1, 0, d));
    const double th = 3.0;  // pair 0 has frequency 1
    const double a = cap.k_pre(0, 1, 3, 0), b = cap.k_pre(0, 1, 3, 1);
    EXPECT_NEAR(cap.k_post(0, 1, 3, 0), a * std::cos(th) - b * std::sin(th), 1e-5);
    EXPECT_NEAR(cap.k_post(0, 1, 3, 1), a * std::sin(th) + b * std::cos(th), 1e-5);
  };
  m.forward(toks, c, ctx, o);
  EXPECT_EQ(calls, 2);
}

TEST(Llama, PerLayerSpecs) {
  const TinyTensors T = make_tiny(false);
  ExecContext ctx{1};
  LlamaModel m = LlamaModel::load(write_gguf(T, "tiny_spec.gguf"), ctx);
  m.set_attention("exact.naive;exact.flash(block_q=16)");
  EXPECT_NE(m.attention(0).spec().find("naive"), std::string::npos);
  EXPECT_NE(m.attention(1).spec().find("block_q=16"), std::string::npos);
  EXPECT_THROW(m.set_attention("exact.naive;exact.flash;exact.flash"), Error);
  EXPECT_EQ(split_spec_list("a.b(x=1,y=2),c.d"), (std::vector<std::string>{"a.b(x=1,y=2)", "c.d"}));
}

// The blocks state their weights, cache shape and FLOPs (model/blocks/block.h), and the model's
// totals are their sums; a weight rewrite rebuilds the blocks of the layers it changes, and
// copies of a model run blocks of their own (equal logits from the original and a copy).
TEST(Llama, BlocksStateWeightsCacheAndFlops) {
  const TinyTensors T = make_tiny(false);
  const ModelHParams& h = T.hp;
  const ExecContext ctx{1};
  LlamaModel m = LlamaModel::load(write_gguf(T, "tiny_blocks.gguf"), ctx, WeightStorage::kF32);
  const std::int64_t E = h.n_embd, D = h.head_dim, Hq = h.n_head, Hkv = h.n_head_kv, F = h.n_ff;
  ASSERT_EQ(static_cast<std::int64_t>(m.layers().size()), h.n_layer);
  std::int64_t body = 0;
  for (const DecoderLayer& d : m.layers()) {
    EXPECT_EQ(d.attn_norm->kind(), "rms");
    EXPECT_EQ(d.attn_norm->width(), E);
    EXPECT_EQ(d.attn->kind(), "gqa");
    EXPECT_EQ(d.ffn->kind(), "swiglu");
    EXPECT_EQ(d.attn->weights(), (Hq + 2 * Hkv) * D * E + E * Hq * D);
    EXPECT_EQ(d.attn->weight_bytes(), 4u * static_cast<std::uint64_t>(d.attn->weights()));
    EXPECT_EQ(d.ffn->weights(), 3 * F * E);
    EXPECT_EQ(d.attn->cache_shape(), (CacheShape{Hkv * D, Hkv * D}));
    EXPECT_EQ(d.attn->cache_bytes_per_token(), 8 * Hkv * D);
    EXPECT_DOUBLE_EQ(d.attn->flops_per_token(100), 2.0 * static_cast<double>(d.attn->weights()) +
                                                       2.0 * static_cast<double>(Hq * 100 * 2 * D));
    body += d.attn->weights() + d.ffn->weights();
  }
  EXPECT_EQ(m.body_weights(), body);
  EXPECT_EQ(m.body_weights(), h.n_layer * h.layer_weights());
  EXPECT_EQ(m.kv_bytes_per_token(), h.n_layer * 8 * Hkv * D);
  EXPECT_EQ(m.make_cache(4).shapes().size(), static_cast<std::size_t>(h.n_layer));

  const LlamaModel dense = m;
  apply_bda(m, "vo");
  for (const DecoderLayer& d : m.layers()) {
    EXPECT_EQ(d.attn->kind(), "bd-v");
    EXPECT_EQ(d.attn->cache_shape(), (CacheShape{Hkv * D, Hkv * D}));
  }
  // BD of the VO pair saves D·D weights per KV head (no head falls back to dense here).
  EXPECT_EQ(dense.body_weights() - m.body_weights(), h.n_layer * Hkv * D * D);
  const std::vector<std::int32_t> toks = {3, 9, 27, 4};
  KvCache c1 = m.make_cache(4), c2 = m.make_cache(4);
  const LlamaModel copy = m;
  const std::vector<float> a = m.forward(toks, c1, ctx), b = copy.forward(toks, c2, ctx);
  EXPECT_EQ(a, b);
  // A cache made for the dense model has the same shapes here; one made for another layer
  // count is refused by name.
  KvCache other(std::vector<CacheShape>(1, CacheShape{Hkv * D, Hkv * D}), 4);
  EXPECT_THROW(m.forward(toks, other, ctx), Error);
}

TEST(Llama, RefusesOtherArchitectures) {
  GgufWriter w;
  w.set("general.architecture", GgufValue::string("gemma3"));
  const std::string path = test::temp_path("gemma.gguf");
  w.write(path);
  try {
    LlamaModel::load(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gemma3"), std::string::npos);
  }
}

TEST(LlamaDefaultModel, GreedyGenerationIsCoherent) {
  std::string path;
  try {
    path = default_model_path();
  } catch (const Error&) {
    GTEST_SKIP() << "default model not cached (scripts/fetch_data.sh)";
  }
  ExecContext ctx{2};
  GgufFile f = GgufFile::open(path);
  const Tokenizer tok = Tokenizer::from_gguf(f);
  const LlamaModel m = LlamaModel::load(f, ctx);
  EXPECT_EQ(m.hparams().n_layer, 30);
  EXPECT_EQ(m.hparams().n_head_kv, 3);
  const auto out = generate_greedy(m, tok.encode("The capital of France is"), 4, tok.eos_id(), ctx);
  EXPECT_NE(tok.decode(out).find("Paris"), std::string::npos) << tok.decode(out);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
