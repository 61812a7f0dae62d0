/// @file cpu.h
/// Instruction-set paths and their choice at run time.
///
/// The library is compiled for a baseline (x86-64-v3: AVX2 + FMA + F16C, unless the build
/// turns NUMATTN_NATIVE on), and each SIMD kernel family is compiled once more per path in
/// translation units of their own whose target attribute adds that path's instructions
/// (core/isa_begin.h). Which variant runs is decided here, once, from cpuid: the widest path
/// this CPU and OS can run, or the one NUMATTN_CPU_PATH names (portable, avx2, avx512,
/// avx512vnni), for every family at once. A family that has no variant for the chosen path
/// runs its widest variant below it (`kernel_paths`): exact.flash has no VNNI variant, so on
/// `avx512vnni` it runs `avx512`.
///
/// The portable path is each family's plain C++ source compiled for the baseline (what a
/// non-x86 build runs); on x86-64 the compiler may still vectorise it for the baseline.
#pragma once

#include <string>
#include <vector>

namespace numattn {

/// Instruction-set path of the dispatched kernels, narrowest first.
enum class CpuPath { kPortable = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Vnni = 3 };

/// "portable", "avx2", "avx512", "avx512vnni".
const char* cpu_path_name(CpuPath p);
/// Parses a path name; throws numattn::Error naming the choices.
CpuPath parse_cpu_path(const std::string& name);

/// True when this build compiled `p` (x86-64 with GCC or clang for all but portable) and this
/// CPU and OS can run it: avx2 = AVX2 + FMA + F16C with the OS saving ymm; avx512 = that plus
/// AVX-512 F/BW/DQ/VL with the OS saving zmm and the opmasks; avx512vnni = that plus VNNI.
bool cpu_can_run(CpuPath p);
/// Every path cpu_can_run, narrowest first.
std::vector<CpuPath> runnable_cpu_paths();

/// The path every dispatched kernel takes now: the innermost live CpuPathScope's, else the
/// one NUMATTN_CPU_PATH names (read once per process; throws numattn::Error when the name is
/// unknown or this CPU cannot run it), else the widest runnable path.
CpuPath default_cpu_path();

/// Runs every dispatched kernel on `p` while it lives (tests and benchmarks that compare
/// paths in one process). Throws numattn::Error when this CPU cannot run `p`. Scopes nest; set
/// it while no kernel runs (the choice is process-wide, read at each kernel call).
class CpuPathScope {
 public:
  explicit CpuPathScope(CpuPath p);
  ~CpuPathScope();
  CpuPathScope(const CpuPathScope&) = delete;
  CpuPathScope& operator=(const CpuPathScope&) = delete;

 private:
  int previous_;
};

/// One kernel family and the path it runs.
struct KernelPath {
  const char* family;  ///< e.g. "exact.flash"
  CpuPath path;        ///< the variant that runs
};

/// The widest of a family's variants at or below `p` that this build compiled, for a family
/// whose variants are every path from portable to `widest`; what each dispatcher calls.
CpuPath family_path(CpuPath p, CpuPath widest);

/// Records a dispatched kernel family for `kernel_paths` (a static object in the family's
/// dispatcher calls it; the name is not copied).
void register_kernel_family(const char* family, CpuPath widest);

/// The variant each registered kernel family runs when the library's path is `p`, by family
/// name (`numattn --version` prints them).
std::vector<KernelPath> kernel_paths(CpuPath p);

}  // namespace numattn
