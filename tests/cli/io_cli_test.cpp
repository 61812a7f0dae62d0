// The CLI's files: hostile .npy inputs end in `error: ...`, outputs never overwrite inputs
// (however spelled), a failed write leaves the previous output intact, text paths are checked.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "numattn/core/error.h"
#include "numattn/core/npy.h"
#include "numattn/model/data.h"
#include "support/test_util.h"
#include "support/tiny_llama.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

namespace fs = std::filesystem;

std::string cli() { return NUMATTN_CLI_PATH; }

// Runs the CLI with stdout and stderr captured together.
int run(const std::string& args, std::string* out) {
  const int rc = test::run_command(cli() + " " + args + " 2>&1", out);
  *out = test::strip_notes(*out);
  return rc;
}

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(dir)) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

// A raw version-1.0 .npy with the given header text and payload.
void write_raw_npy(const std::string& path, const std::string& header, const std::string& payload) {
  std::string s = "\x93NUMPY\x01";
  s += '\0';
  s += static_cast<char>(header.size() & 0xff);
  s += static_cast<char>(header.size() >> 8);
  std::ofstream(path, std::ios::binary) << s << header << payload;
}

class CliFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::vector<float> x(4 * 8, 0.5f);
    for (const char* n : {"q", "k", "v"}) npy::write(f(std::string(n) + ".npy"), {4, 8}, x.data());
  }
  std::string f(const std::string& name) const { return scratch.file(name); }
  std::string qkv() const {
    return "--q " + f("q.npy") + " --k " + f("k.npy") + " --v " + f("v.npy");
  }
  test::ScratchDir scratch;
};

TEST_F(CliFiles, HostileNpyHeadersEndInAnError) {
  struct Case {
    std::string header, message;
  };
  const std::string pre = "{'descr': '<f4', 'fortran_order': False, 'shape': ";
  const std::vector<Case> cases = {
      {"{'descr': '<" + std::string(60000, 'f') + "', 'fortran_order': False, 'shape': (4, 8), }",
       "unsupported .npy dtype '<fff"},
      {pre + "(" + std::string(60000, '9') + ",), }", "60000 digits) does not fit in int64"},
      {pre + "(-4, 32), }", "shape dimension 0 is negative (-4)"},
      {pre + "(12345678901234567890123, 8), }", "does not fit in int64"},
      {pre + "(4, 8), 'x': 1}", "unknown key 'x'"},
  };
  for (const Case& c : cases) {
    write_raw_npy(f("bad.npy"), c.header, std::string(4 * 4 * 32, '\0'));
    for (const std::string& flag : {"--q", "--mask"}) {
      const std::string args =
          flag == "--q" ? "--q " + f("bad.npy") + " --k " + f("k.npy") + " --v " + f("v.npy")
                        : qkv() + " --mask " + f("bad.npy");
      std::string out;
      EXPECT_EQ(run("run " + args, &out), 1) << out.substr(0, 300);
      EXPECT_EQ(out.rfind("error: '" + f("bad.npy") + "'", 0), 0u) << out.substr(0, 300);
      EXPECT_NE(out.find(c.message), std::string::npos) << out.substr(0, 300);
    }
    std::string out;
    EXPECT_EQ(run("bd --rank 1 --in " + f("bad.npy"), &out), 1) << out.substr(0, 300);
    EXPECT_NE(out.find(c.message), std::string::npos) << out.substr(0, 300);
  }
  std::string out;
  EXPECT_EQ(
      run("run --q " + scratch.path().string() + " --k " + f("k.npy") + " --v " + f("v.npy"), &out),
      1);
  EXPECT_NE(out.find("error: .npy file '" + scratch.path().string() + "' is a directory"),
            std::string::npos)
      << out;
}

TEST_F(CliFiles, RunRefusesOutputsThatAreItsInputs) {
  fs::create_symlink(f("k.npy"), f("k_link.npy"));
  const std::string k_before = slurp(f("k.npy"));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--out " + f("q.npy"), "--out '" + f("q.npy") + "' is the same file as the input --q"},
      {"--lse-out " + f("k_link.npy"), "is the same file as the input --k '" + f("k.npy") + "'"},
      {"--out " + (scratch.path() / "." / "v.npy").string(), "is the same file as the input --v"},
      {"--out " + f("o.npy") + " --lse-out " + (scratch.path() / "x" / ".." / "o.npy").string(),
       "are the same file"},
  };
  for (const auto& [extra, message] : cases) {
    std::string out;
    EXPECT_EQ(run("run " + qkv() + " " + extra, &out), 1) << extra;
    EXPECT_EQ(out.rfind("error: ", 0), 0u) << out;
    EXPECT_NE(out.find(message), std::string::npos) << out;
  }
  EXPECT_EQ(slurp(f("k.npy")), k_before);
  EXPECT_TRUE(fs::is_symlink(f("k_link.npy")));
  // Distinct outputs are written, and again over themselves.
  for (int i = 0; i < 2; ++i) {
    std::string out;
    ASSERT_EQ(run("run " + qkv() + " --out " + f("o.npy") + " --lse-out " + f("l.npy"), &out), 0)
        << out;
  }
  EXPECT_EQ(npy::read(f("o.npy")).shape, (std::vector<std::int64_t>{1, 1, 4, 8}));
  EXPECT_EQ(npy::read(f("l.npy")).shape, (std::vector<std::int64_t>{1, 1, 4}));
}

TEST_F(CliFiles, AFailedWriteLeavesThePreviousOutputAndNoTemporary) {
  std::vector<float> big(64 * 256, 0.25f);
  for (const char* n : {"bq", "bk", "bv"})
    npy::write(f(std::string(n) + ".npy"), {64, 256}, big.data());
  const std::string prev(100, 'p');
  std::ofstream(f("o.npy"), std::ios::binary) << prev;
  // A 16 KiB file-size limit (ulimit -f counts 1 KiB blocks in bash/dash) fails the 64 KiB
  // output like a full disk; SIGXFSZ is ignored so that write() reports EFBIG.
  std::string out;
  const int rc = test::run_command("sh -c \"trap '' XFSZ; ulimit -f 16; " + cli() + " run --q " +
                                       f("bq.npy") + " --k " + f("bk.npy") + " --v " + f("bv.npy") +
                                       " --out " + f("o.npy") + "\" 2>&1",
                                   &out);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("error: error writing .npy file '" + f("o.npy") + "': File too large"),
            std::string::npos)
      << out;
  EXPECT_EQ(slurp(f("o.npy")), prev);
  EXPECT_EQ(
      entries(scratch.path()),
      (std::vector<std::string>{"bk.npy", "bq.npy", "bv.npy", "k.npy", "o.npy", "q.npy", "v.npy"}));
}

TEST_F(CliFiles, BdRefusesAnOutPrefixThatNamesAnInput) {
  const std::vector<double> w(6 * 4, 1.0);
  npy::write(f("W.B.npy"), {6, 4}, w.data());
  const std::string before = slurp(f("W.B.npy"));
  std::string out;
  EXPECT_EQ(run("bd --in " + f("W.B.npy") + " --rank 1 --out-prefix " + f("W"), &out), 1);
  EXPECT_NE(
      out.find("error: --out-prefix '" + f("W.B.npy") + "' is the same file as the input --in"),
      std::string::npos)
      << out;
  EXPECT_EQ(slurp(f("W.B.npy")), before);
}

TEST_F(CliFiles, ConvertRefusesAnOutThatIsTheModel) {
  const std::string model = test::write_gguf(test::make_tiny(false), "io_cli_convert.gguf");
  const std::string copy = f("m.gguf");
  fs::copy_file(model, copy);
  fs::create_symlink(copy, f("m_link.gguf"));
  const std::string before = slurp(copy);
  const fs::path cwd = fs::current_path();
  for (const std::string& spelling :
       {copy, (scratch.path() / "." / "m.gguf").string(), f("m_link.gguf")}) {
    std::string out;
    EXPECT_EQ(run("convert --model " + copy + " --out " + spelling, &out), 1) << spelling;
    EXPECT_NE(out.find("error: --out '" + spelling + "' is the same file as the input --model '" +
                       copy + "'"),
              std::string::npos)
        << out;
  }
  EXPECT_EQ(slurp(copy), before);
  // A real conversion onto another path works, twice (the second replaces the first).
  for (int i = 0; i < 2; ++i) {
    std::string out;
    ASSERT_EQ(run("convert --model " + copy + " --out " + f("bda.gguf") + " --format json", &out),
              0)
        << out;
  }
  EXPECT_EQ(entries(scratch.path()), (std::vector<std::string>{"bda.gguf", "k.npy", "m.gguf",
                                                               "m_link.gguf", "q.npy", "v.npy"}));
  fs::current_path(cwd);
}

TEST_F(CliFiles, PplNamesADirectoryOrMissingText) {
  std::string out;
  // The text is read before the model is opened, so no model is needed to see the error.
  EXPECT_EQ(run("ppl --model " + f("none.gguf") + " --text " + scratch.path().string(), &out), 1);
  EXPECT_NE(
      out.find("error: --text file '" + scratch.path().string() + "' is a directory, not a file"),
      std::string::npos)
      << out;
  EXPECT_EQ(run("ppl --model " + f("none.gguf") + " --text " + f("none.txt"), &out), 1);
  EXPECT_NE(out.find("error: --text file '" + f("none.txt") + "' does not exist"),
            std::string::npos)
      << out;
}

// Pieces that are not valid UTF-8 (half of "é", a lone continuation byte) used to abort the
// JSON output with json.exception.type_error.316; they print escaped in every format.
TEST(CliTokenize, PiecesAreEscapedInEveryFormat) {
  try {
    default_model_path();
  } catch (const Error&) {
    GTEST_SKIP() << "default model not cached (scripts/fetch_data.sh)";
  }
  // $'...' is not POSIX sh: printf builds the bytes (\303\251 = é, \200, backslash, newline).
  const std::string text = "\"$(printf 'x\\303\\251\\200\\\\\\nq')\"";
  std::string out;
  ASSERT_EQ(test::run_command(cli() + " tokenize --pieces --format json --text " + text, &out), 0)
      << out;
  const auto j = nlohmann::json::parse(out);
  std::string joined;
  for (const auto& p : j["pieces"]) joined += p.get<std::string>() + "|";
  EXPECT_NE(joined.find("\\x80"), std::string::npos) << joined;
  EXPECT_NE(joined.find("\\\\"), std::string::npos) << joined;
  EXPECT_NE(joined.find("\\x0a"), std::string::npos) << joined;
  for (const char* f : {"md", "csv"}) {
    ASSERT_EQ(test::run_command(cli() + " tokenize --pieces --format " + f + " --text " + text, &out), 0)
        << out;
    EXPECT_NE(out.find("\\x80"), std::string::npos) << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), f == std::string("md") ? 3 : 2)
        << "one table row: " << out;
  }
  // A byte the vocabulary has no token for is refused by name.
  EXPECT_EQ(test::run_command(cli() + " tokenize --text \"$(printf 'a\\370')\" 2>&1", &out), 1);
  EXPECT_NE(out.find("error: byte 0xF8 at offset 1 of the text has no token"), std::string::npos)
      << out;
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
