// Default data paths (data.h) and the fetch script's R extractor (tests/scripts).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

#include <unistd.h>

#include "numattn/model/data.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

// Sets an environment variable for the scope of the object, restoring it afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* v = std::getenv(name)) old_ = v;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(DefaultData, DefaultPathsResolveOrExplain) {
  const test::ScratchDir scratch;
  const auto& dir = scratch.path();
  {
    ScopedEnv env("NUMATTN_CACHE", dir.string());
    EXPECT_EQ(cache_dir(), dir.string());
    try {
      default_model_path();
      ADD_FAILURE() << "expected an error for a missing model";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("scripts/fetch_data.sh"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(kDefaultModelFile), std::string::npos) << e.what();
    }
    EXPECT_THROW(default_text_path(), Error);
    EXPECT_THROW(resolve_text_path("default"), Error);
    EXPECT_EQ(resolve_model_path("/some/model.gguf"), "/some/model.gguf");
    std::ofstream(dir / kDefaultModelFile) << "x";
    std::ofstream(dir / kDefaultTextFile) << "y";
    EXPECT_EQ(default_model_path(), (dir / kDefaultModelFile).string());
    EXPECT_EQ(resolve_model_path("default"), (dir / kDefaultModelFile).string());
    EXPECT_EQ(resolve_text_path("default"), (dir / kDefaultTextFile).string());
    // Gemma 3 is fetched on request only: the error names the command that fetches it.
    try {
      resolve_model_path("gemma3");
      ADD_FAILURE() << "expected an error for a missing Gemma 3 file";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("fetch_data.sh --what gemma3"), std::string::npos) << e.what();
    }
    std::ofstream(dir / kGemma3File) << "z";
    EXPECT_EQ(resolve_model_path("gemma3"), (dir / kGemma3File).string());
  }
  {
    ScopedEnv env("NUMATTN_CACHE", "");
    ScopedEnv home("HOME", "/home/someone");
    EXPECT_EQ(cache_dir(), "/home/someone/.cache/numattn");
  }
}

TEST(DefaultData, FetchScriptExtractorUnitTests) {
  std::string out;
  if (test::run_command("python3 -c 'import sys; sys.exit(0)' 2>/dev/null", &out) != 0)
    GTEST_SKIP() << "python3 not available";
  const std::string cmd =
      std::string("python3 ") + NUMATTN_SOURCE_DIR + "/tests/scripts/test_fetch_data.py 2>&1";
  const int rc = test::run_command(cmd, &out);
  EXPECT_EQ(rc, 0) << out;
}

TEST(DefaultData, CachedTextLooksRight) {
  std::string path;
  try {
    path = default_text_path();
  } catch (const Error& e) {
    GTEST_SKIP() << e.what();
  }
  EXPECT_EQ(std::filesystem::file_size(path), 4025029u);
  std::ifstream in(path);
  std::string first;
  std::getline(in, first);
  EXPECT_EQ(first, "SENSE AND SENSIBILITY");
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
