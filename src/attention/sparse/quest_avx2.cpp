// The avx2 variant of Quest's page scoring (quest_kernels.h).
#define NUMATTN_ISA 1
#include "attention/sparse/quest_kernels.h"
