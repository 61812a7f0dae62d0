// The emulated AVX-512 kernel tables (support/qgemv_emulated.h): present where SIMDe is, in
// place only of paths this CPU lacks, never the default; and with one removed, the path is
// refused again. (Their numbers are checked by QGemv.* and QGemvQ8.*, which run every
// available path.)
#include <gtest/gtest.h>

#include "quant/qgemv_kernels.h"
#include "numattn/core/error.h"
#include "numattn/quant/qgemv.h"
#include "support/qgemv_emulated.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

TEST(QGemvEmulated, AvxTablesRunEverywhereTheEmulationIsBuilt) {
  if (!qkern::emulated_tables_built()) GTEST_SKIP() << "built without SIMDe's headers (libsimde-dev)";
  EXPECT_TRUE(cpu_path_available(CpuPath::kAvx512));
  EXPECT_TRUE(cpu_path_available(CpuPath::kAvx512Vnni));
  ASSERT_NE(qkern::emulated_avx512_table(), nullptr);
  ASSERT_NE(qkern::emulated_avx512vnni_table(), nullptr);
}

TEST(QGemvEmulated, ARemovedTableIsRefusedAndNeverTheDefault) {
  if (!qkern::emulated_tables_built()) GTEST_SKIP() << "built without SIMDe's headers (libsimde-dev)";
  const struct {
    CpuPath path;
    const qkern::KernelTable* table;
  } emulated[] = {{CpuPath::kAvx512, qkern::emulated_avx512_table()},
                  {CpuPath::kAvx512Vnni, qkern::emulated_avx512vnni_table()}};
  QuantMatrix m;
  m.cols = 1;
  const float w = 2, x = 3;
  m.parts.push_back({GgmlType::F32, reinterpret_cast<const std::uint8_t*>(&w), 1, 4});
  for (const auto& e : emulated) {
    SCOPED_TRACE(cpu_path_name(e.path));
    float y = 0;
    quant_gemv(m, 0, 1, &x, 1, 1, &y, 1, false, e.path);  // native or emulated, it runs
    EXPECT_EQ(y, 6.f);
    qkern::set_test_table(e.path, nullptr);
    const bool native = cpu_path_available(e.path);
#if defined(NUMATTN_EMULATE_AVX512)
    const bool emulation_build = true;  // core/cpu.h lists avx512 as runnable there
#else
    const bool emulation_build = false;
#endif
    if (!native && !emulation_build) {
      EXPECT_THROW(quant_gemv(m, 0, 1, &x, 1, 1, &y, 1, false, e.path), Error);
      EXPECT_NE(default_cpu_path(), e.path);
    }
    qkern::set_test_table(e.path, native ? nullptr : e.table);
    EXPECT_TRUE(cpu_path_available(e.path));
  }
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
