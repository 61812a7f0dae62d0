// The avx2 variant of the flash block (flash_impl.h).
#define NUMATTN_ISA 1
#include "attention/blocks/flash_impl.h"
