// The AVX-512 tables of quant_gemv built over SIMDe's portable intrinsics (Debian's
// libsimde-dev), so the kernel tests run them on CPUs without AVX-512.
//
// src/quant/qgemv_avx512_impl.h compiled a second time, with NUMATTN_QGEMV_EMULATED, in
// qgemv_emulated_avx512.cpp and qgemv_emulated_avx512vnni.cpp: the same lane traits and
// kernels, every intrinsic a SIMDe function computing it lane by lane (a few SIMDe 0.7 lacks
// are written in qgemv_emulated_intrinsics.h). At start-up they take the place
// (qkern::set_test_table) of each AVX-512 path the CPU cannot run, so QGemv.* and QGemvQ8.*,
// which loop over available_cpu_paths(), check them against the float64 reference as they check
// the native tables. Without SIMDe's headers nothing is built and the paths stay unavailable.
#pragma once

#include "quant/qgemv_kernels.h"

namespace numattn::qkern {

/// True when this test build has the emulated tables (SIMDe's headers were found).
bool emulated_tables_built();
/// The emulated tables (nullptr when not built).
const KernelTable* emulated_avx512_table();
const KernelTable* emulated_avx512vnni_table();

}  // namespace numattn::qkern
