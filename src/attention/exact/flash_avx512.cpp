// The avx512 variant of exact.flash (flash_impl.h).
#define NUMATTN_ISA 2
#include "attention/exact/flash_impl.h"
