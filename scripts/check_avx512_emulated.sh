#!/usr/bin/env bash
# Builds numattn with the avx512 variants of its dispatched kernels (core/isa_begin.h) compiled
# over SIMDe's portable intrinsics instead of for an AVX-512 target, and runs the test suite on
# that build: on a CPU without AVX-512, core/cpu.h then lists the avx512 path, so every test that
# loops over the CPU paths (the conformance matrix, the kernel tests) runs the AVX-512 code's
# logic too. How: -DNUMATTN_EMULATE_AVX512, and tests/support/emulated_avx512/ first on the
# include path with an <immintrin.h> that is SIMDe's (tests/support/qgemv_emulated_intrinsics.h),
# and Eigen scalar (its own vector code would include the compiler's intrinsics beside SIMDe's).
# The quantized kernel tables are emulated in every test build already
# (tests/support/qgemv_emulated.h). What it cannot show is the compiler's code generation for a
# real AVX-512 target (docs/design.md). Not part of CI: a clean build takes about 20 minutes on
# two cores. Needs AVX2 and libsimde-dev (scripts/setup.sh).
#   scripts/check_avx512_emulated.sh [ctest arguments, e.g. -R Flash]
# BUILD_DIR (default build-avx512-emulated); FULL=1 runs the conformance suite's full matrices
# (by default its quick subset, NUMATTN_TEST_QUICK, as the sanitizer pass of scripts/test.sh does).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f /usr/include/simde/x86/avx512.h ]; then
  echo "check_avx512_emulated: needs SIMDe's headers (libsimde-dev; scripts/setup.sh installs it)" >&2
  exit 1
fi
BUILD_DIR=${BUILD_DIR:-build-avx512-emulated}
FLAGS="-DNUMATTN_EMULATE_AVX512 -DEIGEN_DONT_VECTORIZE -I$PWD/tests/support/emulated_avx512 -Wno-psabi"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNUMATTN_NATIVE=OFF \
  -DNUMATTN_BUILD_PYTHON=OFF -DNUMATTN_BUILD_BENCHMARKS=OFF -DNUMATTN_UNITY=ON -DNUMATTN_MPI=OFF \
  "-DCMAKE_CXX_FLAGS=$FLAGS" >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)"
# The excluded tests need the Python package, MPI or a browser, none of which this build has.
QUICK=(env NUMATTN_TEST_QUICK=1)
[ "${FULL:-0}" = 1 ] && QUICK=(env -u NUMATTN_TEST_QUICK)
"${QUICK[@]}" ctest --test-dir "$BUILD_DIR" -j "$(nproc)" \
  -E "report[.]browser|python_pytest|dist[.]|install_find" "$@"
