// Atomic output and input checks (core/file_io.h): a failed write never changes the previous
// file, leaves no temporary, and outputs that alias inputs are refused however they are spelled.
#include "numattn/core/file_io.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>

#include "numattn/core/error.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

namespace fs = std::filesystem;

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void put(const std::string& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(dir)) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

class AtomicFileTest : public ::testing::Test {
 protected:
  test::ScratchDir scratch;
};

TEST_F(AtomicFileTest, ReplacesTheTargetAndLeavesNoTemporary) {
  const std::string t = scratch.file("out.bin");
  put(t, "old contents");
  write_file_atomically(t, "new", 3, "test file");
  EXPECT_EQ(slurp(t), "new");
  EXPECT_EQ(entries(scratch.path()), (std::vector<std::string>{"out.bin"}));
  write_file_atomically(scratch.file("fresh.bin"), "x", 1, "test file");
  EXPECT_EQ(slurp(scratch.file("fresh.bin")), "x");
}

TEST_F(AtomicFileTest, TemporaryHasARecognisableNameNextToTheTarget) {
  const std::string t = scratch.file("model.gguf");
  AtomicFile f(t, "test file");
  const fs::path tmp(f.temp_path());
  EXPECT_EQ(tmp.parent_path(), scratch.path());
  EXPECT_EQ(tmp.filename().string().rfind(".model.gguf" + std::string(kTempFileInfix), 0), 0u)
      << tmp;
  EXPECT_TRUE(fs::exists(tmp));
  EXPECT_FALSE(fs::exists(t)) << "the target appears only at commit";
}

TEST_F(AtomicFileTest, AnExceptionMidWriteLeavesThePreviousTargetIntact) {
  const std::string t = scratch.file("out.bin");
  put(t, "previous");
  EXPECT_THROW(
      {
        AtomicFile f(t, "test file");
        f.write("partial new conte", 17);
        throw std::runtime_error("interrupted");
      },
      std::runtime_error);
  EXPECT_EQ(slurp(t), "previous");
  EXPECT_EQ(entries(scratch.path()), (std::vector<std::string>{"out.bin"}));
}

// A real write error (file size limit, as a full disk): the error names the file and the
// reason, the previous target is untouched and the temporary is gone. Runs in a child process
// because the limit is process-wide.
TEST_F(AtomicFileTest, AWriteErrorLeavesThePreviousTargetIntact) {
  const std::string t = scratch.file("out.bin");
  const std::string before(1000, 'p');
  put(t, before);
  auto write_big_under_limit = [&] {
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit lim = {4096, 4096};
    setrlimit(RLIMIT_FSIZE, &lim);
    const std::string big(1 << 16, 'n');
    try {
      write_file_atomically(t, big.data(), big.size(), "big file");
    } catch (const Error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      std::exit(3);
    }
    std::exit(0);
  };
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the BLAS may have started threads
  EXPECT_EXIT(write_big_under_limit(), ::testing::ExitedWithCode(3),
              "error writing big file '.*out.bin': File too large");
  EXPECT_EQ(slurp(t), before);
  EXPECT_EQ(entries(scratch.path()), (std::vector<std::string>{"out.bin"}));
}

TEST_F(AtomicFileTest, ASymlinkedTargetIsReplacedThroughTheLink) {
  fs::create_directory(scratch.path() / "real");
  const std::string real = scratch.file("real/data.bin"), link = scratch.file("link.bin");
  put(real, "old");
  fs::create_symlink("real/data.bin", link);
  write_file_atomically(link, "new", 3, "test file");
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(slurp(real), "new");
  EXPECT_EQ(entries(scratch.path() / "real"), (std::vector<std::string>{"data.bin"}));
}

TEST_F(AtomicFileTest, KeepsTheModeOfAnExistingTargetAndTheUmaskForANewOne) {
  const std::string t = scratch.file("ro.bin");
  put(t, "old");
  fs::permissions(t, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  write_file_atomically(t, "new", 3, "test file");
  EXPECT_EQ(fs::status(t).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  const mode_t mask = ::umask(022);
  ::umask(mask);
  write_file_atomically(scratch.file("new.bin"), "x", 1, "test file");
  struct stat st {};
  ASSERT_EQ(::stat(scratch.file("new.bin").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0666 & ~mask);
}

TEST_F(AtomicFileTest, RefusesDirectoriesDevicesAndMissingDirectoriesByName) {
  EXPECT_NE(error_of([&] {
              write_file_atomically(scratch.path().string(), "x", 1, "GGUF file");
            }).find("cannot write GGUF file '" + scratch.path().string() + "': it is a directory"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              write_file_atomically("/dev/null", "x", 1, ".npy file");
            }).find("'/dev/null': it exists and is not a regular file"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              write_file_atomically(scratch.file("no/such/f.bin"), "x", 1, "f");
            }).find("does not exist"),
            std::string::npos);
  EXPECT_TRUE(fs::exists("/dev/null") && fs::is_character_file("/dev/null"));
}

TEST(SameFile, MatchesEverySpellingOfOneFile) {
  test::ScratchDir s;
  const std::string a = s.file("a.npy"), b = s.file("b.npy");
  put(a, "a");
  put(b, "b");
  fs::create_symlink(a, s.file("link.npy"));
  fs::create_hard_link(a, s.file("hard.npy"));
  EXPECT_TRUE(same_file(a, a));
  EXPECT_FALSE(same_file(a, b));
  EXPECT_TRUE(same_file(a, s.file("link.npy")));
  EXPECT_TRUE(same_file(a, s.file("hard.npy")));
  EXPECT_TRUE(same_file(a, (s.path() / "." / ".." / s.path().filename() / "a.npy").string()));
  // Paths that do not exist yet compare by their normalised form.
  EXPECT_TRUE(same_file(s.file("new.npy"), (s.path() / "./new.npy").string()));
  EXPECT_FALSE(same_file(s.file("new.npy"), s.file("new2.npy")));
  // Relative to the working directory.
  const fs::path cwd = fs::current_path();
  fs::current_path(s.path());
  EXPECT_TRUE(same_file("./a.npy", a));
  EXPECT_TRUE(same_file("x/../new.npy", "new.npy"));
  EXPECT_TRUE(same_file("./new.npy", "new.npy"));
  EXPECT_TRUE(same_file("none/./new.npy", "none/new.npy"));
  EXPECT_FALSE(same_file("none/new.npy", "new.npy"));
  fs::current_path(cwd);
}

TEST(SameFile, OutputsThatAliasAnInputOrEachOtherAreRefusedByName) {
  test::ScratchDir s;
  const std::string q = s.file("q.npy");
  put(q, "q");
  fs::create_symlink(q, s.file("alias.npy"));
  const std::string m1 = error_of([&] {
    check_outputs_distinct({{"--out", s.file("alias.npy")}},
                           {{"--k", s.file("k.npy")}, {"--q", q}});
  });
  EXPECT_NE(
      m1.find("--out '" + s.file("alias.npy") + "' is the same file as the input --q '" + q + "'"),
      std::string::npos)
      << m1;
  const std::string m2 = error_of([&] {
    check_outputs_distinct({{"--out", s.file("o.npy")}, {"--lse-out", s.file("./o.npy")}}, {});
  });
  EXPECT_NE(m2.find("are the same file"), std::string::npos) << m2;
  EXPECT_NO_THROW(check_outputs_distinct({{"--out", s.file("o.npy")}, {"--lse-out", ""}},
                                         {{"--q", q}, {"--mask", ""}}));
}

TEST(InputFiles, DirectoriesAndMissingFilesAreNamed) {
  test::ScratchDir s;
  EXPECT_NE(error_of([&] {
              read_file(s.path().string(), "--text file");
            }).find("--text file '" + s.path().string() + "' is a directory, not a file"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { check_input_file(s.path().string(), ".npy file"); }).find("is a directory"),
      std::string::npos);
  EXPECT_NE(error_of([&] {
              read_file(s.file("none.txt"), "--text file");
            }).find("--text file '" + s.file("none.txt") + "' does not exist"),
            std::string::npos);
  put(s.file("t.txt"), std::string("a\0b", 3));
  EXPECT_EQ(read_file(s.file("t.txt"), "text"), std::string("a\0b", 3));
  if (::geteuid() != 0) {  // root reads anything
    fs::permissions(s.file("t.txt"), fs::perms::none);
    EXPECT_NE(error_of([&] {
                read_file(s.file("t.txt"), "--text file");
              }).find("cannot read --text file '" + s.file("t.txt") + "': Permission denied"),
              std::string::npos);
  }
}

// Every reader goes through InputFile: a path that is not a regular file is refused from its
// stat, by name, before it is opened (a FIFO would block the open, /dev/zero never ends).
TEST(InputFiles, DevicesFifosAndSocketsAreRefusedBeforeTheyAreOpened) {
  test::ScratchDir s;
  const std::string zero = s.file("manifest.json");
  fs::create_symlink("/dev/zero", zero);
  const std::string m = error_of([&] { read_file(zero, "--qkv manifest", kJsonInput); });
  EXPECT_NE(m.find("--qkv manifest '" + zero +
                   "' (a symbolic link to '/dev/zero') is a character device, not a "
                   "regular file"),
            std::string::npos)
      << m;
  const std::string fifo = s.file("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // No writer ever opens the FIFO: an open for reading would wait for one forever.
  for (const auto& fn : std::vector<std::function<void()>>{
           [&] { read_file(fifo, "--text file"); },
           [&] { check_input_file(fifo, ".npy file"); },
           [&] { InputFile f(fifo, "GGUF file"); },
       }) {
    const std::string e = error_of(fn);
    EXPECT_NE(e.find("'" + fifo + "' is a FIFO (named pipe), not a regular file"),
              std::string::npos)
        << e;
  }
  EXPECT_NE(error_of([&] { read_file("/dev/null", "--text file"); }).find("is a character device"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_file("", "--text file"); }).find("--text file: empty path"),
            std::string::npos);
  EXPECT_NE(error_of([&] { InputFile f(s.path().string(), "GGUF file"); }).find("is a directory"),
            std::string::npos);
}

TEST(InputFiles, SizesAreBoundedBeforeReadingAndWhileReading) {
  test::ScratchDir s;
  put(s.file("big.json"), std::string(100, ' '));
  const InputLimit small{"a test document", 64};
  const std::string e = error_of([&] { read_file(s.file("big.json"), "--qkv manifest", small); });
  EXPECT_NE(e.find("--qkv manifest '" + s.file("big.json") +
                   "' is 100 bytes (100 B), more than a test document may "
                   "have (64 B)"),
            std::string::npos)
      << e;
  EXPECT_EQ(read_file(s.file("big.json"), "x", InputLimit{"a test document", 100}).size(), 100u);
  // A sparse file of 1 TiB is refused from its size alone (nothing is read or allocated).
  {
    const std::string sparse = s.file("sparse.txt");
    put(sparse, "");
    fs::resize_file(sparse, std::uintmax_t{1} << 40);
    const std::string t = error_of([&] { read_file(sparse, "--text file", kTextInput); });
    EXPECT_NE(
        t.find("is 1099511627776 bytes (1.00 TiB), more than a text file may have (4.00 GiB)"),
        std::string::npos)
        << t;
  }
  // /proc files report size 0: the bound holds while reading too.
  if (fs::exists("/proc/self/status")) {
    EXPECT_FALSE(read_file("/proc/self/status", "status", kJsonInput).empty());
    const std::string g = error_of([&] {
      read_file("/proc/self/status", "status", InputLimit{"a test file", 8});
    });
    EXPECT_NE(g.find("grew past 8 bytes"), std::string::npos) << g;
  }
}

TEST(InputFiles, ReadAtReadsExactlyOrNamesTheFile) {
  test::ScratchDir s;
  put(s.file("f.bin"), "0123456789");
  const InputFile f(s.file("f.bin"), ".npy file");
  EXPECT_EQ(f.size(), 10u);
  char buf[4] = {};
  f.read_at(buf, 4, 3);
  EXPECT_EQ(std::string(buf, 4), "3456");
  EXPECT_NE(error_of([&] { f.read_at(buf, 4, 8); }).find("ended at byte 10"), std::string::npos);
}

TEST(OutputPaths, EachKindIsRefusedWhereItCannotBeWhatIsAsked) {
  test::ScratchDir s;
  put(s.file("f"), "x");
  fs::create_directory(s.file("d"));
  auto err = [&](const std::string& p, OutputKind k) {
    return error_of([&] { check_output_path(p, "--out", k); });
  };
  EXPECT_NE(err("", OutputKind::kFile).find("--out: empty path"), std::string::npos);
  EXPECT_NE(err("", OutputKind::kDirectory).find("--out: empty path"), std::string::npos);
  EXPECT_NE(err(s.file("d"), OutputKind::kFile)
                .find("'" + s.file("d") + "' is a directory; give a file name"),
            std::string::npos);
  EXPECT_NE(err(s.file("new") + "/", OutputKind::kFile).find("ends in '/'"), std::string::npos);
  EXPECT_NE(err(s.file("none/o.npy"), OutputKind::kFile)
                .find("the directory '" + s.file("none") + "' does not exist"),
            std::string::npos);
  EXPECT_NE(err(s.file("f/o.npy"), OutputKind::kFile)
                .find("'" + s.file("f") + "' is a file, not a directory"),
            std::string::npos);
  EXPECT_NE(err("/dev/null", OutputKind::kFile).find("exists and is a character device"),
            std::string::npos);
  EXPECT_NE(err(s.file("f"), OutputKind::kDirectory)
                .find("'" + s.file("f") + "' exists and is not a directory"),
            std::string::npos);
  EXPECT_NE(err(s.file("f/sub/deeper"), OutputKind::kDirectory)
                .find("'" + s.file("f") + "' is a file, not a directory"),
            std::string::npos);
  fs::create_symlink(s.file("f"), s.file("link"));
  EXPECT_NE(err(s.file("link"), OutputKind::kDirectory).find("(a symbolic link to"),
            std::string::npos);
  // What can be written is accepted.
  EXPECT_NO_THROW(check_output_path(s.file("f"), "--out", OutputKind::kFile));
  EXPECT_NO_THROW(check_output_path(s.file("new.npy"), "--out", OutputKind::kFile));
  EXPECT_NO_THROW(check_output_path(s.file("d"), "--out", OutputKind::kDirectory));
  EXPECT_NO_THROW(check_output_path(s.file("a/b/c"), "--out", OutputKind::kDirectory));
  EXPECT_NO_THROW(check_output_path("relative.npy", "--out", OutputKind::kFile));
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
