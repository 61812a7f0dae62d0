// Internal: closes what core/isa_begin.h opened (the target of an instruction-set variant).
#if defined(NUMATTN_ISA_PUSHED)
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#undef NUMATTN_ISA_PUSHED
#endif
