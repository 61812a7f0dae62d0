// Internal: opens the instruction-set variant of a kernel translation unit (core/cpu.h).
//
// A family's kernels are written once in a private header and compiled once per path by small
// translation units that define NUMATTN_ISA (0 portable, 1 avx2, 2 avx512) and include it. The
// header first includes everything it needs, then this file, then its code inside namespace
// `...::NUMATTN_ISA_NS` (portable, avx2 or avx512), then core/isa_end.h. Why in that order:
// - GCC and clang compile a function for the target in force where it is *defined*, so the
//   inline functions and templates of headers included before this file keep the baseline
//   (their out-of-line copies are shared by every variant through the linker, and one compiled
//   for AVX-512 could otherwise be picked for a caller on a CPU without it), while what is
//   defined after it gets the variant's instructions (it may inline the baseline helpers);
// - every name defined after it lives in a namespace of its own per variant, so no symbol
//   of one variant can stand in for another's.
// The target adds to the build's flags; it never removes any: with NUMATTN_NATIVE the avx2
// variant may use whatever the build machine has. NUMATTN_ISA_COMPILED is 0 where the variant
// cannot be compiled (not x86-64, or another compiler): its code is then left out and the
// family's getter returns nullptr. Code uses NUMATTN_ISA, never __AVX512F__ and friends: a
// target pragma does not define those macros under clang (and under GCC they keep the
// command line's meaning where the target adds nothing).
// GCC 12 reports '__Y may be used uninitialized' inside its own AVX-512 intrinsics once they are
// inlined into variant code (GCC bug 105593, fixed in GCC 13); no value there is uninitialised.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#if !defined(NUMATTN_ISA)
#error "define NUMATTN_ISA (0 portable, 1 avx2, 2 avx512) before including core/isa_begin.h"
#endif

#if NUMATTN_ISA == 0
#define NUMATTN_ISA_NS portable
#define NUMATTN_ISA_COMPILED 1
#elif NUMATTN_ISA == 2 && defined(NUMATTN_EMULATE_AVX512)
// The emulation build of scripts/check_avx512_emulated.sh: the avx512 variant over SIMDe's
// portable intrinsics (its <immintrin.h> comes first on that build's include path) and without
// a target, so it runs on a CPU without AVX-512 (where core/cpu.h then lists the path).
#define NUMATTN_ISA_NS avx512
#define NUMATTN_ISA_COMPILED 1
#include <immintrin.h>
#elif !(defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)))
#define NUMATTN_ISA_COMPILED 0
#if NUMATTN_ISA == 1
#define NUMATTN_ISA_NS avx2
#else
#define NUMATTN_ISA_NS avx512
#endif
#else
#define NUMATTN_ISA_COMPILED 1
#include <immintrin.h>
// (#pragma GCC target does not expand macros: one literal per variant.)
#if NUMATTN_ISA == 1
#define NUMATTN_ISA_NS avx2
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,bmi,bmi2,popcnt,lzcnt"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,popcnt,lzcnt")
#endif
#define NUMATTN_ISA_PUSHED 1
#elif NUMATTN_ISA == 2
#define NUMATTN_ISA_NS avx512
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c,bmi,bmi2,popcnt,lzcnt"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c,bmi,bmi2,popcnt,lzcnt")
#endif
#define NUMATTN_ISA_PUSHED 1
#else
#error "NUMATTN_ISA must be 0, 1 or 2"
#endif
#endif
