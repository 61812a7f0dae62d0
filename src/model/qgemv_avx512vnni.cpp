// AVX-512 VNNI kernels of quant_gemv (model/qgemv.h): the same kernels as qgemv_avx512.cpp
// (lane traits in qgemv_avx512_lanes.h), with the integer kernels' byte dot products through
// vpdpbusd. Compiled for AVX-512 F/BW/VL/DQ/VNNI + F16C + FMA by the pragma below whatever the
// build's -march; called only when cpuid says the CPU has them (qgemv.cpp). Nothing here has
// external linkage but avx512vnni_table(): see qgemv_kernels.h.
#include "qgemv_kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <string.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma,avx2,avx512vnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma,avx2,avx512vnni")
// GCC 12 reports the deliberately undefined pass-through operand of its own AVX-512
// intrinsics (_mm512_undefined_*) as uninitialized when they are inlined under a target pragma.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "qgemv_simd.h"
#include "qgemv_avx512_lanes.h"

namespace numattn::qkern {
namespace {

constexpr KernelTable kTable = simd::make_table<V512<true>>();

}  // namespace
}  // namespace numattn::qkern

// Outside the pragma: this runs on any CPU (to learn the path exists), so it must not be
// compiled for AVX-512 itself.
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif

namespace numattn::qkern {
const KernelTable* avx512vnni_table() { return &kTable; }
}  // namespace numattn::qkern

#else
namespace numattn::qkern {
const KernelTable* avx512vnni_table() { return nullptr; }
}  // namespace numattn::qkern
#endif
