// Default data locations (see data.h; scripts/fetch_data.sh fills the cache).
#include "numattn/model/data.h"

#include <cstdlib>
#include <filesystem>

#include "numattn/core/error.h"

namespace numattn {

std::string cache_dir() {
  if (const char* c = std::getenv("NUMATTN_CACHE"); c && *c) return c;
  const char* home = std::getenv("HOME");
  NUMATTN_CHECK(home && *home, "neither NUMATTN_CACHE nor HOME is set: set NUMATTN_CACHE to the "
                               "data cache directory used by scripts/fetch_data.sh");
  return std::string(home) + "/.cache/numattn";
}

namespace {
std::string cached(const char* file, const char* what, const char* fetch = "scripts/fetch_data.sh") {
  const std::string p = cache_dir() + "/" + file;
  NUMATTN_CHECK(std::filesystem::is_regular_file(p),
                "the {} is not cached at {}: run {} (it downloads and checksums it; set NUMATTN_CACHE to "
                "use another cache directory)",
                what, p, fetch);
  return p;
}
}  // namespace

std::string default_model_path() { return cached(kDefaultModelFile, "default model"); }
std::string default_text_path() { return cached(kDefaultTextFile, "default text"); }

std::string resolve_model_path(const std::string& arg) {
  if (arg == "gemma3") return cached(kGemma3File, "Gemma 3 model", "scripts/fetch_data.sh --what gemma3");
  return arg == "default" ? default_model_path() : arg;
}
std::string resolve_text_path(const std::string& arg) {
  return arg == "default" ? default_text_path() : arg;
}

}  // namespace numattn
