# Every numattn build option, in one place.
option(NUMATTN_BUILD_TESTS "Build the GoogleTest suite and register it with CTest" ${PROJECT_IS_TOP_LEVEL})
option(NUMATTN_BUILD_BENCHMARKS "Build the Google Benchmark programs in bench/" ${PROJECT_IS_TOP_LEVEL})
option(NUMATTN_BUILD_CLI "Build the numattn command-line tool" ON)
# The library runs on any CPU of the baseline (x86-64-v3: AVX2, FMA, F16C) and takes its AVX-512
# kernels where the CPU has them (run-time dispatch, core/cpu.h); NUMATTN_NATIVE compiles every
# file for the build machine instead (-march=native): a little faster outside the dispatched
# kernels, and only for that machine.
option(NUMATTN_NATIVE "Compile for the host CPU (-march=native) instead of NUMATTN_BASELINE" OFF)
set(NUMATTN_BASELINE "x86-64-v3" CACHE STRING
    "-march of a build without NUMATTN_NATIVE on x86-64 (empty: the compiler's default)")
option(NUMATTN_OPENMP "Use OpenMP for numattn::parallel_for (serial fallback otherwise)" ON)
option(NUMATTN_BLAS "Link OpenBLAS for GEMM (required by exact.naive and the sgemm baseline)" ON)
# The Python extension numattn._numattn (python/, nanobind): `pip install .` turns it on; in a
# CMake build it needs nanobind (scripts/setup.sh puts it in .venv; scripts/build.sh turns this
# on when it finds it) and adds the pytest suite to ctest.
option(NUMATTN_BUILD_PYTHON "Build the Python extension (needs nanobind and Python development files)" OFF)
option(NUMATTN_PIC "Compile libnumattn position-independent (always on with NUMATTN_BUILD_PYTHON)" OFF)
# MPI (Open MPI from Debian): the dist layer's communicator, dist.ring / dist.ulysses across ranks
# and `mpirun -n R numattn run|bench|ppl`. AUTO = on when MPI is found; without it the dist
# methods run single-rank and the MPI tests are not built.
set(NUMATTN_MPI "AUTO" CACHE STRING "Build the MPI back-end of the dist layer: AUTO, ON or OFF")
set_property(CACHE NUMATTN_MPI PROPERTY STRINGS AUTO ON OFF)
option(NUMATTN_CUDA "Build the CUDA back-end (compiles without a GPU; tests skip without one)" OFF)
option(NUMATTN_WERROR "Treat warnings as errors" OFF)
set(NUMATTN_SANITIZE "" CACHE STRING "Sanitizers to enable, e.g. address;undefined or thread")
option(NUMATTN_FUZZ "Build libFuzzer targets in fuzz/ (needs clang: CXX=clang++)" OFF)
# ccache, when installed, for every C++ compile (rebuilds of worktrees and sanitizer trees hit the
# same cache with CCACHE_BASEDIR set); a launcher given on the command line wins.
# Unity builds of the CLI and the test programs (batches of their .cpp files compiled as one):
# their files each instantiate the same CLI11 / GoogleTest / nlohmann-json templates, so a
# clean build compiles about a third as much; scripts/test.sh (CI) turns it on. The library is
# never unity-built (per-file target pragmas, file-local helpers of the same name). Off by
# default: an edit recompiles a whole batch, and a file's missing #include can hide in a batch.
option(NUMATTN_UNITY "Unity-build the CLI and the test programs (clean builds: CI)" OFF)
function(numattn_unity target batch)
  if(NUMATTN_UNITY)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${batch})
  endif()
endfunction()
option(NUMATTN_CCACHE "Compile through ccache when it is installed" ON)
if(NUMATTN_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  find_program(NUMATTN_CCACHE_PROGRAM ccache)
  if(NUMATTN_CCACHE_PROGRAM)
    set(CMAKE_CXX_COMPILER_LAUNCHER "${NUMATTN_CCACHE_PROGRAM}")
  endif()
endif()
