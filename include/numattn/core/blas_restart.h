/// @file blas_restart.h
/// For programs only (the numattn CLI, the benchmark programs, a program embedding numattn):
/// re-executes the program with a fitting OPENBLAS_CORETYPE when the linked OpenBLAS fell back to
/// its generic kernels on this CPU (blas::recommended_coretype()). A library must not re-execute
/// its host process, so the library never calls this; it is a header of its own, inline, for the
/// programs' main() to call.
#pragma once

#include <cstdio>
#include <cstdlib>

#include <unistd.h>

#include "numattn/core/blas.h"

namespace numattn {

/// Call after the arguments parsed and before any work. When the kernels need fixing, says so in
/// one line on stderr, sets OPENBLAS_CORETYPE and re-executes `/proc/self/exe` with `argv`
/// (once: the new process finds the variable set). An explicit OPENBLAS_CORETYPE, or
/// NUMATTN_KEEP_BLAS_CORE=1, is respected. If exec fails the program goes on with the slow
/// kernels: results are the same, only speed differs.
inline void restart_with_fast_blas_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") || std::getenv("NUMATTN_KEEP_BLAS_CORE")) return;
  const char* core = blas::recommended_coretype();
  if (!core) return;
  std::fprintf(stderr,
               "numattn: OpenBLAS chose its generic '%s' kernels on this CPU; restarting with "
               "OPENBLAS_CORETYPE=%s (NUMATTN_KEEP_BLAS_CORE=1 keeps them)\n",
               blas::core_name(), core);
  std::fflush(stderr);
  ::setenv("OPENBLAS_CORETYPE", core, 1);
  ::execv("/proc/self/exe", argv);
  std::fprintf(stderr, "numattn: restart failed; going on with the generic kernels\n");
}

}  // namespace numattn
