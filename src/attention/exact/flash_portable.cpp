// The portable variant of exact.flash (flash_impl.h).
#define NUMATTN_ISA 0
#include "attention/exact/flash_impl.h"
