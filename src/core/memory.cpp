#include "numattn/core/memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <mutex>
#include <new>
#include <string>
#include <utility>

#include "numattn/core/error.h"

namespace numattn {

std::int64_t checked_mul(std::int64_t a, std::int64_t b, std::string_view what) {
  std::int64_t r = 0;
  NUMATTN_CHECK(a >= 0 && b >= 0 && !__builtin_mul_overflow(a, b, &r),
                "{}: the size {} × {} is negative or overflows 64 bits", what, a, b);
  return r;
}

std::int64_t checked_add(std::int64_t a, std::int64_t b, std::string_view what) {
  std::int64_t r = 0;
  NUMATTN_CHECK(a >= 0 && b >= 0 && !__builtin_add_overflow(a, b, &r),
                "{}: the size {} + {} is negative or overflows 64 bits", what, a, b);
  return r;
}

bool mul_overflows(std::uint64_t a, std::uint64_t b, std::uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

namespace {

// MemAvailable in bytes, or 0 when /proc/meminfo has no such line (old kernels, no /proc).
std::uint64_t meminfo_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kb * 1024;
  }
  return 0;
}

}  // namespace

std::uint64_t available_memory_bytes() {
  if (const char* env = std::getenv("NUMATTN_MEMORY_AVAILABLE"); env && *env) {
    const std::string s(env);
    errno = 0;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
    NUMATTN_CHECK(s.find_first_not_of("0123456789") == std::string::npos && errno == 0 &&
                      end == s.c_str() + s.size(),
                  "NUMATTN_MEMORY_AVAILABLE='{}' is not a byte count (decimal digits only)", s);
    return v;
  }
  if (const std::uint64_t m = meminfo_available(); m > 0) return m;
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page);
  return std::numeric_limits<std::uint64_t>::max();  // unknown: do not refuse on a guess
}

std::string format_bytes(std::uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    ++u;
  }
  if (u == 0) return fmt::format("{} B", bytes);
  return fmt::format("{:.{}f} {}", v, v < 10 ? 2 : (v < 100 ? 1 : 0), units[u]);
}

void check_memory(std::uint64_t bytes, std::string_view what) {
  const std::uint64_t avail = available_memory_bytes();
  if (bytes > avail)
    throw OutOfMemory(fmt::format("{} needs {} ({} bytes) of memory, but only {} ({} bytes) are available",
                                  what, format_bytes(bytes), bytes, format_bytes(avail), avail));
}

namespace {
constexpr std::size_t kHugePage = std::size_t{2} << 20;
}  // namespace

void* huge_page_alloc(std::size_t bytes) {
  if (bytes < kHugePage) return ::operator new(bytes == 0 ? 1 : bytes, std::align_val_t{64});
  // Over-map by one huge page and trim both ends, so that the block starts on a 2 MiB boundary
  // (a huge page can only back an aligned 2 MiB range).
  const std::size_t len = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* raw = mmap(nullptr, len + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const auto at = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t start = (at + kHugePage - 1) / kHugePage * kHugePage;
  if (start > at) munmap(raw, start - at);
  if (const std::size_t tail = at + len + kHugePage - (start + len); tail > 0)
    munmap(reinterpret_cast<void*>(start + len), tail);
#ifdef MADV_HUGEPAGE
  madvise(reinterpret_cast<void*>(start), len, MADV_HUGEPAGE);  // advice only: its failure changes nothing
#endif
  return reinterpret_cast<void*>(start);
}

void huge_page_free(void* p, std::size_t bytes) noexcept {
  if (p == nullptr) return;
  if (bytes < kHugePage) return ::operator delete(p, std::align_val_t{64});
  munmap(p, (bytes + kHugePage - 1) / kHugePage * kHugePage);
}

namespace {

struct KeptScratch {
  std::mutex mu;
  void* p = nullptr;
  std::size_t bytes = 0;
};

KeptScratch& kept_scratch() {
  static KeptScratch k;
  return k;
}

void scratch_free(void* p) noexcept { ::operator delete(p, std::align_val_t{64}); }

}  // namespace

std::size_t scratch_keep_limit() {
  std::uint64_t avail = std::numeric_limits<std::uint64_t>::max();
  try {
    avail = available_memory_bytes();
  } catch (const Error&) {  // a malformed override: keep the fixed limit
  }
  return static_cast<std::size_t>(std::min<std::uint64_t>(std::uint64_t{1} << 30, avail / 4));
}

ScratchBlock::ScratchBlock(std::size_t bytes) {
  const std::size_t want = std::max<std::size_t>(64, (bytes + 63) / 64 * 64);
  {
    KeptScratch& k = kept_scratch();
    const std::lock_guard<std::mutex> lock(k.mu);
    if (k.p != nullptr && k.bytes >= want) {
      p_ = std::exchange(k.p, nullptr);
      cap_ = std::exchange(k.bytes, 0);
      keep_ = true;  // it was within the limit when it was allocated
      return;
    }
  }
  p_ = ::operator new(want, std::align_val_t{64});
  cap_ = want;
  // Decided here, with the allocation (whose page faults cost far more than reading the
  // available memory), not at every release of a reused block.
  keep_ = cap_ <= scratch_keep_limit();
}

ScratchBlock::~ScratchBlock() {
  if (p_ == nullptr) return;
  void* drop = p_;
  if (keep_) {
    KeptScratch& k = kept_scratch();
    const std::lock_guard<std::mutex> lock(k.mu);
    if (cap_ > k.bytes) {  // keep the larger of the two
      std::swap(k.p, drop);
      k.bytes = cap_;
    }
  }
  if (drop != nullptr) scratch_free(drop);
}

std::size_t release_scratch_memory() noexcept {
  KeptScratch& k = kept_scratch();
  void* p = nullptr;
  std::size_t bytes = 0;
  {
    const std::lock_guard<std::mutex> lock(k.mu);
    p = std::exchange(k.p, nullptr);
    bytes = std::exchange(k.bytes, 0);
  }
  if (p != nullptr) scratch_free(p);
  return bytes;
}

}  // namespace numattn
