// Hostile paths on the command line: inputs that are not regular files (a manifest that is a
// link to /dev/zero, FIFOs, directories) are refused by name before they are opened, and output
// paths that cannot be what the option writes (empty, a directory for a file, a file for a
// directory, an input) are refused by their option before any work.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "numattn/core/npy.h"
#include "support/test_util.h"
#include "support/tiny_llama.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

namespace fs = std::filesystem;

// `numattn ARGS` under a time limit: a read that blocks (a FIFO with no writer) or never ends
// (/dev/zero) shows as exit status 124 instead of hanging the suite.
test::CliResult timed(const std::string& args) {
  test::CliResult r;
  r.rc = test::run_command("timeout 60 " + std::string(NUMATTN_CLI_PATH) + " " + args + " 2>&1",
                           &r.out);
  r.out = test::strip_notes(r.out);
  return r;
}

void expect_refused(const std::string& args, const std::vector<std::string>& must_contain) {
  const test::CliResult r = timed(args);
  EXPECT_EQ(r.rc, 1) << args << "\n" << r.out;
  EXPECT_EQ(r.out.rfind("error: ", 0), 0u) << args << "\n" << r.out;
  for (const auto& s : must_contain)
    EXPECT_NE(r.out.find(s), std::string::npos) << args << "\n" << r.out;
}

std::string make_fifo(const test::ScratchDir& d, const std::string& name) {
  const std::string p = d.file(name);
  EXPECT_EQ(::mkfifo(p.c_str(), 0600), 0) << p;
  return p;
}

std::string write_npy(const test::ScratchDir& d, const std::string& name) {
  const std::string p = d.file(name);
  std::vector<float> x(2 * 16 * 8, 0.5f);
  npy::write(p, {2, 16, 8}, x.data());
  return p;
}

TEST(HostileInputs, AManifestLinkedToDevZeroIsRefusedNotRead) {
  test::ScratchDir d;
  fs::create_directory(d.file("cap"));
  const std::string manifest = d.file("cap/manifest.json");
  fs::create_symlink("/dev/zero", manifest);
  for (const char* cmd :
       {"run --method exact.flash --layer 0 --qkv ", "bench --method exact.flash --layer 0 --qkv ",
        "advise --tol 0.1 --layer 0 --qkv "})
    expect_refused(cmd + d.file("cap"),
                   {"--qkv manifest '" + manifest +
                    "' (a symbolic link to '/dev/zero') is a character device, not a "
                    "regular file"});
}

TEST(HostileInputs, FifosAreRefusedBeforeTheyAreOpened) {
  test::ScratchDir d;
  // No process ever writes to these: opening one for reading would block forever.
  fs::create_directory(d.file("cap"));
  make_fifo(d, "cap/manifest.json");
  expect_refused("run --method exact.flash --layer 0 --qkv " + d.file("cap"),
                 {"is a FIFO (named pipe)"});
  const std::string q = write_npy(d, "q.npy"), fifo = make_fifo(d, "k.npy");
  expect_refused("run --method exact.flash --q " + q + " --k " + fifo + " --v " + q,
                 {".npy file '" + fifo + "' is a FIFO (named pipe), not a regular file"});
  const std::string model = make_fifo(d, "model.gguf");
  expect_refused("gguf-info --model " + model,
                 {"GGUF file '" + model + "' is a FIFO (named pipe)"});
  const std::string text = make_fifo(d, "text.txt");
  expect_refused(
      "ppl --model " + test::tiny_model_with_vocab() + " --text " + text + " --ctx 16 --chunks 1",
      {"--text file '" + text + "' is a FIFO (named pipe), not a regular file"});
  expect_refused("capture --model " + test::tiny_model_with_vocab() + " --text " + text +
                     " --tokens 8 --layers 0 --out " + d.file("out"),
                 {"--text file '" + text + "' is a FIFO"});
}

TEST(HostileInputs, DevicesAndDirectoriesAreNamed) {
  test::ScratchDir d;
  expect_refused("gguf-info --model /dev/zero",
                 {"GGUF file '/dev/zero' is a character device, not a regular file"});
  fs::create_directory(d.file("cap"));
  fs::create_directory(d.file("cap/manifest.json"));
  expect_refused(
      "run --method exact.flash --layer 0 --qkv " + d.file("cap"),
      {"--qkv manifest '" + d.file("cap/manifest.json") + "' is a directory, not a file"});
  expect_refused(
      "ppl --model " + test::tiny_model_with_vocab() + " --text " + d.path().string() + " --ctx 16",
      {"--text file '" + d.path().string() + "' is a directory"});
}

TEST(HostileInputs, AGgufBeyondTheAddressSpaceLimitIsRefusedBeforeMapping) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer reserves terabytes of shadow address space at start-up, so the CLI "
                  "cannot start under an address-space limit";
#endif
  test::ScratchDir d;
  const std::string big = d.file("big.gguf");
  std::ofstream(big) << "GGUF";
  fs::resize_file(big, std::uintmax_t{64} << 30);  // sparse: no disk used
  std::string out;
  // 8 GiB of address space: enough for the program, not for a 64 GiB mapping.
  const int rc =
      test::run_command("ulimit -v 8388608 && timeout 60 " + std::string(NUMATTN_CLI_PATH) +
                            " gguf-info --model " + big + " 2>&1",
                        &out);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("GGUF file '" + big +
                     "' is 64.0 GiB (68719476736 bytes), more than this process may map"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("RLIMIT_AS"), std::string::npos) << out;
}

TEST(HostileOutputs, EmptyPathsAreRefusedByTheirOption) {
  test::ScratchDir d;
  const std::string model = test::tiny_model_with_vocab();
  const std::string text = d.file("t.txt");
  std::ofstream(text) << test::tiny_text(200);
  expect_refused("run --method exact.flash --n 16 --heads 1 --d 8 --out ''",
                 {"error: --out: empty path"});
  expect_refused("run --method exact.flash --n 16 --heads 1 --d 8 --lse-out ''",
                 {"error: --lse-out: empty path"});
  expect_refused("bd --in " + write_npy(d, "w.npy") + " --rank 2 --out-prefix ''",
                 {"error: --out-prefix: empty path"});
  expect_refused("convert --model " + model + " --bda vo --out ''", {"error: --out: empty path"});
  expect_refused("capture --model " + model + " --text " + text + " --tokens 8 --layers 0 --out ''",
                 {"error: --out: empty path"});
  expect_refused("analyze --model " + model + " --text " + text + " --tokens 8 --layers 0 --out ''",
                 {"error: --out: empty path"});
}

TEST(HostileOutputs, AFileWhereADirectoryIsExpectedAndTheReverse) {
  test::ScratchDir d;
  const std::string model = test::tiny_model_with_vocab();
  const std::string text = d.file("t.txt");
  std::ofstream(text) << test::tiny_text(200);
  fs::create_directory(d.file("dir"));
  expect_refused("run --method exact.flash --n 16 --heads 1 --d 8 --out " + d.file("dir"),
                 {"error: --out: '" + d.file("dir") + "' is a directory; give a file name"});
  expect_refused(
      "run --method exact.flash --n 16 --heads 1 --d 8 --lse-out " + d.file("none/lse.npy"),
      {"error: --lse-out: '" + d.file("none/lse.npy") + "': the directory '" + d.file("none") +
       "' does not exist"});
  expect_refused("convert --model " + model + " --bda vo --out " + d.file("dir"),
                 {"error: --out: ", "is a directory"});
  const std::string file = d.file("file");
  std::ofstream(file) << "x";
  expect_refused(
      "capture --model " + model + " --text " + text + " --tokens 8 --layers 0 --out " + file,
      {"error: --out: '" + file + "' exists and is not a directory"});
  expect_refused("analyze --model " + model + " --text " + text + " --tokens 8 --layers 0 --out " +
                     file + "/sub",
                 {"error: --out: '" + file + "/sub' cannot be created: '" + file +
                  "' is a file, not a directory"});
  expect_refused("report --no-model --out " + file,
                 {"error: --out: '" + file + "' exists and is not a directory"});
  // An input as the output directory names the input.
  expect_refused(
      "capture --model " + model + " --text " + text + " --tokens 8 --layers 0 --out " + text,
      {"error: --out: '" + text + "' is the --text file"});
}

TEST(HostileOutputs, AnOutputThatIsAnInputIsRefused) {
  test::ScratchDir d;
  const std::string model = test::tiny_model_with_vocab();
  const std::string copy = d.file("m.gguf");
  fs::copy_file(model, copy);
  const auto before = fs::file_size(copy);
  expect_refused("convert --model " + copy + " --bda vo --out " + d.path().string() + "/./m.gguf",
                 {"--out '" + d.path().string() +
                  "/./m.gguf' is the same file as the input --model '" + copy + "'"});
  EXPECT_EQ(fs::file_size(copy), before);
  const std::string q = write_npy(d, "q.npy");
  expect_refused("run --method exact.flash --q " + q + " --k " + q + " --v " + q + " --out " + q,
                 {"--out '" + q + "' is the same file as the input --q"});
  expect_refused("bd --in " + write_npy(d, "w.basis.npy") + " --rank 2 --out-prefix " + d.file("w"),
                 {"is the same file as the input --in"});
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
