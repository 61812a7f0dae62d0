// --transform end to end (transform/pipeline.h): `numattn transforms` lists the registry; bad
// pipelines are refused by the one parser before any file is opened; the older flags are aliases
// of the same pipeline (same row, bit for bit, and one deprecation line naming it); `convert`
// records the pipeline in the file, `gguf-info` shows it, and the file runs as the pipeline does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "numattn/core/error.h"
#include "numattn/model/data.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

using Result = test::CliResult;
using test::cli;

nlohmann::json json_of(const std::string& args, std::string* err = nullptr) {
  Result r;
  const std::string err_path = test::temp_path("transform_cli_stderr.txt");
  r.rc = test::run_command(std::string(NUMATTN_CLI_PATH) + " " + args + " --format json 2>" + err_path, &r.out);
  EXPECT_EQ(r.rc, 0) << args << "\n" << r.out;
  if (err != nullptr) {
    std::FILE* f = std::fopen(err_path.c_str(), "rb");
    err->clear();
    if (f != nullptr) {
      char buf[4096];
      std::size_t n = 0;
      while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) err->append(buf, n);
      std::fclose(f);
    }
  }
  std::remove(err_path.c_str());
  const auto j = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.out;
  return j.is_array() && !j.empty() ? j.at(0) : j;
}

bool have_default() {
  if (std::getenv("NUMATTN_TEST_QUICK") != nullptr) return false;
  try {
    default_model_path();
    default_text_path();
    return true;
  } catch (const Error&) {
    return false;
  }
}

TEST(TransformCli, TransformsListsTheRegistry) {
  const Result md = cli("transforms");
  ASSERT_EQ(md.rc, 0) << md.out;
  for (const char* name : {"| mla |", "| bda |", "| tensor.vo_cp |", "| tensor.qk_cp |", "| tensor.tucker_qkvo |",
                           "| tensor.tucker_ffn |", "| tensor.tucker_heads |", "TransMLA", "calib_tokens=2048"})
    EXPECT_NE(md.out.find(name), std::string::npos) << name << "\n" << md.out;
  const Result js = cli("transforms --format json");
  ASSERT_EQ(js.rc, 0) << js.out;
  const auto j = nlohmann::json::parse(js.out);
  ASSERT_EQ(j.size(), 7u);
  EXPECT_EQ(j[0]["name"], "mla");
  EXPECT_EQ(j[0]["parameters"][0]["name"], "rank");
  EXPECT_EQ(j[0]["parameters"][0]["required"], false);  // rank or budget: checked by the pipeline
  EXPECT_EQ(j[0]["parameters"][1]["default"], "1");
}

TEST(TransformCli, BadPipelinesAreRefusedBeforeAnyFileIsOpened) {
  const std::string none = " --model /nonexistent/model.gguf --text /nonexistent/text.txt";
  for (const std::string& cmd : std::vector<std::string>{"ppl" + none, "bench-model --model /nonexistent/m.gguf",
                                                         "generate --prompt hi --model /nonexistent/m.gguf",
                                                         "capture --out /tmp/numattn_never --model /nonexistent/m.gguf",
                                                         "convert --out /tmp/x.gguf --model /nonexistent/m.gguf"}) {
    for (const auto& [pipeline, says] : std::vector<std::pair<std::string, std::string>>{
             {"'mla(rank=8)||bda(pairs=vo)'", "empty item"},
             {"'mla(rank=8'", "never closed"},
             {"'nope(rank=8)'", "unknown transform 'nope'"},
             {"'mla(rank=8,depth=2)'", "unknown parameter 'depth'"},
             {"'mla(rank=8,rope_heads=0)'", "out of range"},
             {"'bda(pairs=vo)|mla(rank=8)'", "mla must come first"}}) {
      const Result r = cli(cmd + " --transform " + pipeline);
      EXPECT_EQ(r.rc, 1) << cmd << " " << pipeline << "\n" << r.out;
      EXPECT_NE(r.out.find("error: --transform: "), std::string::npos) << cmd << " " << pipeline << "\n" << r.out;
      EXPECT_NE(r.out.find(says), std::string::npos) << cmd << " " << pipeline << "\n" << r.out;
      EXPECT_EQ(r.out.find("nonexistent"), std::string::npos) << r.out;
    }
  }
  // capture writes the q, k, v of GQA layers: the stages that replace them are refused, by name.
  const Result cap = cli("capture --out /tmp/numattn_never --model /nonexistent/m.gguf --transform 'mla(rank=8)'");
  EXPECT_EQ(cap.rc, 1) << cap.out;
  EXPECT_NE(cap.out.find("mla replaces the GQA layers"), std::string::npos) << cap.out;
  EXPECT_EQ(cap.out.find("nonexistent"), std::string::npos) << cap.out;
  // The pipeline or the older flags, not both.
  const Result both = cli("ppl" + none + " --transform 'mla(rank=8)' --bda vo");
  EXPECT_EQ(both.rc, 1) << both.out;
  EXPECT_NE(both.out.find("give the transforms once: --bda"), std::string::npos) << both.out;
  // The composition rules of the older flags hold for the pipeline.
  const Result mla_vo = cli("ppl" + none + " --mla-rank 8 --tensor vo-cp:rank=8");
  EXPECT_EQ(mla_vo.rc, 1) << mla_vo.out;
  EXPECT_NE(mla_vo.out.find("after mla only tensor.qk_cp applies"), std::string::npos) << mla_vo.out;
}

TEST(TransformCli, OlderFlagsAreAliasesOfThePipeline) {
  if (!have_default()) GTEST_SKIP() << "default model not cached";
  const std::string base = "ppl --ctx 128 --chunks 2 --threads 2 --no-progress";
  std::string err_alias, err_new;
  const auto alias = json_of(base + " --mla-rank 64 --rope-heads 1 --calib-tokens 512 --bda vo --bda-coef f32",
                             &err_alias);
  const auto spec = json_of(base + " --transform 'mla(rank=64,rope_heads=1,calib_tokens=512)|bda(pairs=vo,coef=f32)'",
                            &err_new);
  const std::string canonical =
      "mla(rank=64,rope_heads=1,rope_dims=0,freqfold=1,balance=0,budget=0,calib=default,calib_tokens=512,calib_mode=two_pass,"
      "exec=absorbed,weights=f32)|bda(pairs=vo,coef=f32)";
  EXPECT_EQ(alias.at("transform"), canonical);
  EXPECT_EQ(spec.at("transform"), canonical);
  for (const char* k : {"ppl", "ppl_baseline", "kld_mean", "kld_p99", "top1_agreement", "logprob_max_abs_diff",
                        "mla_latent", "bda_params_saved"})
    EXPECT_EQ(alias.at(k), spec.at(k)) << k;
  EXPECT_NE(err_alias.find("deprecated; the same: --transform \"" + canonical + "\""), std::string::npos) << err_alias;
  EXPECT_EQ(err_new.find("deprecated"), std::string::npos) << err_new;
  // balance=0: four multipliers scored on the calibration tokens, the lowest chosen and reported.
  std::istringstream lines(err_new);
  std::string line;
  std::vector<std::pair<double, double>> scored;
  double chose = -1;
  while (std::getline(lines, line)) {
    double b = 0, ppl = 0;
    if (std::sscanf(line.c_str(), "mla balance %lf: calibration ppl %lf", &b, &ppl) == 2) scored.emplace_back(b, ppl);
    else if (std::sscanf(line.c_str(), "mla balance: chose %lf", &b) == 1) chose = b;
  }
  ASSERT_EQ(scored.size(), 4u) << err_new;
  const auto best = std::min_element(scored.begin(), scored.end(),
                                     [](const auto& a, const auto& b) { return a.second < b.second; });
  EXPECT_EQ(chose, best->first) << err_new;
  EXPECT_NEAR(spec.at("mla_balance").get<double>(), best->first, 1e-4);
  for (const auto& [b, ppl] : scored) EXPECT_TRUE(std::isfinite(ppl) && ppl > 1) << b;
  // A fixed balance runs no search.
  std::string err_fixed;
  const auto fixed = json_of(base + " --transform 'mla(rank=64,rope_heads=1,calib_tokens=512,balance=1.5)'", &err_fixed);
  EXPECT_EQ(fixed.at("mla_balance"), 1.5);
  EXPECT_EQ(err_fixed.find("mla balance"), std::string::npos) << err_fixed;
}

TEST(TransformCli, ConvertRecordsThePipeline) {
  if (!have_default()) GTEST_SKIP() << "default model not cached";
  const std::string out = test::temp_path("transform_cli_vo.gguf");
  const std::string pipeline = "bda(pairs=vo,coef=f32)";
  const auto conv = json_of("convert --threads 2 --out " + out + " --transform '" + pipeline + "'");
  EXPECT_EQ(conv.at("transform"), pipeline);
  const auto info = json_of("gguf-info --no-tensors --model " + out);
  EXPECT_EQ(info.at("transform"), pipeline);
  EXPECT_EQ(info.at("metadata").at("numattn.transform").at("value"), pipeline);
  const Result md = cli("gguf-info --no-tensors --model " + out);
  EXPECT_NE(md.out.find("Made by the model transforms " + pipeline), std::string::npos) << md.out;
  // The file runs as the pipeline at load does (float32 weights, where the BD form is exact).
  const std::string base = "ppl --ctx 128 --chunks 2 --threads 2 --no-progress --weights f32";
  const auto file = json_of(base + " --model " + out);
  const auto load = json_of(base + " --transform '" + pipeline + "'");
  EXPECT_EQ(file.at("file_transform"), pipeline);
  EXPECT_NEAR(file.at("ppl").get<double>(), load.at("ppl").get<double>(), 1e-5 * load.at("ppl").get<double>());
  // convert's default is that pipeline; a coefficient storage the file cannot hold is refused.
  const Result q8 = cli("convert --out " + out + " --transform 'bda(pairs=vo)'");
  EXPECT_EQ(q8.rc, 1) << q8.out;
  EXPECT_NE(q8.out.find("give coef=f32"), std::string::npos) << q8.out;
  const Result two = cli("convert --out " + out + " --transform 'mla(rank=8)|bda(pairs=vo,coef=f32)'");
  EXPECT_EQ(two.rc, 1) << two.out;
  EXPECT_NE(two.out.find("one file holds one transform"), std::string::npos) << two.out;
  std::remove(out.c_str());
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
