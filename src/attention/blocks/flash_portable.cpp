// The portable variant of the flash block (flash_impl.h).
#define NUMATTN_ISA 0
#include "attention/blocks/flash_impl.h"
