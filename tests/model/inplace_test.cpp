// Weights held in place (GGUF encoding, memory-mapped) against the float32 reference storage:
// the same log-probabilities within 1e-5 per token through a batched prefill (the dequantized
// panel + sgemm path) and token-by-token decoding (the quantized GEMV path), with BD Attention
// applied, with the capture hook, and on the default model when it is cached.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "numattn/core/error.h"
#include "numattn/gguf/gguf.h"
#include "numattn/model/bda_model.h"
#include "numattn/model/data.h"
#include "numattn/model/llama.h"
#include "numattn/model/tokenizer.h"
#include "numattn/quant/qgemv.h"
#include "numattn/quant/quant.h"
#include "support/tiny_llama.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

bool quick() { return std::getenv("NUMATTN_TEST_QUICK") != nullptr; }

// Natural-log softmax of each row of `logits` [rows, V], in float64.
std::vector<double> log_probs(const std::vector<float>& logits, std::int64_t V) {
  std::vector<double> out(logits.size());
  for (std::size_t r = 0; r < logits.size() / static_cast<std::size_t>(V); ++r) {
    const float* l = logits.data() + r * static_cast<std::size_t>(V);
    const double m = *std::max_element(l, l + V);
    double s = 0;
    for (std::int64_t v = 0; v < V; ++v) s += std::exp(l[v] - m);
    const double lse = m + std::log(s);
    for (std::int64_t v = 0; v < V; ++v) out[r * static_cast<std::size_t>(V) + static_cast<std::size_t>(v)] = l[v] - lse;
  }
  return out;
}

// Log-probs of every position: a prefill of `prompt` (all rows), then `steps` decode steps
// feeding the tokens `follow` one at a time.
std::vector<double> run(const LlamaModel& m, const std::vector<std::int32_t>& prompt,
                        const std::vector<std::int32_t>& follow, const ExecContext& ctx) {
  const std::int64_t V = m.hparams().n_vocab;
  KvCache c = m.make_cache(static_cast<std::int64_t>(prompt.size() + follow.size()));
  std::vector<double> all = log_probs(m.forward(prompt, c, ctx), V);
  for (std::int32_t t : follow) {
    const auto lp = log_probs(m.forward({t}, c, ctx), V);
    all.insert(all.end(), lp.begin(), lp.end());
  }
  return all;
}

// Largest |a − b| / max(1, |b|) over all positions and vocabulary entries. Relative past 1:
// the tied tiny model gives log-probs near −46, where one float32 ulp of a logit is 4e-6, so
// two float32 summation orders can differ by a few 1e-5 there and by far less near 0.
double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    d = std::max(d, std::abs(a[i] - b[i]) / std::max(1.0, std::abs(b[i])));
  return d;
}

TEST(InPlace, TinyModelEqualsFloat32StorageEveryTypeAndBda) {
  const std::vector<std::int32_t> prompt = {1, 17, 5, 63, 40, 2, 9, 33, 12, 8, 61, 0, 27};
  const std::vector<std::int32_t> follow = {4, 44, 19, 7, 50, 3};
  for (bool tied : {false, true})
    for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0,
                          GgmlType::Q4_0, GgmlType::Q4_1}) {
      SCOPED_TRACE(::testing::Message() << ggml_type_name(type) << " tied=" << tied);
      const test::TinyTensors T = test::make_tiny(tied);
      const std::string path = test::write_gguf(T, "inplace_" + ggml_type_name(type) + ".gguf", type);
      for (int threads : {1, 2}) {
        const ExecContext ctx{threads};
        LlamaModel f32 = LlamaModel::load(path, ctx, WeightStorage::kF32);
        LlamaModel inp = LlamaModel::load(path, ctx);
        ASSERT_TRUE(inp.weights().in_place());
        ASSERT_FALSE(f32.weights().in_place());
        EXPECT_EQ(inp.weights().tied(), tied);
        EXPECT_TRUE(inp.weights().layers[0].wqkv.empty());
        if (type != GgmlType::F32)
          EXPECT_LT(inp.weight_bytes_per_token(), f32.weight_bytes_per_token());
        EXPECT_LE(max_diff(run(inp, prompt, follow, ctx), run(f32, prompt, follow, ctx)), 1e-5);
        // BD Attention (VO) with float32 coefficients: W_o' and the BD projection are float32,
        // Q|K stay in place (the re-quantized form: BdaQuantized below).
        apply_bda(f32, "vo");
        apply_bda(inp, "vo", {}, BdaCoefStorage::kF32);
        const LlamaLayer& L = inp.weights().layers[1];
        EXPECT_TRUE(L.v_bd && L.wo_q.empty() && !L.wo.empty());
        EXPECT_EQ(L.wqkv_q.rows(), (4 + 2) * 8);
        EXPECT_LE(max_diff(run(inp, prompt, follow, ctx), run(f32, prompt, follow, ctx)), 1e-5);
      }
    }
}

// BD Attention on a model held in place keeps it quantized: C_stack and W_o' re-quantized (E − D
// and Hq·D are whole blocks of 32 here) to Q8_0 (the default) or to the source tensors' types.
// Against the float32-coefficient form: close for Q8_0 (the rounding of one more quantization)
// but not equal (the quantized path ran), fewer bytes per token, and prefill equal to
// token-by-token decoding (the fused decode product on two threads).
TEST(InPlace, BdaQuantizedKeepsTheModelQuantized) {
  ModelHParams hp = test::tiny_hparams();
  hp.n_embd = 128;
  hp.n_head = 4;
  hp.n_head_kv = 2;
  hp.head_dim = 32;
  hp.n_rot = 32;
  hp.n_ff = 64;
  const std::vector<std::int32_t> prompt = {1, 7, 22, 3, 40, 41, 9, 13, 50, 2, 17};
  for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q4_1})
    for (BdaCoefStorage coef : {BdaCoefStorage::kQ8_0, BdaCoefStorage::kSource}) {
      const bool to_source = coef == BdaCoefStorage::kSource;
      const std::string want = to_source ? ggml_type_name(type) : "Q8_0";
      SCOPED_TRACE(ggml_type_name(type) + (to_source ? " source" : " q8_0"));
      const std::string path =
          test::write_gguf(test::make_tiny(false, hp), "inplace_bdaq_" + ggml_type_name(type) + ".gguf", type);
      const ExecContext ctx{2};
      LlamaModel q = LlamaModel::load(path, ctx), f = q;
      const ModelBdaReport rq = apply_bda(q, "vo", {}, coef);
      const ModelBdaReport rf = apply_bda(f, "vo", {}, BdaCoefStorage::kF32);
      EXPECT_EQ(rq.coef_type, want);
      EXPECT_EQ(rf.coef_type, "F32");
      for (const LlamaLayer& L : q.weights().layers) {
        ASSERT_FALSE(L.v_bd_q.empty());
        EXPECT_EQ(L.v_bd_q.type_string(), want);
        EXPECT_EQ(L.v_bd_q.rows(), hp.n_head_kv * hp.head_dim);
        EXPECT_EQ(L.v_bd_q.cols, hp.n_embd - hp.head_dim);
        EXPECT_EQ(L.wo_q.type_string(), want);
        EXPECT_TRUE(L.wo.empty());
      }
      EXPECT_EQ(q.layer(0).attn->kind(), "bd-v");
      EXPECT_LT(q.weight_bytes_per_token(), f.weight_bytes_per_token());
      const std::vector<double> a = run(q, prompt, {5, 6}, ctx), b = run(f, prompt, {5, 6}, ctx);
      double scale = 0;
      for (double v : b) scale = std::max(scale, std::abs(v));
      const double d = max_diff(a, b);
      EXPECT_GT(d, 0.0);
      if (want == "Q8_0") EXPECT_LE(d, 0.02 * scale);
      // Prefill of prompt + one token equals prompt then that token decoded.
      KvCache c1 = q.make_cache(16), c2 = q.make_cache(16);
      std::vector<std::int32_t> all = prompt;
      all.push_back(5);
      const std::vector<float> pre = q.forward(all, c1, ctx);
      ForwardOptions last;
      last.logits_begin = static_cast<std::int64_t>(prompt.size()) - 1;
      q.forward(prompt, c2, ctx, last);
      const std::vector<float> dec = q.forward({5}, c2, ctx);
      const std::int64_t V = hp.n_vocab, off = static_cast<std::int64_t>(prompt.size()) * V;
      for (std::int64_t i = 0; i < V; ++i)
        EXPECT_NEAR(pre[static_cast<std::size_t>(off + i)], dec[static_cast<std::size_t>(i)], 1e-4);
    }
  EXPECT_THROW(parse_bda_coef("q4"), Error);
}

// Prefill by token blocks (N >= 16 per thread: each thread runs every product of a layer on its
// rows) with weights in place, 2 and 3 threads (token blocks and panel row counts that do not
// divide evenly), against float32 storage on the same threads and against the in-place model on
// 1 thread (one block): a block computed from the wrong rows or panels is off by O(1). Also with
// BD Attention (W_o' float32, Q|K in place) and with 8-bit activations (x rounded to x̂ first).
TEST(InPlace, PrefillByTokenBlocksEqualsFloat32AndOneThread) {
  std::vector<std::int32_t> prompt(quick() ? 60 : 100);
  std::mt19937 rng(7);
  for (auto& t : prompt) t = static_cast<std::int32_t>(rng() % 64);
  const std::vector<std::int32_t> follow = {4, 44, 19};
  const std::vector<GgmlType> types =
      quick() ? std::vector<GgmlType>{GgmlType::Q4_1}
              : std::vector<GgmlType>{GgmlType::Q8_0, GgmlType::Q4_1, GgmlType::F16};
  for (GgmlType type : types) {
    const std::string path =
        test::write_gguf(test::make_tiny(false), "inplace_blocks_" + ggml_type_name(type) + ".gguf", type);
    for (bool bda : {false, true})
      for (Activations act : {Activations::kF32, Activations::kQ8}) {
        if (act == Activations::kQ8 && (bda || type != GgmlType::Q4_1)) continue;
        LlamaModel one = LlamaModel::load(path, ExecContext{1});
        one.set_activations(act);
        if (bda) apply_bda(one, "vo", {}, BdaCoefStorage::kF32);
        const std::vector<double> ref1 = run(one, prompt, follow, ExecContext{1});
        for (int threads : {2, 3}) {
          SCOPED_TRACE(::testing::Message() << ggml_type_name(type) << " bda=" << bda << " q8="
                                            << (act == Activations::kQ8) << " threads=" << threads);
          ASSERT_GE(static_cast<int>(prompt.size()), 16 * threads);  // the by-tokens prefill
          const ExecContext ctx{threads};
          LlamaModel inp = LlamaModel::load(path, ctx);
          inp.set_activations(act);
          if (bda) apply_bda(inp, "vo", {}, BdaCoefStorage::kF32);
          const std::vector<double> got = run(inp, prompt, follow, ctx);
          EXPECT_LE(max_diff(got, ref1), 1e-5);
          if (act == Activations::kF32) {
            LlamaModel f32 = LlamaModel::load(path, ctx, WeightStorage::kF32);
            if (bda) apply_bda(f32, "vo");
            EXPECT_LE(max_diff(got, run(f32, prompt, follow, ctx)), 1e-5);
          }
        }
      }
  }
}

TEST(InPlace, CaptureSeesTheSameQkvAndCopiesOutliveTheLoader) {
  const test::TinyTensors T = test::make_tiny(false);
  const std::string path = test::write_gguf(T, "inplace_cap.gguf", GgmlType::Q8_0);
  const ExecContext ctx{2};
  const LlamaModel f32 = LlamaModel::load(path, ctx, WeightStorage::kF32);
  // A copy made from a temporary: the mapping lives on in the copy's weights.
  const LlamaModel inp = [&] {
    const LlamaModel tmp = LlamaModel::load(path, ctx);
    return LlamaModel(tmp);
  }();
  std::vector<std::vector<float>> a, b;
  auto grab = [](std::vector<std::vector<float>>& into) {
    return [&into](const QkvCapture& c) {
      std::vector<float> v;
      for (std::int64_t h = 0; h < c.q_post.shape[1]; ++h)
        for (std::int64_t n = 0; n < c.q_post.shape[2]; ++n)
          for (std::int64_t d = 0; d < c.q_post.shape[3]; ++d) v.push_back(c.q_post(0, h, n, d));
      into.push_back(v);
    };
  };
  const std::vector<std::int32_t> toks = {3, 9, 27, 1, 60, 22, 5};
  for (auto* pr : {&a, &b}) {
    const LlamaModel& m = pr == &a ? f32 : inp;
    KvCache c = m.make_cache(8);
    ForwardOptions o;
    o.capture = grab(*pr);
    m.forward(toks, c, ctx, o);
  }
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (std::size_t l = 0; l < 2; ++l)
    for (std::size_t i = 0; i < a[l].size(); ++i) EXPECT_NEAR(a[l][i], b[l][i], 1e-5 * (1 + std::abs(a[l][i])));
}

// The prefill path of quant_linear (more than kQuantGemvMaxBatch rows of x) on a matrix taller
// than one tile (at most 2²¹ floats and 4096 rows: 4096 rows at 32 columns), in two parts of two
// types whose boundary falls inside a tile, with a strided and accumulated y, 1 and 2 threads (64
// rows of x are enough to split it), and a smaller matrix in between, so that each thread's tile
// buffer is reused after being used for fewer rows. Each output equals the float64 product of the
// dequantize_row weights within a float32 summation bound (a wrong tile or row offset would be
// off by O(1)).
TEST(InPlace, PrefillPanelsAcrossTilesPartsAndThreads) {
  std::mt19937 g(2024);
  std::normal_distribution<float> nd(0.f, 1.f);
  const std::int64_t cols = 32;
  struct Mat {
    std::vector<std::vector<std::uint8_t>> data;
    QuantMatrix q;
    std::vector<float> wf;  // dequantize_row values, [rows, cols]
    double offset = 0;      // largest |m| of a Q4_1 block (enters the fused q·d + m rounding)
  };
  auto make = [&](std::initializer_list<std::pair<GgmlType, std::int64_t>> parts) {
    Mat m;
    m.q.cols = cols;
    m.data.reserve(parts.size());
    for (auto [type, rows] : parts) {
      std::vector<float> w(static_cast<std::size_t>(rows * cols));
      for (auto& v : w) v = nd(g) + 0.75f;  // off-centre: Q4_1 blocks get a non-zero minimum
      m.data.push_back(quantize(type, w.data(), rows * cols));
      m.q.parts.push_back({type, m.data.back().data(), rows, ggml_row_bytes(type, cols)});
      std::vector<float> d(w.size());
      dequantize_row(type, m.data.back().data(), d.data(), rows * cols);
      m.wf.insert(m.wf.end(), d.begin(), d.end());
      for (float v : d) m.offset = std::max(m.offset, 2.0 * std::abs(static_cast<double>(v)));
    }
    return m;
  };
  const Mat big = make({{GgmlType::Q8_0, 2500}, {GgmlType::Q4_1, 1633}});
  const Mat small = make({{GgmlType::Q4_1, 37}});
  ASSERT_EQ(big.q.rows(), 4133);
  auto check = [&](const Mat& m, std::int64_t n, int threads, bool accumulate, std::int64_t ldy) {
    const std::int64_t R = m.q.rows();
    SCOPED_TRACE(::testing::Message() << "rows=" << R << " n=" << n << " threads=" << threads
                                      << " accumulate=" << accumulate << " ldy=" << ldy);
    std::vector<float> x(static_cast<std::size_t>(n * cols));
    for (auto& v : x) v = nd(g);
    std::vector<float> y(static_cast<std::size_t>(n * ldy), 0.25f);
    quant_linear(ExecContext{threads}, m.q, x.data(), n, y.data(), accumulate, ldy);
    for (std::int64_t r = 0; r < n; ++r) {
      for (std::int64_t o = 0; o < R; ++o) {
        double ref = accumulate ? 0.25 : 0.0, mag = std::abs(ref);
        for (std::int64_t j = 0; j < cols; ++j) {
          const double w = m.wf[static_cast<std::size_t>(o * cols + j)];
          const double xv = x[static_cast<std::size_t>(r * cols + j)];
          ref += w * xv;
          mag += (std::abs(w) + m.offset) * std::abs(xv);
        }
        ASSERT_NEAR(y[static_cast<std::size_t>(r * ldy + o)], ref,
                    (cols + 64) * std::ldexp(mag, -23))
            << "r=" << r << " o=" << o;
      }
      // Columns past the matrix's rows are the caller's: untouched.
      for (std::int64_t o = R; o < ldy; ++o)
        ASSERT_EQ(y[static_cast<std::size_t>(r * ldy + o)], 0.25f);
    }
  };
  for (int threads : {1, 2}) {
    check(big, 64, threads, true, 4133 + 7);
    check(small, 9, threads, false, 37);
    check(big, 5, threads, false, 4133);
    check(small, 64, threads, true, 40);
  }
}

TEST(InPlace, DefaultModelLogProbsEqualFloat32Storage) {
  std::string path;
  try {
    path = default_model_path();
  } catch (const Error& e) {
    GTEST_SKIP() << e.what();
  }
  const ExecContext ctx{2};
  auto file = std::make_shared<const GgufFile>(GgufFile::open(path));
  const Tokenizer tok = Tokenizer::from_gguf(*file);
  auto ids = tok.encode(
      "It is a truth universally acknowledged, that a single man in possession of a good "
      "fortune, must be in want of a wife. However little known the feelings or views of such "
      "a man may be on his first entering a neighbourhood, this truth is so well fixed in the "
      "minds of the surrounding families.",
      tok.add_bos(), false);
  const std::size_t n_prompt = quick() ? 12 : 48, n_follow = quick() ? 2 : 6;
  ASSERT_GE(ids.size(), n_prompt + n_follow);
  const std::vector<std::int32_t> prompt(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n_prompt));
  const std::vector<std::int32_t> follow(ids.begin() + static_cast<std::ptrdiff_t>(n_prompt),
                                         ids.begin() + static_cast<std::ptrdiff_t>(n_prompt + n_follow));
  const LlamaModel inp = LlamaModel::load(file, ctx);
  const std::vector<double> a = run(inp, prompt, follow, ctx);
  const LlamaModel f32 = LlamaModel::load(*file, ctx);
  const std::vector<double> b = run(f32, prompt, follow, ctx);
  // Per token (the criterion): the log-prob each position gives the text's next token,
  // what perplexity sums.
  const std::int64_t V = inp.hparams().n_vocab;
  std::vector<double> ta, tb;
  for (std::size_t i = 0; i + 1 < n_prompt + n_follow; ++i) {
    const auto at = static_cast<std::size_t>(static_cast<std::int64_t>(i) * V + ids[i + 1]);
    ta.push_back(a[at]);
    tb.push_back(b[at]);
  }
  auto sci = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g", v);
    return std::string(buf);
  };
  const double dt = max_diff(ta, tb);
  RecordProperty("max_token_logprob_diff", sci(dt));
  EXPECT_LE(dt, 1e-5);
  // Every vocabulary entry at every position: the largest of ~10⁶ float32 summation-order
  // differences (measured 0.8e-5 – 1.05e-5 on AVX2, Release and the -O1 sanitizer build).
  const double d = max_diff(a, b);
  RecordProperty("max_logprob_diff", sci(d));
  EXPECT_LE(d, 3e-5);
  // The whole model's weights read per token: about the file's size (Q4_1 + Q8_0 output).
  EXPECT_LT(inp.weight_bytes_per_token(), file->file_size());
  EXPECT_GT(inp.weight_bytes_per_token(), file->file_size() / 2);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
