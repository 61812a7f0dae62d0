// `numattn analyze` end to end on the tiny model (2 layers, 4 query heads over 2 KV heads,
// head dim 8, a character vocabulary): every output file exists with the schema the report
// reads (docs/analysis.md), the numbers agree with each other and with a float64 recomputation
// from `numattn capture` of the same window, and bad requests are refused by name. On the tiny
// Gemma 3 (sliding-window layers 0 and 2, window 4) the analysis is that of the windowed
// attention the model computes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "numattn/analysis/spectra.h"
#include "numattn/core/npy.h"
#include "support/test_util.h"
#include "support/tiny_llama.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

using Result = test::CliResult;
using test::cli;
using test::expect_cli_error;

using nlohmann::json;

// A CSV file as its header and rows of cells (cells may be "quoted, with commas").
struct Csv {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  std::size_t col(const std::string& name) const {
    for (std::size_t i = 0; i < header.size(); ++i)
      if (header[i] == name) return i;
    ADD_FAILURE() << "no column " << name;
    return 0;
  }
};

std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (char c : line) {
    if (c == '"') quoted = !quoted;
    else if (c == ',' && !quoted) out.emplace_back();
    else out.back() += c;
  }
  return out;
}

Csv read_csv(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  Csv c;
  std::string line;
  if (std::getline(f, line)) c.header = split_csv_line(line);
  while (std::getline(f, line)) {
    c.rows.push_back(split_csv_line(line));
    EXPECT_EQ(c.rows.back().size(), c.header.size()) << path << ": " << line;
  }
  return c;
}

TEST(AnalyzeCli, WritesTheSchemaOnATinyWindow) {
  test::ScratchDir dir;
  const std::string text = dir.file("text.txt"), out = dir.file("an");
  std::ofstream(text) << test::tiny_text(200);
  const std::string model = test::tiny_model_with_vocab();
  const std::string window = " --model " + model + " --text " + text + " --tokens 24 --offset 3 --no-progress";
  const Result r = cli("analyze" + window + " --layers all --predict --threads 2 --format json --out " + out);
  ASSERT_EQ(r.rc, 0) << r.out;
  const json a = json::parse(r.out);
  const auto hp = test::tiny_hparams();
  const std::int64_t N = 24, D = hp.head_dim, Hq = hp.n_head, Hkv = hp.n_head_kv;

  // analysis.json: metadata and the three findings.
  std::ifstream af(out + "/analysis.json");
  EXPECT_EQ(json::parse(af), a);
  EXPECT_EQ(a["tokens"], N);
  EXPECT_EQ(a["layers"], json::array({0, 1}));
  EXPECT_EQ(a["heads"], json::array({0, 1, 2, 3}));
  EXPECT_EQ(a["head_dim"], D);
  EXPECT_EQ(a["scale"], 1 / std::sqrt(static_cast<double>(D)));
  EXPECT_EQ(a["layer_window"], json({{"0", 0}, {"1", 0}}));  // Llama: no sliding window
  EXPECT_FALSE(a["findings"][1]["evidence"].contains("heads_windowed"));
  EXPECT_FALSE(a["predict"].contains("skipped"));
  EXPECT_NE(a["precision"].get<std::string>().find("float64"), std::string::npos);
  ASSERT_EQ(a["findings"].size(), 3u);
  const std::vector<std::string> ids = {"qk_low_rank", "a_strong_decay", "p_weaker_than_a"};
  for (std::size_t i = 0; i < 3; ++i) {
    const json& f = a["findings"][i];
    EXPECT_EQ(f["id"], ids[i]);
    EXPECT_TRUE(f["holds"].is_boolean() || f["holds"] == "partly") << f.dump();
    EXPECT_TRUE(f["statement"].is_string() && f["evidence"].is_object());
  }
  // S = QKᵀ has rank ≤ d = 8 < N = 24 in every head: the low-rank half of finding 1 always holds.
  EXPECT_LE(a["findings"][0]["evidence"]["max_rank_qk_1e-10"].get<double>(), static_cast<double>(D));
  EXPECT_EQ(a["findings"][1]["evidence"]["heads"], 2 * Hq);

  // spectra.csv: every (layer, head, matrix) with its min(rows, cols) values, descending.
  const Csv sp = read_csv(out + "/spectra.csv");
  EXPECT_EQ(sp.header, (std::vector<std::string>{"layer", "head", "matrix", "index", "sigma"}));
  std::map<std::string, std::vector<double>> sig;
  for (const auto& row : sp.rows) sig[row[0] + "/" + row[1] + "/" + row[2]].push_back(std::stod(row[4]));
  EXPECT_EQ(sig.size(), static_cast<std::size_t>(2 * (Hq * 6 + Hkv * 3)));
  for (const auto& [key, s] : sig) {
    const std::string m = key.substr(key.rfind('/') + 1);
    const bool square = m == "qk" || m == "a" || m == "p" || m == "a_exp";
    EXPECT_EQ(s.size(), static_cast<std::size_t>(square ? N : D)) << key;
    for (std::size_t i = 1; i < s.size(); ++i) EXPECT_GE(s[i - 1], s[i]) << key;
  }
  EXPECT_TRUE(sig.count("1/3/q_pre") && sig.count("1/1/k_pre") && sig.count("0/1/v") && sig.count("0/2/p"));

  // stats.csv agrees with spectra.csv.
  const Csv st = read_csv(out + "/stats.csv");
  EXPECT_EQ(st.header, (std::vector<std::string>{"layer", "head", "matrix", "rank_rel_1e-2", "rank_energy_90",
                                                 "stable_rank", "sigma1", "n"}));
  EXPECT_EQ(st.rows.size(), sig.size());
  for (const auto& row : st.rows) {
    const auto& s = sig[row[0] + "/" + row[1] + "/" + row[2]];
    analysis::Vector v(static_cast<std::int64_t>(s.size()));
    for (std::size_t i = 0; i < s.size(); ++i) v[static_cast<std::int64_t>(i)] = s[i];
    EXPECT_EQ(std::stoll(row[3]), analysis::numerical_rank(v, 1e-2)) << row[2];
    EXPECT_EQ(std::stoll(row[7]), v.size());
    EXPECT_NEAR(std::stod(row[6]), s[0], 1e-8 * s[0]);
  }

  // rows.csv: one row per (layer, query head); entropies within [0, ln N]; masses in (0, 1].
  const Csv rw = read_csv(out + "/rows.csv");
  EXPECT_EQ(rw.header, (std::vector<std::string>{"layer", "head", "entropy_mean", "entropy_min", "entropy_max",
                                                 "topk_mass_k8", "topk_mass_k32", "topk_mass_k_0.1n",
                                                 "sink_columns"}));
  ASSERT_EQ(rw.rows.size(), static_cast<std::size_t>(2 * Hq));
  for (const auto& row : rw.rows) {
    EXPECT_LE(std::stod(row[3]), std::stod(row[2]));
    EXPECT_LE(std::stod(row[2]), std::stod(row[4]));
    EXPECT_EQ(std::stod(row[3]), 0.0);  // row 0 sees one key
    EXPECT_LE(std::stod(row[4]), std::log(static_cast<double>(N)) + 1e-12);
    EXPECT_DOUBLE_EQ(std::stod(row[6]), 1.0);  // 32 keys ≥ every row's 24
    EXPECT_LE(std::stod(row[7]), std::stod(row[5]) + 1e-12);  // ceil(0.1·visible) ≤ 3 ≤ 8
  }

  // panels.json: a 20×20 grid per (layer, head), rows max-normalised.
  std::ifstream pf(out + "/panels.json");
  const json pj = json::parse(pf);
  EXPECT_EQ(pj["tokens"], N);
  ASSERT_EQ(pj["panels"].size(), static_cast<std::size_t>(2 * Hq));
  for (const json& p : pj["panels"]) {
    ASSERT_EQ(p["grid"].size(), 20u);
    for (std::size_t i = 0; i < 20; ++i) {
      ASSERT_EQ(p["grid"][i].size(), 20u);
      double mx = 0;
      for (std::size_t j = 0; j < 20; ++j) {
        mx = std::max(mx, p["grid"][i][j].get<double>());
        if (j > i) {
          EXPECT_EQ(p["grid"][i][j], 0.0);  // causal
        }
      }
      EXPECT_DOUBLE_EQ(mx, 1.0);
    }
    EXPECT_EQ(p["block_grid"].size(), 20u);
  }

  // predict.csv: the default methods per (layer, head); measured ≥ predicted where it is a bound.
  const Csv pr = read_csv(out + "/predict.csv");
  for (const char* c : {"layer", "head", "method", "param", "predicted_error", "measured_error"})
    pr.col(c);  // fails the test if missing
  EXPECT_EQ(pr.header[0], "layer");
  EXPECT_EQ(pr.rows.size(), static_cast<std::size_t>(2 * Hq * 8));
  for (const auto& row : pr.rows) {
    const double p = std::stod(row[pr.col("predicted_error")]), m = std::stod(row[pr.col("measured_error")]);
    EXPECT_EQ(row[pr.col("bound")], "true") << row[2];
    EXPECT_GE(m, p - 1e-5) << row[2] << " " << row[3];
    EXPECT_EQ(row[pr.col("window")], "0");
  }
  EXPECT_EQ(a["predict"]["bound_violations"], 0);

  // The numbers are those of the captured window: P of layer 1, head 3 (KV head 1) from
  // `numattn capture` of the same tokens, in float64.
  const std::string cap = dir.file("cap");
  ASSERT_EQ(cli("capture" + window + " --layers 1 --threads 2 --out " + cap).rc, 0);  // same partition
  const auto q = npy::read(cap + "/layer1_q.npy").as_f32(), k = npy::read(cap + "/layer1_k.npy").as_f32();
  const std::vector<double> qd(q.begin(), q.end()), kd(k.begin(), k.end());
  const auto hm = analysis::head_matrices(analysis::head_matrix(qd, 3, N, D), analysis::head_matrix(kd, 1, N, D),
                                          1 / std::sqrt(static_cast<double>(D)), Causal::kBottomRight);
  const analysis::Vector want = analysis::singular_values(hm.p, "P");
  const auto& got = sig["1/3/p"];
  for (std::int64_t i = 0; i < N; ++i) EXPECT_NEAR(got[static_cast<std::size_t>(i)], want[i], 1e-9 * want[0]) << i;

  // A text table by default.
  const Result md = cli("analyze" + window + " --layers 0 --heads 1 --out " + dir.file("md"));
  ASSERT_EQ(md.rc, 0) << md.out;
  EXPECT_NE(md.out.find("qk_low_rank"), std::string::npos) << md.out;
  EXPECT_FALSE(std::filesystem::exists(dir.file("md") + "/predict.csv"));
}

// The tiny Gemma 3 with the tiny model's vocabulary (written once per process).
std::string tiny_gemma_with_vocab() {
  static const std::string path =
      test::add_tiny_vocab(test::write_gguf(test::make_tiny_gemma(), "analyze_tiny_gemma_base.gguf"),
                           "analyze_tiny_gemma_vocab.gguf", "tiny gemma");
  return path;
}

TEST(AnalyzeCli, SlidingWindowLayersAreAnalysedWithTheirWindow) {
  // Layers 0 and 2 local (window W = 4), layer 1 global; 4 query heads over 1 KV head, d = 16.
  test::ScratchDir dir;
  const std::string text = dir.file("text.txt"), out = dir.file("an");
  std::ofstream(text) << test::tiny_text(200);
  const std::string model = tiny_gemma_with_vocab();
  const std::string window = " --model " + model + " --text " + text + " --tokens 24 --offset 3 --no-progress";
  const Result r = cli("analyze" + window + " --layers all --predict --threads 2 --format json --out " + out);
  ASSERT_EQ(r.rc, 0) << r.out;
  const json a = json::parse(r.out);
  const std::int64_t N = 24, D = 16, Hq = 4, W = 4;
  EXPECT_EQ(a["layer_window"], json({{"0", W}, {"1", 0}, {"2", W}}));
  EXPECT_EQ(a["scale"], 0.25);  // the model's attention scale, 1/sqrt(16)
  EXPECT_EQ(a["head_dim"], D);
  EXPECT_EQ(a["findings"][1]["evidence"]["heads"], 3 * Hq);
  EXPECT_EQ(a["findings"][1]["evidence"]["heads_windowed"], 2 * Hq);
  EXPECT_EQ(a["findings"][2]["evidence"]["heads_windowed"], 2 * Hq);

  // rows.csv: a local row sees at most W keys: entropy ≤ ln W, the top 8 keys hold all the mass.
  const Csv rw = read_csv(out + "/rows.csv");
  ASSERT_EQ(rw.rows.size(), static_cast<std::size_t>(3 * Hq));
  for (const auto& row : rw.rows) {
    const bool local = row[0] != "1";
    EXPECT_LE(std::stod(row[4]), std::log(static_cast<double>(local ? W : N)) + 1e-12) << row[0];
    if (local) {
      EXPECT_NEAR(std::stod(row[5]), 1.0, 1e-12) << row[0];
    }
  }

  // panels.json: the top-left block of a local layer's P is a band of W keys.
  std::ifstream pf(out + "/panels.json");
  const json pj = json::parse(pf);
  ASSERT_EQ(pj["panels"].size(), static_cast<std::size_t>(3 * Hq));
  bool saw_beyond = false;
  for (const json& p : pj["panels"]) {
    const bool local = p["layer"] != 1;
    for (std::int64_t i = 0; i < 20; ++i)
      for (std::int64_t j = 0; j < 20; ++j) {
        const double x = p["grid"][static_cast<std::size_t>(i)][static_cast<std::size_t>(j)].get<double>();
        if (j > i || (local && j <= i - W)) {
          EXPECT_EQ(x, 0.0) << p["layer"] << " " << i << "," << j;
        } else if (!local && j <= i - W && x > 0) {
          saw_beyond = true;  // the global layer attends beyond the window
        }
      }
  }
  EXPECT_TRUE(saw_beyond);

  // The spectra are those of the windowed P from `numattn capture` of the same tokens, and not
  // those of the causal one.
  const Csv sp = read_csv(out + "/spectra.csv");
  std::map<std::string, std::vector<double>> sig;
  for (const auto& row : sp.rows) sig[row[0] + "/" + row[1] + "/" + row[2]].push_back(std::stod(row[4]));
  const std::string cap = dir.file("cap");
  ASSERT_EQ(cli("capture" + window + " --layers 0,1 --threads 2 --out " + cap).rc, 0);
  for (const int layer : {0, 1}) {
    const std::string l = std::to_string(layer);
    const auto q = npy::read(cap + "/layer" + l + "_q.npy").as_f32(), k = npy::read(cap + "/layer" + l + "_k.npy").as_f32();
    const std::vector<double> qd(q.begin(), q.end()), kd(k.begin(), k.end());
    const analysis::Matrix qm = analysis::head_matrix(qd, 2, N, D), km = analysis::head_matrix(kd, 0, N, D);
    const std::int64_t w = layer == 0 ? W : 0;
    const analysis::Vector want =
        analysis::singular_values(analysis::head_matrices(qm, km, 0.25, Causal::kBottomRight, w).p, "P");
    const auto& got = sig[l + "/2/p"];
    ASSERT_EQ(got.size(), static_cast<std::size_t>(N));
    for (std::int64_t i = 0; i < N; ++i) EXPECT_NEAR(got[static_cast<std::size_t>(i)], want[i], 1e-9 * want[0]) << l << " " << i;
    if (layer == 0) {
      const analysis::Vector causal =
          analysis::singular_values(analysis::head_matrices(qm, km, 0.25, Causal::kBottomRight).p, "P");
      double diff = 0;
      for (std::int64_t i = 0; i < N; ++i) diff = std::max(diff, std::abs(causal[i] - got[static_cast<std::size_t>(i)]));
      EXPECT_GT(diff, 1e-6);
    }
  }

  // predict.csv: every method on the global layer; on the local ones every method but Nyström
  // (non-causal, no window) and the SVD oracle (no window: the causal recursion runs it, whose
  // blocks, not the layer's P, set its error), which analysis.json reports as skipped there.
  const Csv pr = read_csv(out + "/predict.csv");
  std::map<std::string, int> per_layer;
  for (const auto& row : pr.rows) {
    const std::string layer = row[pr.col("layer")], method = row[pr.col("method")];
    ++per_layer[layer];
    EXPECT_EQ(row[pr.col("window")], layer == "1" ? "0" : "4") << method;
    if (layer != "1") {
      EXPECT_EQ(method.find("nystrom"), std::string::npos);
      EXPECT_EQ(method.find("lowrank.svd"), std::string::npos);
    }
    EXPECT_EQ(row[pr.col("bound")], "true") << method;
    EXPECT_GE(std::stod(row[pr.col("measured_error")]), std::stod(row[pr.col("predicted_error")]) - 1e-5) << method;
  }
  EXPECT_EQ(per_layer["0"], Hq * 4);
  EXPECT_EQ(per_layer["1"], Hq * 8);
  EXPECT_EQ(per_layer["2"], Hq * 4);
  const json& skipped = a["predict"]["skipped"];
  ASSERT_EQ(skipped.size(), 8u);  // 2 Nyström and 2 SVD specs × 2 local layers
  for (const json& s : skipped) {
    EXPECT_NE(s["layer"], 1);
    EXPECT_EQ(s["window"], W);
    const std::string m = s["method"].get<std::string>();
    EXPECT_TRUE(m.find("lowrank.nystrom") != std::string::npos || m.find("lowrank.svd") != std::string::npos) << m;
    EXPECT_NE(s["reason"].get<std::string>().find("window"), std::string::npos);
  }
  EXPECT_EQ(a["predict"]["rows"], Hq * 16);
  EXPECT_EQ(a["predict"]["bound_violations"], 0);
}

TEST(AnalyzeCli, BadRequestsAreRefusedByName) {
  test::ScratchDir dir;
  const std::string text = dir.file("text.txt");
  std::ofstream(text) << test::tiny_text(100);
  const std::string base = "analyze --no-progress --model " + test::tiny_model_with_vocab() + " --text " + text;
  const std::string out = " --out " + dir.file("o");
  expect_cli_error(base + " --tokens 16 --heads 4" + out, {"error: --heads: ", "head 4", "n_head = 4"});
  expect_cli_error(base + " --tokens 16 --heads x" + out, {"error: --heads: ", "'x'"});
  expect_cli_error(base + " --tokens 16 --layers 2" + out, {"error: --layers: ", "n_layer = 2"});
  expect_cli_error(base + " --tokens 300" + out, {"error: --tokens: ", "llama.context_length"});
  expect_cli_error(base + " --tokens 90 --offset 20" + out, {"error: --tokens: ", "101 tokens"});
  expect_cli_error(base + " --tokens 16 --predict --methods exact.flash" + out, {"error: --methods: ", "exact.flash"});
  expect_cli_error(base + " --tokens 16 --predict --methods 'lowrank.svd(rank=0)'" + out, {"error: --methods: ", "rank"});
  expect_cli_error(base + " --tokens 16 --methods lowrank.svd" + out, {"error: --methods: ", "--predict"});
  expect_cli_error(base + " --tokens 16 --out " + text, {"error: --out: ", "--text"});
  EXPECT_FALSE(std::filesystem::exists(dir.file("o")));
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
