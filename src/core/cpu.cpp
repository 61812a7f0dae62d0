// Instruction-set paths (core/cpu.h): cpuid, NUMATTN_CPU_PATH, scopes, the family registry.
#include "numattn/core/cpu.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>

#include "numattn/core/error.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#define NUMATTN_CPU_X86 1
#endif

namespace numattn {

namespace {

constexpr CpuPath kAllPaths[] = {CpuPath::kPortable, CpuPath::kAvx2, CpuPath::kAvx512, CpuPath::kAvx512Vnni};

struct CpuFeatures {
  bool avx2 = false, avx512 = false, avx512vnni = false;
};

CpuFeatures detect() {
  CpuFeatures f;
#ifdef NUMATTN_CPU_X86
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, f16c = (c >> 29) & 1;
  if (!osxsave || !avx) return f;
  // The OS must save the vector registers on a context switch: XCR0 bits 1-2 (SSE, AVX) and,
  // for AVX-512, bits 5-7 (opmask, upper halves of zmm0-15, zmm16-31).
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  const bool os_avx = (lo & 0x6u) == 0x6u, os_avx512 = (lo & 0xE6u) == 0xE6u;
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  const bool avx2 = (b >> 5) & 1, avx512f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1,
             vl = (b >> 31) & 1;
  f.avx2 = os_avx && avx2 && fma && f16c;
  f.avx512 = f.avx2 && os_avx512 && avx512f && dq && bw && vl;
  f.avx512vnni = f.avx512 && ((c >> 11) & 1);  // CPUID.(7,0):ECX[11] = AVX512_VNNI
#endif
#if defined(NUMATTN_EMULATE_AVX512)
  // scripts/check_avx512_emulated.sh: the avx512 variants are portable code (core/isa_begin.h).
  f.avx512 = f.avx512 || f.avx2;
#endif
  return f;
}

const CpuFeatures& features() {
  static const CpuFeatures f = detect();
  return f;
}

// The innermost CpuPathScope's path, -1 for none.
std::atomic<int> g_scope_path{-1};

CpuPath env_or_best_path() {
  static const CpuPath p = [] {
    if (const char* env = std::getenv("NUMATTN_CPU_PATH"); env != nullptr && *env != '\0') {
      CpuPath want = CpuPath::kPortable;
      try {
        want = parse_cpu_path(env);
      } catch (const Error& e) {
        throw Error(std::string("NUMATTN_CPU_PATH: ") + e.what());
      }
      NUMATTN_CHECK(cpu_can_run(want), "NUMATTN_CPU_PATH={}: this CPU (or build) cannot run that path (it runs: {})",
                    env, [] {
                      std::string s;
                      for (CpuPath q : runnable_cpu_paths()) s += (s.empty() ? "" : ", ") + std::string(cpu_path_name(q));
                      return s;
                    }());
      return want;
    }
    CpuPath best = CpuPath::kPortable;
    for (CpuPath c : kAllPaths)
      if (cpu_can_run(c)) best = c;
    return best;
  }();
  return p;
}

struct Family {
  const char* name;
  CpuPath widest;
};

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::vector<Family>& registry() {
  static std::vector<Family> r;
  return r;
}

}  // namespace

const char* cpu_path_name(CpuPath p) {
  switch (p) {
    case CpuPath::kPortable: return "portable";
    case CpuPath::kAvx2: return "avx2";
    case CpuPath::kAvx512: return "avx512";
    case CpuPath::kAvx512Vnni: return "avx512vnni";
  }
  return "?";
}

CpuPath parse_cpu_path(const std::string& name) {
  for (CpuPath p : kAllPaths)
    if (name == cpu_path_name(p)) return p;
  throw Error(fmt::format("unknown CPU path '{}': use portable, avx2, avx512 or avx512vnni", name));
}

bool cpu_can_run(CpuPath p) {
  switch (p) {
    case CpuPath::kPortable: return true;
    case CpuPath::kAvx2: return features().avx2;
    case CpuPath::kAvx512: return features().avx512;
    case CpuPath::kAvx512Vnni: return features().avx512vnni;
  }
  return false;
}

std::vector<CpuPath> runnable_cpu_paths() {
  std::vector<CpuPath> v;
  for (CpuPath p : kAllPaths)
    if (cpu_can_run(p)) v.push_back(p);
  return v;
}

CpuPath default_cpu_path() {
  const int s = g_scope_path.load(std::memory_order_acquire);
  return s >= 0 ? static_cast<CpuPath>(s) : env_or_best_path();
}

CpuPathScope::CpuPathScope(CpuPath p) : previous_(g_scope_path.load(std::memory_order_acquire)) {
  NUMATTN_CHECK(cpu_can_run(p), "CPU path {} cannot run on this CPU (or build)", cpu_path_name(p));
  g_scope_path.store(static_cast<int>(p), std::memory_order_release);
}

CpuPathScope::~CpuPathScope() { g_scope_path.store(previous_, std::memory_order_release); }

CpuPath family_path(CpuPath p, CpuPath widest) {
  // Only x86-64 builds compile the vector variants (core/isa_begin.h).
#ifndef NUMATTN_CPU_X86
  (void)p;
  (void)widest;
  return CpuPath::kPortable;
#else
  return static_cast<int>(p) < static_cast<int>(widest) ? p : widest;
#endif
}

void register_kernel_family(const char* family, CpuPath widest) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (const Family& f : registry())
    if (std::string(f.name) == family) return;
  registry().push_back({family, widest});
}

std::vector<KernelPath> kernel_paths(CpuPath p) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<KernelPath> v;
  for (const Family& f : registry()) v.push_back({f.name, family_path(p, f.widest)});
  std::sort(v.begin(), v.end(), [](const KernelPath& a, const KernelPath& b) { return std::string(a.family) < b.family; });
  return v;
}

}  // namespace numattn
