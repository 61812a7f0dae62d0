#!/usr/bin/env bash
# Builds numattn with its compile-time AVX-512 code switched on over SIMDe's portable
# intrinsics and runs the test suite on that build: the `#if defined(__AVX512F__)` branches
# (core/simd.h, exact.flash's kernels, the tile softmax, Performer, the simplicial kernel, the
# cluster scans) checked on a CPU without AVX-512, where a native build never compiles them.
# How: tests/support/emulated_avx512/ comes first on the include path with an <immintrin.h>
# that is SIMDe's (tests/support/qgemv_emulated_intrinsics.h), __AVX512F__/BW/DQ/VL are
# defined by hand, and Eigen stays scalar (it would otherwise take the same macros as real
# AVX-512). The run-time dispatched quantized kernels are covered in every build already
# (tests/support/qgemv_emulated.h). Not part of CI: a clean build takes about 20 minutes on
# two cores. Needs AVX2 (the emulation compiles to AVX2) and libsimde-dev (scripts/setup.sh).
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
FLAGS="-mavx2 -mfma -mf16c -D__AVX512F__ -D__AVX512BW__ -D__AVX512DQ__ -D__AVX512VL__"
FLAGS+=" -DEIGEN_DONT_VECTORIZE -I$PWD/tests/support/emulated_avx512 -Wno-psabi"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNUMATTN_NATIVE=OFF \
  -DNUMATTN_BUILD_PYTHON=OFF -DNUMATTN_BUILD_BENCHMARKS=OFF -DNUMATTN_UNITY=ON -DNUMATTN_MPI=OFF \
  "-DCMAKE_CXX_FLAGS=$FLAGS" >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)"
# The excluded tests need the Python package, MPI or a browser, none of which this build has.
QUICK=(env NUMATTN_TEST_QUICK=1)
[ "${FULL:-0}" = 1 ] && QUICK=(env -u NUMATTN_TEST_QUICK)
"${QUICK[@]}" ctest --test-dir "$BUILD_DIR" -j "$(nproc)" \
  -E "report[.]browser|python_pytest|dist[.]|install_find" "$@"
