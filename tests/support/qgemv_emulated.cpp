// Puts the emulated AVX-512 tables (qgemv_emulated.h) in place of the AVX-512 paths this CPU
// cannot run, before any test starts.
#include "qgemv_emulated.h"

#include "numattn/quant/qgemv.h"

namespace numattn::qkern {

#if __has_include(<simde/x86/avx512.h>)
bool emulated_tables_built() { return true; }
#else
bool emulated_tables_built() { return false; }
const KernelTable* emulated_avx512_table() { return nullptr; }
const KernelTable* emulated_avx512vnni_table() { return nullptr; }
#endif

[[maybe_unused]] static const bool kInstalled = [] {
  if (!emulated_tables_built()) return false;
  if (!cpu_path_available(CpuPath::kAvx512)) set_test_table(CpuPath::kAvx512, emulated_avx512_table());
  if (!cpu_path_available(CpuPath::kAvx512Vnni))
    set_test_table(CpuPath::kAvx512Vnni, emulated_avx512vnni_table());
  return true;
}();

}  // namespace numattn::qkern
