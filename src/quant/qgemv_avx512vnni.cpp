// AVX-512 VNNI kernels of quant_gemv (quant/qgemv.h): the table `avx512vnni`, the avx512 one
// with the 8-bit-activation byte dot products in one vpdpbusd. The whole translation unit is
// qgemv_avx512_impl.h, shared with the plain AVX-512 table.
#define NUMATTN_QGEMV_VNNI 1
#include "qgemv_avx512_impl.h"
