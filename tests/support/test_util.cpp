#include "support/test_util.h"

#include <array>
#include <cstdio>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <system_error>
#include <utility>
#include <vector>

namespace numattn::test {

namespace {
// Files handed out by temp_path(), removed when the test process exits.
struct TempFiles {
  std::vector<std::filesystem::path> paths;
  ~TempFiles() {
    std::error_code ec;
    for (const auto& p : paths) std::filesystem::remove(p, ec);
  }
};
TempFiles g_temp_files;
}  // namespace

std::string temp_path(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() /
           ("numattn_" + std::to_string(::getpid()) + "_" + name);
  g_temp_files.paths.push_back(p);
  return p.string();
}

ScratchDir::ScratchDir() {
  std::string name = "numattn";
  if (const auto* info = ::testing::UnitTest::GetInstance()->current_test_info()) {
    name += std::string("_") + info->test_suite_name() + "_" + info->name();
  }
  for (char& c : name)
    if (c == '/') c = '_';  // parametrised tests are named Suite/Test
  path_ = std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

ScopedEnv::ScopedEnv(std::string name, const std::string& value) : name_(std::move(name)) {
  if (const char* old = std::getenv(name_.c_str())) old_ = old;
  ::setenv(name_.c_str(), value.c_str(), 1);
}

ScopedEnv::~ScopedEnv() {
  if (old_) ::setenv(name_.c_str(), old_->c_str(), 1);
  else ::unsetenv(name_.c_str());
}

std::string strip_notes(const std::string& s) {
  std::string out;
  std::size_t pos = 0;
  while (pos < s.size()) {
    std::size_t end = s.find('\n', pos);
    end = end == std::string::npos ? s.size() : end + 1;
    if (s.compare(pos, 9, "numattn: ") != 0) out.append(s, pos, end - pos);
    pos = end;
  }
  return out;
}

int run_command(const std::string& cmd, std::string* out) {
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return -1;
  std::array<char, 4096> buf;
  std::string s;
  std::size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), f)) > 0) s.append(buf.data(), n);
  int st = pclose(f);
  if (out) *out = s;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

CliResult cli(const std::string& args) {
  CliResult r;
  r.rc = run_command(std::string(NUMATTN_CLI_PATH) + " " + args + " 2>&1", &r.out);
  r.out = strip_notes(r.out);
  return r;
}

void expect_cli_error(const std::string& args, const std::vector<std::string>& must_contain,
                      const std::string& must_not_contain) {
  const CliResult r = cli(args);
  EXPECT_EQ(r.rc, 1) << args << "\n" << r.out;
  EXPECT_EQ(r.out.rfind("error: ", 0), 0u) << args << "\n" << r.out;
  for (const auto& s : must_contain) EXPECT_NE(r.out.find(s), std::string::npos) << args << "\n" << r.out;
  if (!must_not_contain.empty())
    EXPECT_EQ(r.out.find(must_not_contain), std::string::npos) << args << "\n" << r.out;
}

std::string gpt2_byte_symbol(int b) {
  auto printable = [](int c) { return (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE; };
  auto cp = static_cast<std::uint32_t>(b);
  if (!printable(b)) {
    cp = 256;
    for (int c = 0; c < b; ++c) cp += !printable(c);
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

}  // namespace numattn::test
