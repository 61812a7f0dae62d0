// The avx2 variant of core/simd.h's array functions (src/core/simd_kernels.h).
#define NUMATTN_ISA 1
#include "core/simd_kernels.h"
