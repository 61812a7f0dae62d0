// The avx512vnni table of quant_gemv over SIMDe's intrinsics: see qgemv_emulated.h.
#if __has_include(<simde/x86/avx512.h>)
#include "qgemv_emulated_intrinsics.h"
#define NUMATTN_QGEMV_EMULATED 1
#define NUMATTN_QGEMV_VNNI 1
#include "quant/qgemv_avx512_impl.h"
#endif
