// The avx512 row kernel of 2-simplicial attention (simplicial_vec.h).
#define NUMATTN_ISA 2
#include "attention/tensor/simplicial_vec.h"
