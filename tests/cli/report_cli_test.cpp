// `numattn report` as an orchestrator: refusals before any measurement, one printed command per
// step that reproduces its data file, and a failing child reported with its command and stderr.
// The plots themselves (matplotlib) and the page (Chromium) are tests/report/browser_check.py's;
// here a shell script stands in for the plotting interpreter (it passes the matplotlib check and
// writes an empty index.html), so these run anywhere.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "support/test_util.h"
#include "support/tiny_llama.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

std::string cli() { return NUMATTN_CLI_PATH; }

std::string run(const std::string& args, int* rc) {
  std::string out;
  *rc = test::run_command(cli() + " " + args + " 2>&1", &out);
  return test::strip_notes(out);
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

// A stand-in for `python3`: `-c CODE` succeeds, `SCRIPT --dir DIR` writes DIR/index.html.
std::string fake_python(const test::ScratchDir& dir) {
  const std::string path = dir.file("fake_python.sh");
  std::ofstream(path) << "#!/bin/sh\n[ \"$1\" = -c ] && exit 0\necho '<html></html>' > \"$3/index.html\"\n";
  std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  return path;
}

// Random inputs only, tiny sizes, no plotting: a report in well under a second of measurements.
std::string tiny(const test::ScratchDir& dir,
                 const std::string& methods,
                 const std::string& n = "32") {
  return "report --no-model --no-progress --threads 1 --out " + dir.file("r") +
         " --bench-methods " + methods + " --n " + n +
         " --heads 1 --d 8 --reps 1 --check-rows 8 --gemm-size 32 --bd-seeds 1 --bd-tokens 8 " +
         "--python " + fake_python(dir);
}

TEST(ReportCli, APythonWithoutMatplotlibIsRefusedBeforeAnyMeasurement) {
  test::ScratchDir dir;
  int rc = 0;
  const std::string out = run("report --no-model --out " + dir.file("r") + " --python /bin/false", &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("cannot import matplotlib"), std::string::npos) << out;
  EXPECT_NE(out.find("python3-matplotlib"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(dir.file("r/data/steps.json")));
}

TEST(ReportCli, AnOutThatIsAFileIsRefused) {
  test::ScratchDir dir;
  std::ofstream(dir.file("f")) << "x";
  int rc = 0;
  const std::string out = run("report --no-model --python " + fake_python(dir) + " --out " + dir.file("f"), &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("error: --out: '" + dir.file("f") + "' exists and is not a directory"), std::string::npos) << out;
}

TEST(ReportCli, AMissingPlotsScriptIsNamed) {
  test::ScratchDir dir;
  int rc = 0;
  const std::string out =
      run("report --no-model --python " + fake_python(dir) + " --plots-script " + dir.file("none.py") +
              " --out " + dir.file("r"), &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("--plots-script: '" + dir.file("none.py") + "' is not a file"), std::string::npos) << out;
}

TEST(ReportCli, EachStepIsAPrintedCommandThatReproducesItsDataFile) {
  test::ScratchDir dir;
  int rc = 0;
  const std::string out = run(tiny(dir, "exact.flash,exact.naive"), &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("report: " + dir.file("r") + "/index.html"), std::string::npos) << out;
  const auto meta = read_json(dir.file("r/data/steps.json"));
  EXPECT_EQ(meta["format"], "numattn-report");
  std::vector<std::string> ids;
  for (const auto& s : meta["steps"]) {
    ids.push_back(s["id"]);
    EXPECT_EQ(s["status"], "ok") << s.dump();
    // One line per step on stderr, numbered.
    EXPECT_NE(out.find(s["title"].get<std::string>() + ": ok"), std::string::npos) << out;
  }
  EXPECT_EQ(ids, (std::vector<std::string>{"methods", "bench_gaussian", "bench_spiky", "bd_study", "plots"}));
  const auto rows = read_json(dir.file("r/data/bench_spiky.json"));
  ASSERT_EQ(rows.size(), 3u);  // the sgemm row and the two methods
  EXPECT_EQ(rows[1]["method"].get<std::string>().rfind("exact.flash(", 0), 0u) << rows[1].dump();
  EXPECT_EQ(rows[2]["method"], "exact.naive");
  EXPECT_EQ(rows[2]["source"], "random spiky");
  // The printed command, run by a shell, writes the same rows (same methods, shapes and seed).
  std::string cmd = meta["steps"][2]["command"];
  const std::string redirect = " > '" + dir.file("r/data/bench_spiky.json") + "'";
  const std::string redirect_plain = " > " + dir.file("r/data/bench_spiky.json");
  std::size_t at = cmd.rfind(" > ");
  ASSERT_NE(at, std::string::npos) << cmd;
  EXPECT_TRUE(cmd.substr(at) == redirect || cmd.substr(at) == redirect_plain) << cmd;
  cmd = cmd.substr(0, at) + " > " + dir.file("again.json") + " 2>/dev/null";
  std::string ignored;
  ASSERT_EQ(test::run_command(cmd, &ignored), 0) << cmd;
  const auto again = read_json(dir.file("again.json"));
  ASSERT_EQ(again.size(), rows.size());
  for (std::size_t i = 1; i < rows.size(); ++i) {
    for (const char* k : {"method", "n", "heads", "d", "seed", "source", "rows_checked"})
      EXPECT_EQ(again[i][k], rows[i][k]) << k;
  }
}

TEST(ReportCli, AFailingChildIsReportedWithItsCommandAndStderrAndFailsTheReport) {
  test::ScratchDir dir;
  int rc = 0;
  // --n 0 reaches the bench children, which refuse it (the report passes sizes on unchecked).
  const std::string out = run(tiny(dir, "exact.flash", "0"), &rc);
  EXPECT_EQ(rc, 1) << out;
  // The line of the step, its command and the child's own error message.
  EXPECT_NE(out.find("error, time and memory: gaussian inputs: failed"), std::string::npos) << out;
  EXPECT_NE(out.find("command: " + cli() + " bench --method exact.flash --n 0"), std::string::npos)
      << out;
  EXPECT_NE(out.find("problem sizes must be >= 1"), std::string::npos) << out;
  EXPECT_NE(out.find("error: report: 2 step(s) failed"), std::string::npos) << out;
  // The other steps still ran, and the record says which failed and why.
  const auto meta = read_json(dir.file("r/data/steps.json"));
  for (const auto& s : meta["steps"]) {
    const bool bench = s["id"].get<std::string>().rfind("bench_", 0) == 0;
    EXPECT_EQ(s["status"], bench ? "failed" : "ok") << s.dump();
    if (bench) {
      EXPECT_NE(s["stderr"].get<std::string>().find("problem sizes must be >= 1"),
                std::string::npos)
          << s.dump();
    }
  }
  // No partial output is left where a data file belongs.
  EXPECT_FALSE(std::filesystem::exists(dir.file("r/data/bench_gaussian.json")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("r/data/.bench_gaussian.json.part")));
}

TEST(ReportCli, AMethodListIsRefusedBeforeAnyMeasurementWhenASpecIsBrokenOrUnknown) {
  test::ScratchDir dir;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"'lowrank.nystrom(landmarks=64,iters=2'",
       "error: --bench-methods: spec list 'lowrank.nystrom(landmarks=64,iters=2': "
       "the '(' at position 15 is never closed"},
      {"'exact.flash,,exact.naive'",
       "error: --bench-methods: spec list 'exact.flash,,exact.naive': empty item"},
      {"'iters=2),exact.flash'",
       "error: --bench-methods: spec list 'iters=2),exact.flash': ')' at position 7"},
      {"nosuch.method", "error: --bench-methods: unknown method 'nosuch.method'"},
  };
  for (const auto& [list, want] : cases) {
    int rc = 0;
    const std::string out = run(tiny(dir, list), &rc);
    EXPECT_EQ(rc, 1) << out;
    EXPECT_NE(out.find(want), std::string::npos) << out;
    EXPECT_FALSE(std::filesystem::exists(dir.file("r/data/steps.json"))) << list;
  }
}

TEST(ReportCli, AnEmptyOutIsRefusedAndNothingIsWrittenHere) {
  test::ScratchDir dir;
  // Run from inside the scratch directory: an empty --out would mean it.
  std::string out;
  const int rc =
      test::run_command("cd " + dir.path().string() + " && " + cli() +
                            " report --no-model --python " + fake_python(dir) + " --out '' 2>&1",
                        &out);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("error: --out: empty path"), std::string::npos) << out;
  for (const char* d : {"data", "logs", "plots", "report.md", "index.html"})
    EXPECT_FALSE(std::filesystem::exists(dir.file(d)))
        << d << " written into the current directory";
}

// The acceptance case: specs with commas inside their parentheses reach their commands whole.
// The tiny model with a vocabulary (tests/support/tiny_llama.h) stands in for the default one.
TEST(ReportCli, SpecListsReachEveryCommandWhole) {
  test::ScratchDir dir;
  const std::string text = dir.file("text.txt");
  std::ofstream(text) << test::tiny_text(4000);
  int rc = 0;
  const std::string out =
      run("report --no-progress --threads 1 --model " + test::tiny_model_with_vocab() + " --text " +
              text + " --out " + dir.file("r") +
              " --bench-methods 'lowrank.nystrom(landmarks=64,iters=2)'" +
              " --ppl-methods "
              "'sparse.window(left=32,sinks=4),exact.flash,lowrank.linformer(k=8,projection=identity)'" +
              " --n 64 --heads 1 --d 8 --reps 1 --check-rows 8 --gemm-size 32 --tokens 64 --layers "
              "0 --ctx 64" +
              " --chunks 1 --bd-seeds 1 --bd-tokens 8 --mla-ranks 4 --analyze-tokens 16 "
              "--analyze-layers 0 --long-n 32,64 --long-ctx 64 --long-methods "
              "'sparse.window(left=16,sinks=4),lowrank.loki(topk_frac=0.5)' --long-tol 0.5" +
              " --transform 'bda(pairs=vo,coef=f32)'" + " --python " + fake_python(dir),
          &rc);
  const auto meta = read_json(dir.file("r/data/steps.json"));
  std::map<std::string, nlohmann::json> steps;
  for (const auto& s : meta["steps"]) steps[s["id"]] = s;
  // Model transforms reach ppl as one --transform pipeline string: the report's own (BDA, MLA)
  // and each --transform given to it, whose row carries the canonical pipeline.
  ASSERT_TRUE(steps.count("transform_1")) << out;
  EXPECT_NE(steps["transform_1"]["command"].get<std::string>().find("--transform 'bda(pairs=vo,coef=f32)'"),
            std::string::npos)
      << steps["transform_1"].dump();
  EXPECT_EQ(steps["transform_1"]["status"], "ok") << steps["transform_1"].dump();
  EXPECT_EQ(read_json(dir.file("r/data/transform/transform_1.json"))["transform"], "bda(pairs=vo,coef=f32)");
  EXPECT_NE(steps["bda_ppl_vo"]["command"].get<std::string>().find("--transform 'bda(pairs=vo)'"), std::string::npos)
      << steps["bda_ppl_vo"].dump();
  EXPECT_NE(steps["mla_rank4"]["command"].get<std::string>().find("--transform 'mla(rank=4)'"), std::string::npos)
      << steps["mla_rank4"].dump();
  // Every bench step ran the one spec whole.
  for (const char* id : {"bench_gaussian", "bench_spiky", "bench_captured_n64"}) {
    ASSERT_TRUE(steps.count(id)) << out;
    const std::string cmd = steps[id]["command"];
    EXPECT_NE(cmd.find("--method 'lowrank.nystrom(landmarks=64,iters=2)' "), std::string::npos)
        << cmd;
    EXPECT_EQ(cmd.find("--method 'iters=2)'"), std::string::npos) << cmd;
    EXPECT_EQ(steps[id]["status"], "ok") << steps[id].dump();
  }
  const auto rows = read_json(dir.file("r/data/bench_gaussian.json"));
  ASSERT_EQ(rows.size(), 2u) << rows.dump();  // sgemm and the one method
  const std::string spec = rows[1]["method"];
  EXPECT_EQ(spec.rfind("lowrank.nystrom(", 0), 0u) << spec;
  EXPECT_NE(spec.find("landmarks=64"), std::string::npos) << spec;
  EXPECT_NE(spec.find("iters=2"), std::string::npos) << spec;
  // One perplexity step per spec, each run whole and required: a method that can run the model
  // must not fail quietly.
  ASSERT_TRUE(steps.count("ppl_sparse.window_left=32_sinks=4")) << out;
  const auto& win = steps["ppl_sparse.window_left=32_sinks=4"];
  EXPECT_NE(win["command"].get<std::string>().find("--attn 'sparse.window(left=32,sinks=4)' "),
            std::string::npos)
      << win.dump();
  EXPECT_EQ(win["status"], "ok") << win.dump();
  EXPECT_EQ(win["required"], true);
  EXPECT_EQ(steps["ppl_exact.flash_2"]["status"], "ok") << steps["ppl_exact.flash_2"].dump();
  EXPECT_EQ(read_json(dir.file("r/data/ppl/ppl_sparse.window_left=32_sinks=4.json"))["attn"]
                .get<std::string>()
                .rfind("sparse.window(", 0),
            0u);
  // A method that cannot run the model (Linformer's identity projection needs k ≥ Nk) is an
  // optional row with the reason.
  const auto& nys = steps["ppl_lowrank.linformer_k=8_projection=identity"];
  EXPECT_EQ(nys["status"], "failed") << nys.dump();
  EXPECT_EQ(nys["required"], false);
  EXPECT_NE(nys["stderr"].get<std::string>().find("cannot run"), std::string::npos) << nys.dump();
  // The long-context section: a capture and a bench per length with every configuration whole,
  // each configuration and auto(tol=E) in the model.
  for (const char* id : {"long_capture_n32", "long_bench_n32", "long_capture_n64", "long_bench_n64",
                         "long_ppl_exact.flash", "long_ppl_sparse.window_left=16_sinks=4",
                         "long_ppl_lowrank.loki_topk_frac=0.5", "long_auto_tol0.5"}) {
    ASSERT_TRUE(steps.count(id)) << id << "\n" << out;
    EXPECT_EQ(steps[id]["status"], "ok") << steps[id].dump();
  }
  EXPECT_NE(steps["long_bench_n64"]["command"].get<std::string>().find(
                "--method exact.flash --method 'sparse.window(left=16,sinks=4)' --method "
                "'lowrank.loki(topk_frac=0.5)' "),
            std::string::npos)
      << steps["long_bench_n64"].dump();
  EXPECT_NE(steps["long_auto_tol0.5"]["command"].get<std::string>().find("--attn 'auto(tol=0.5,reps=1)' --baseline exact.flash"),
            std::string::npos)
      << steps["long_auto_tol0.5"].dump();
  const auto lrows = read_json(dir.file("r/data/long/bench_n64.json"));
  ASSERT_EQ(lrows.size(), 4u) << lrows.dump();  // sgemm, exact.flash and the two configurations
  for (std::size_t i = 1; i < lrows.size(); ++i) EXPECT_EQ(lrows[i]["status"], "ok") << lrows[i].dump();
  EXPECT_EQ(meta["settings"]["long_n"], "32,64");
  EXPECT_EQ(meta["settings"]["long_ctx"], 64);
  // Nothing else failed that was required, so the report succeeded.
  for (const auto& [id, s] : steps)
    if (s["required"] == true) EXPECT_EQ(s["status"], "ok") << s.dump();
  EXPECT_EQ(rc, 0) << out;
}

// The long-context options are checked before any measurement: lengths beyond the model's
// context, targets outside (0, 1).
TEST(ReportCli, LongContextOptionsAreRefusedBeforeAnyMeasurement) {
  test::ScratchDir dir;
  const std::string text = dir.file("text.txt");
  std::ofstream(text) << test::tiny_text(400);
  const std::string base = "report --no-progress --threads 1 --model " + test::tiny_model_with_vocab() +
                           " --text " + text + " --python " + fake_python(dir) + " --out " + dir.file("r");
  const std::pair<std::string, std::string> cases[] = {
      {" --long-n 512", "error: --long-n: 512 is beyond the model's context of 256 tokens"},
      {" --long-n 64,x", "error: --long-n: 'x' is not a sequence length"},
      {" --long-tol 0.05,2", "error: --long-tol: '2' is not an error target in (0, 1)"},
      {" --long-ctx 512", "--long-ctx: 512 is beyond the model's context of 256 tokens"},
      {" --long-methods 'nosuch.method'", "error: --long-methods: unknown method 'nosuch.method'"},
  };
  for (const auto& [args, want] : cases) {
    int rc = 0;
    const std::string out = run(base + args, &rc);
    EXPECT_EQ(rc, 1) << args << "\n" << out;
    EXPECT_NE(out.find(want), std::string::npos) << args << "\n" << out;
    EXPECT_FALSE(std::filesystem::exists(dir.file("r/data/steps.json"))) << args;
  }
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
