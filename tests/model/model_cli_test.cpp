// The model subcommands' flags and files end to end: each bad flag is reported by name before
// anything slow happens (a nonexistent model path shows the check did not even open it), the
// trained context bounds ppl --ctx and generate --max-tokens, and a hostile GGUF ends in an
// error that names its key with exit status 1.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "numattn/core/error.h"
#include "numattn/gguf/gguf.h"
#include "numattn/model/data.h"
#include "support/test_util.h"
#include "support/tiny_llama.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

// An empty text file (a regular one: devices such as /dev/null are refused as inputs).
std::string empty_text() {
  const std::string p = test::temp_path("cli_empty.txt");
  std::ofstream(p).flush();
  return p;
}

using Result = test::CliResult;
using test::cli;
using test::expect_cli_error;

TEST(ModelCli, BadFlagsAreReportedBeforeTheModelIsOpened) {
  const std::string none = "--model /nonexistent/model.gguf --text /nonexistent/text.txt";
  expect_cli_error("ppl " + none + " --ctx 0", {"error: --ctx: ", "at least 4"}, "nonexistent");
  expect_cli_error("ppl " + none + " --ctx -512", {"error: --ctx: "}, "nonexistent");
  expect_cli_error("ppl " + none + " --chunks 0", {"error: --chunks: "}, "nonexistent");
  expect_cli_error("ppl " + none + " --chunks -7", {"error: --chunks: "}, "nonexistent");
  expect_cli_error("ppl " + none + " --attn exact.bogus", {"error: --attn: ", "exact.bogus"}, "nonexistent");
  expect_cli_error("ppl " + none + " --baseline 'exact.flash(nope=1)'", {"error: --baseline: "}, "nonexistent");
  expect_cli_error("ppl " + none + " --bos sometimes", {"error: --bos: ", "auto"}, "nonexistent");
  const std::string gen = "generate --model /nonexistent/model.gguf --prompt hi";
  expect_cli_error(gen + " --max-tokens 0", {"error: --max-tokens: "}, "nonexistent");
  expect_cli_error(gen + " --max-tokens -3", {"error: --max-tokens: "}, "nonexistent");
  expect_cli_error(gen + " --attn exact.bogus", {"error: --attn: "}, "nonexistent");
}

TEST(ModelCli, TrainedContextBoundsPplBeforeTheWeightsAreRead) {
  // The tiny model (trained context 256) has no vocabulary: any step past the context check
  // fails on the tokenizer, so an error about --ctx shows the check came first.
  const std::string tiny = test::write_gguf(test::make_tiny(false), "cli_tiny.gguf");
  expect_cli_error("ppl --model " + tiny + " --text " + empty_text() + " --ctx 1024",
                   {"error: --ctx: ", "1024", "256", "llama.context_length", "--allow-long-ctx"});
  const Result r =
      cli("ppl --model " + tiny + " --text " + empty_text() + " --ctx 1024 --allow-long-ctx");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_EQ(r.out.find("--ctx"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokenizer"), std::string::npos) << r.out;
}

TEST(ModelCli, HostileGgufEndsInANamedError) {
  test::GgufEdit e;
  e.keys.emplace_back("llama.embedding_length", GgufValue::u32(1u << 22));
  const std::string base = test::write_gguf(test::make_tiny(false), "cli_base.gguf");
  const std::string bad = test::rewrite_gguf(base, e, "cli_hostile.gguf");
  for (const std::string cmd : {"ppl --text " + empty_text(), std::string("generate --prompt hi")})
    expect_cli_error(cmd + " --model " + bad, {"llama.embedding_length", "token_embd.weight"});
}

TEST(ModelCli, DefaultModelRefusesRequestsBeyondItsContext) {
  try {
    default_model_path();
  } catch (const Error&) {
    GTEST_SKIP() << "default model not cached";
  }
  // SmolLM2-135M: llama.context_length = 8192. Both refusals come before the weights load.
  expect_cli_error("generate --model default --prompt 'The capital of France is' --max-tokens 5000000000",
               {"error: --max-tokens: ", "5000000000", "8192", "at most"});
  expect_cli_error("ppl --model default --text default --ctx 9000", {"error: --ctx: ", "8192"});
  std::string words;  // 9000 tokens or more
  for (int i = 0; i < 9000; ++i) words += " the";
  expect_cli_error("generate --model default --max-tokens 1 --prompt '" + words + "'",
               {"error: --prompt: ", "8192"});
}

// bench-model on the tiny model (Q4_1 file): one row per context, decode and prefill rates,
// the bytes a step reads (the file's matrices, in place; 4 per weight with f32), a measured
// bandwidth and a roofline fraction; bad flags named.
TEST(ModelCli, BenchModelRowsAndWeightsFlag) {
  using json = nlohmann::json;
  test::TinyTensors T = test::make_tiny(false);
  const std::string q = test::write_gguf(T, "cli_bench_q41.gguf", GgmlType::Q4_1);
  const Result r = cli("bench-model --model " + q + " --ctx 0,12 --decode 3 --bandwidth-mib 4 "
                       "--threads 2 --format json");
  ASSERT_EQ(r.rc, 0) << r.out;
  const json rows = json::parse(r.out.substr(r.out.find('[')));
  ASSERT_EQ(rows.size(), 2u);
  // Per layer: Wq|Wk|Wv (32+16+16 rows), Wo (32), gate|up (128), down (32 rows of 64): Q4_1
  // rows of 32 values are 20 bytes, of 64 are 40; the untied output matrix: 64 rows of 20.
  const double layer = (32 + 16 + 16 + 32 + 128) * 20.0 + 32 * 40.0;
  EXPECT_EQ(rows[0]["weight_bytes_per_token"].get<double>(), 2 * layer + 64 * 20);
  EXPECT_TRUE(rows[0]["prefill_tokens_per_s"].is_null());
  EXPECT_GT(rows[1]["prefill_tokens_per_s"].get<double>(), 0);
  for (const auto& row : rows) {
    EXPECT_EQ(row["weights"], "gguf");
    EXPECT_GT(row["decode_tokens_per_s"].get<double>(), 0);
    EXPECT_GT(row["read_bandwidth_gbs"].get<double>(), 0);
    EXPECT_NEAR(row["roofline_fraction"].get<double>(),
                row["decode_tokens_per_s"].get<double>() / row["roofline_tokens_per_s"].get<double>(), 1e-9);
    EXPECT_GT(row["peak_rss_mib"].get<double>(), 0);
  }
  const Result f = cli("bench-model --model " + q + " --ctx 4 --decode 1 --bandwidth-mib 4 "
                       "--weights f32 --format json");
  ASSERT_EQ(f.rc, 0) << f.out;
  const json fr = json::parse(f.out.substr(f.out.find('[')));
  // float32: 4 bytes for each of 2·(64·32 + 32·32 + 128·32 + 32·64) + 64·32 weights.
  EXPECT_EQ(fr[0]["weight_bytes_per_token"].get<double>(), 4.0 * (2 * 9216 + 2048));
  expect_cli_error("bench-model --model " + q + " --ctx 4,x", {"error: --ctx: ", "'x'"});
  expect_cli_error("bench-model --model " + q + " --decode 0", {"error: --decode: "});
  expect_cli_error("bench-model --model " + q + " --ctx 250 --decode 10", {"error: --ctx: ", "256"});
  // The warm-up decodes before the rows: none at all, or as many as the context holds.
  ASSERT_EQ(cli("bench-model --model " + q + " --ctx 0 --decode 1 --bandwidth-mib 4 --warmup 0").rc, 0);
  ASSERT_EQ(cli("bench-model --model " + q + " --ctx 0 --decode 1 --bandwidth-mib 4 --warmup 255").rc, 0);
  expect_cli_error("bench-model --model " + q + " --ctx 0 --decode 1 --warmup 256", {"error: --warmup: ", "256"});
  const Result neg = cli("bench-model --model " + q + " --warmup -1");
  EXPECT_NE(neg.rc, 0);
  EXPECT_NE(neg.out.find("--warmup"), std::string::npos) << neg.out;
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
