// The avx2 variant of exact.flash (flash_impl.h).
#define NUMATTN_ISA 1
#include "attention/exact/flash_impl.h"
