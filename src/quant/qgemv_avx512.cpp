// AVX-512 kernels of quant_gemv (quant/qgemv.h): the table `avx512` (F/BW/VL/DQ). The whole
// translation unit is qgemv_avx512_impl.h, shared with the VNNI table.
#define NUMATTN_QGEMV_VNNI 0
#include "qgemv_avx512_impl.h"
