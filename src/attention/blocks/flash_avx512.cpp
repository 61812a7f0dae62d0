// The avx512 variant of the flash block (flash_impl.h).
#define NUMATTN_ISA 2
#include "attention/blocks/flash_impl.h"
