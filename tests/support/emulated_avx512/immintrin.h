// <immintrin.h> of the emulated AVX-512 build (scripts/check_avx512_emulated.sh): first on the
// include path, it gives every file SIMDe's portable intrinsics instead of the compiler's.
#pragma once
#include "../qgemv_emulated_intrinsics.h"
