// `numattn capture` end to end on the tiny model (given a 64-token vocabulary here): the files
// hold exactly the Q/K/V of an independent float64 forward pass of the same weights on the same
// token window, the manifest describes them, and bad requests are refused by name before the
// weights are read. Also: `ppl`/`generate --attn` refuse a method that cannot run the model's
// attention problem, by its own can_run, before loading the model.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "numattn/attention/registry.h"
#include "numattn/core/npy.h"
#include "numattn/model/data.h"
#include "support/test_util.h"
#include "support/tiny_llama.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

using Result = test::CliResult;
using test::cli;
using test::expect_cli_error;

using nlohmann::json;

std::int32_t id_of(char c) { return static_cast<std::int32_t>(test::kTinyChars.find(c)) + 2; }

const test::TinyTensors& tiny() { return test::tiny_tensors(); }

using test::tiny_model_with_vocab;

std::string some_text(std::size_t n) { return test::tiny_text(n); }

// ---- independent float64 forward pass, recording each layer's q/k/v ---------------------------
// GGUF layout (model/llama.h): weights row-major [out, in]; RoPE rotates adjacent pairs
// (x[2i], x[2i+1]) of each head by pos·base^(-2i/n_rot).
struct Qkv {
  std::vector<double> q_pre, k_pre, q_post, k_post, v;  // [H, N, D]
};

std::vector<Qkv> reference_qkv(const std::vector<std::int32_t>& toks) {
  const test::TinyTensors& T = tiny();
  const auto& h = T.hp;
  const std::int64_t E = h.n_embd, D = h.head_dim, F = h.n_ff, Hq = h.n_head, Hkv = h.n_head_kv;
  const auto N = static_cast<std::int64_t>(toks.size());
  auto linear = [](const std::vector<double>& x, const std::vector<float>& w, std::int64_t in, std::int64_t out) {
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
  auto rope = [&](std::vector<double> v, std::int64_t heads, std::int64_t pos) {
    for (std::int64_t hh = 0; hh < heads; ++hh)
      for (std::int64_t i = 0; i < h.n_rot / 2; ++i) {
        const double th = static_cast<double>(pos) * std::pow(h.rope_base, -2.0 * i / static_cast<double>(h.n_rot));
        const double a = v[hh * D + 2 * i], b = v[hh * D + 2 * i + 1];
        v[hh * D + 2 * i] = a * std::cos(th) - b * std::sin(th);
        v[hh * D + 2 * i + 1] = a * std::sin(th) + b * std::cos(th);
      }
    return v;
  };
  // [N][H·D] -> [H, N, D]
  auto hnd = [&](const std::vector<std::vector<double>>& x, std::int64_t H) {
    std::vector<double> out(static_cast<std::size_t>(H * N * D));
    for (std::int64_t t = 0; t < N; ++t)
      for (std::int64_t hh = 0; hh < H; ++hh)
        for (std::int64_t d = 0; d < D; ++d) out[(hh * N + t) * D + d] = x[t][hh * D + d];
    return out;
  };
  std::vector<std::vector<double>> x(static_cast<std::size_t>(N));
  const auto& emb = T.get("token_embd.weight");
  for (std::int64_t t = 0; t < N; ++t) x[t].assign(emb.begin() + toks[t] * E, emb.begin() + (toks[t] + 1) * E);
  std::vector<Qkv> out;
  for (int l = 0; l < h.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    std::vector<std::vector<double>> q(N), k(N), v(N), qr(N), kr(N);
    for (std::int64_t t = 0; t < N; ++t) {
      const auto xn = rms(x[t], T.get(p + "attn_norm.weight"));
      q[t] = linear(xn, T.get(p + "attn_q.weight"), E, Hq * D);
      k[t] = linear(xn, T.get(p + "attn_k.weight"), E, Hkv * D);
      v[t] = linear(xn, T.get(p + "attn_v.weight"), E, Hkv * D);
      qr[t] = rope(q[t], Hq, t);
      kr[t] = rope(k[t], Hkv, t);
    }
    out.push_back({hnd(q, Hq), hnd(k, Hkv), hnd(qr, Hq), hnd(kr, Hkv), hnd(v, Hkv)});
    for (std::int64_t t = 0; t < N; ++t) {
      std::vector<double> att(static_cast<std::size_t>(Hq * D), 0.0);
      for (std::int64_t hh = 0; hh < Hq; ++hh) {
        const std::int64_t g = hh / (Hq / Hkv);
        std::vector<double> s(static_cast<std::size_t>(t + 1));
        double mx = -1e300;
        for (std::int64_t j = 0; j <= t; ++j) {
          double d = 0;
          for (std::int64_t c = 0; c < D; ++c) d += qr[t][hh * D + c] * kr[j][g * D + c];
          s[j] = d / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (auto& e : s) z += (e = std::exp(e - mx));
        for (std::int64_t j = 0; j <= t; ++j)
          for (std::int64_t c = 0; c < D; ++c) att[hh * D + c] += s[j] / z * v[j][g * D + c];
      }
      const auto o = linear(att, T.get(p + "attn_output.weight"), Hq * D, E);
      for (std::int64_t c = 0; c < E; ++c) x[t][c] += o[c];
      const auto xn = rms(x[t], T.get(p + "ffn_norm.weight"));
      const auto gt = linear(xn, T.get(p + "ffn_gate.weight"), E, F);
      auto u = linear(xn, T.get(p + "ffn_up.weight"), E, F);
      for (std::int64_t i = 0; i < F; ++i) u[i] *= gt[i] / (1.0 + std::exp(-gt[i]));
      const auto d = linear(u, T.get(p + "ffn_down.weight"), F, E);
      for (std::int64_t c = 0; c < E; ++c) x[t][c] += d[c];
    }
  }
  return out;
}

// Relative Frobenius distance of a float32 file to its float64 reference, with the shape.
double rel_error(const std::string& path, const std::vector<double>& ref, const std::vector<std::int64_t>& shape) {
  const npy::Array a = npy::read(path);
  EXPECT_EQ(a.dtype, npy::DType::kFloat32) << path;
  EXPECT_EQ(a.shape, shape) << path;
  if (a.f32.size() != ref.size()) return 1.0;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    num += (a.f32[i] - ref[i]) * (a.f32[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

// Float32 forward pass of a 2-layer model: a few hundred roundings deep, each ~eps.
constexpr double kForwardTol = 256 * test::kEpsF32;

TEST(CaptureCli, TinyModelEqualsFloat64Forward) {
  test::ScratchDir dir;
  const std::string text = dir.file("text.txt");
  std::ofstream(text) << some_text(100);
  const std::string model = tiny_model_with_vocab();
  const std::string out = dir.file("cap");
  const Result r = cli("capture --model " + model + " --text " + text +
                       " --tokens 24 --offset 7 --layers 0,1 --threads 2 --format json --out " + out);
  ASSERT_EQ(r.rc, 0) << r.out;
  // The window as ppl tokenizes it: BOS (add_bos_token) + one token per character, from offset
  // 7, with its first token replaced by BOS (--bos auto, the file's add_bos_token).
  const std::string s = some_text(100);
  std::vector<std::int32_t> all{0};
  for (char c : s) all.push_back(id_of(c));
  std::vector<std::int32_t> window(all.begin() + 7, all.begin() + 31);
  window[0] = 0;
  const auto ref = reference_qkv(window);
  const json m = json::parse(std::ifstream(out + "/manifest.json"));
  EXPECT_EQ(m["token_ids"].get<std::vector<std::int32_t>>(), window);
  EXPECT_EQ(m["text_tokens"], 101);
  EXPECT_EQ(m["tokens"], 24);
  EXPECT_EQ(m["offset"], 7);
  EXPECT_EQ(m["layers"], json({0, 1}));
  EXPECT_EQ(m["heads"], 4);
  EXPECT_EQ(m["kv_heads"], 2);
  EXPECT_EQ(m["head_dim"], 8);
  EXPECT_EQ(m["n_layer"], 2);
  EXPECT_EQ(m["rope"], "post");
  EXPECT_EQ(m["rope_theta"], 10000.0);
  EXPECT_DOUBLE_EQ(m["scale"].get<double>(), 1.0 / std::sqrt(8.0));
  EXPECT_EQ(m["model"], model);
  EXPECT_EQ(m["model_name"], "tiny");
  EXPECT_EQ(m["text"], text);
  for (int l = 0; l < 2; ++l) {
    const std::string p = out + "/layer" + std::to_string(l) + "_";
    EXPECT_LT(rel_error(p + "q.npy", ref[l].q_post, {4, 24, 8}), kForwardTol) << l;
    EXPECT_LT(rel_error(p + "k.npy", ref[l].k_post, {2, 24, 8}), kForwardTol) << l;
    EXPECT_LT(rel_error(p + "v.npy", ref[l].v, {2, 24, 8}), kForwardTol) << l;
  }
  // Pre-RoPE, one layer, keep the window's first token as it is.
  const std::string out2 = dir.file("cap_pre");
  ASSERT_EQ(cli("capture --model " + model + " --text " + text + " --tokens 24 --offset 7 --layers 1 "
                "--pre-rope --bos keep --no-progress --out " + out2).rc, 0);
  window[0] = all[7];
  const auto ref2 = reference_qkv(window);
  EXPECT_LT(rel_error(out2 + "/layer1_q.npy", ref2[1].q_pre, {4, 24, 8}), kForwardTol);
  EXPECT_LT(rel_error(out2 + "/layer1_k.npy", ref2[1].k_pre, {2, 24, 8}), kForwardTol);
  EXPECT_LT(rel_error(out2 + "/layer1_v.npy", ref2[1].v, {2, 24, 8}), kForwardTol);
  EXPECT_FALSE(std::filesystem::exists(out2 + "/layer0_q.npy"));
  const json m2 = json::parse(std::ifstream(out2 + "/manifest.json"));
  EXPECT_EQ(m2["rope"], "pre");
  EXPECT_EQ(m2["bos_replaced"], false);

  // The capture is a problem for run: layer 1 with the model's causal rule.
  const Result run = cli("run --qkv " + out + " --layer 1 --causal bottom-right --method exact.naive "
                         "--format json --threads 1");
  ASSERT_EQ(run.rc, 0) << run.out;
  const json j = json::parse(run.out.substr(run.out.find('{')));
  EXPECT_EQ(j["source"], "capture " + out + " layer 1");
  EXPECT_EQ(j["heads"], 4);
  EXPECT_EQ(j["kv_heads"], 2);
  EXPECT_EQ(j["n"], 24);
  EXPECT_LT(j["rel_fro_error"].get<double>(), 1e-5);
}

TEST(CaptureCli, BadRequestsAreRefusedByName) {
  test::ScratchDir dir;
  const std::string text = dir.file("text.txt");
  std::ofstream(text) << some_text(100);
  const std::string base = "capture --no-progress --model " + tiny_model_with_vocab() + " --text " + text;
  const std::string out = " --out " + dir.file("o");
  expect_cli_error(base + " --layers 2" + out, {"error: --layers: ", "layer 2", "n_layer = 2"});
  expect_cli_error(base + " --layers 0,x" + out, {"error: --layers: ", "'x'"});
  expect_cli_error(base + " --tokens 0" + out, {"error: --tokens: "});
  expect_cli_error(base + " --tokens 300" + out, {"error: --tokens: ", "300", "256", "llama.context_length"});
  expect_cli_error(base + " --tokens 50 --offset 60" + out, {"error: --tokens: ", "101 tokens", "--offset 60"});
  expect_cli_error(base + " --offset -1" + out, {"error: --offset: "});
  expect_cli_error(base + " --bos never" + out, {"error: --bos: "});
  std::ofstream(dir.file("file")) << "x";
  expect_cli_error(base + " --out " + dir.file("file"), {"error: --out: ", "not a directory"});
  expect_cli_error(base + " --out " + text, {"error: --out: ", "--text"});
  // An input inside the output directory under an output's name.
  std::filesystem::create_directories(dir.file("d"));
  std::ofstream(dir.file("d/layer0_q.npy")) << some_text(100);
  expect_cli_error("capture --model " + tiny_model_with_vocab() + " --text " + dir.file("d/layer0_q.npy") +
                   " --out " + dir.file("d"),
               {"--text", "layer0_q.npy"});
  EXPECT_FALSE(std::filesystem::exists(dir.file("o")));
}

// A registered method that cannot run a causal GQA problem (e.g. one without causal support),
// or nullptr when every method can.
// Every registered method runs causal GQA problems at its defaults (natively or by the causal
// recursion); the identity projection of Linformer with k < Nk is refused by its own can_run.
const char* const kSpecRefusingTheModel = "lowrank.linformer(k=8,projection=identity)";

TEST(CaptureCli, PplAndGenerateRefuseAMethodThatCannotRunTheModel) {
  test::ScratchDir dir;
  const std::string text = dir.file("text.txt");
  std::ofstream(text) << some_text(600);
  const std::string model = tiny_model_with_vocab();
  // An exact method runs: the whole ppl protocol on the tiny model.
  const Result ok = cli("ppl --model " + model + " --text " + text +
                        " --ctx 32 --chunks 2 --no-progress --format json --attn 'exact.naive;exact.flash'");
  ASSERT_EQ(ok.rc, 0) << ok.out;
  const json j = json::parse(ok.out.substr(ok.out.find('{')));
  EXPECT_GT(j["ppl"].get<double>(), 1.0);
  // Refused before the weights load, naming the method, the layer and can_run's reason.
  const std::string spec = std::string("'") + kSpecRefusingTheModel + "'", name = "lowrank.linformer(k=8,";
  expect_cli_error("ppl --model " + model + " --text " + text + " --ctx 32 --attn 'exact.flash;" +
                       kSpecRefusingTheModel + "'",
                   {"error: --attn: ", name, "layer 1", "causal bottom-right", "4 query heads over 2 KV heads"});
  expect_cli_error("ppl --model " + model + " --text " + text + " --ctx 32 --attn " + spec,
                   {"error: --attn: ", name, "layers"});
  expect_cli_error("ppl --model " + model + " --text " + text + " --ctx 32 --baseline " + spec,
                   {"error: --baseline: ", name});
  expect_cli_error("generate --model " + model + " --prompt 'it is' --max-tokens 3 --attn " + spec,
                   {"error: --attn: ", name});
}

TEST(CaptureCli, DefaultModelShapesAndRun) {
  try {
    default_model_path();
  } catch (const Error&) {
    GTEST_SKIP() << "default model not cached";
  }
  // SmolLM2-135M: 30 layers, 9 query heads over 3 KV heads, head dim 64. A short text of our
  // own keeps the test fast (the default text takes seconds to tokenize).
  test::ScratchDir dir;
  const std::string text = dir.file("t.txt");
  std::ofstream(text) << some_text(400);
  const std::string out = dir.file("cap");
  const Result r = cli("capture --model default --text " + text + " --tokens 32 --layers 0,29 "
                       "--no-progress --threads 2 --out " + out);
  ASSERT_EQ(r.rc, 0) << r.out;
  const json m = json::parse(std::ifstream(out + "/manifest.json"));
  EXPECT_EQ(m["n_layer"], 30);
  EXPECT_EQ(m["heads"], 9);
  EXPECT_EQ(m["kv_heads"], 3);
  EXPECT_EQ(m["head_dim"], 64);
  EXPECT_EQ(m["rope_theta"], 100000.0);
  EXPECT_EQ(npy::read(out + "/layer29_q.npy").shape, (std::vector<std::int64_t>{9, 32, 64}));
  EXPECT_EQ(npy::read(out + "/layer29_v.npy").shape, (std::vector<std::int64_t>{3, 32, 64}));
  expect_cli_error("capture --model default --text " + text + " --layers 30 --out " + out,
               {"error: --layers: ", "layer 30", "n_layer = 30"});
  const Result run = cli("run --qkv " + out + " --layer 29 --causal bottom-right --format json");
  ASSERT_EQ(run.rc, 0) << run.out;
  EXPECT_LT(json::parse(run.out.substr(run.out.find('{')))["rel_fro_error"].get<double>(), 1e-5);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
