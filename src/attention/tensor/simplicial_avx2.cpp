// The avx2 row kernel of 2-simplicial attention (simplicial_vec.h).
#define NUMATTN_ISA 1
#include "attention/tensor/simplicial_vec.h"
