// The avx2 variant of the selection and gather loops (select_gather_kernels.h).
#define NUMATTN_ISA 1
#include "attention/blocks/select_gather_kernels.h"
