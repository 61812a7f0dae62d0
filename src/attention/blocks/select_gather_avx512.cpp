// The avx512 variant of the selection and gather loops (select_gather_kernels.h).
#define NUMATTN_ISA 2
#include "attention/blocks/select_gather_kernels.h"
