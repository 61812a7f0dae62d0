// The avx512 variant of core/simd.h's array functions (src/core/simd_kernels.h).
#define NUMATTN_ISA 2
#include "core/simd_kernels.h"
