// The avx512 variant of Quest's page scoring (quest_kernels.h).
#define NUMATTN_ISA 2
#include "attention/sparse/quest_kernels.h"
