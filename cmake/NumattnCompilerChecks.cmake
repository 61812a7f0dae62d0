# Code-generation bugs of the compiler that the project's flags must avoid. Each is checked by
# running the pattern at configure time with the build's -march (the tests' compiler_check runs it
# again with every flag of the build, so a miss here fails a test instead of computing nonsense).
include(CheckCXXSourceRuns)
include(CheckCXXCompilerFlag)

# GCC 12.2 vectorises a byte dot product Σ int8(p)·int8(x), where the signed bytes p were loaded
# as unsigned and converted, into vpdpbusd (unsigned x signed) when AVX-512 VNNI or AVX-VNNI is
# enabled, so each negative p counts as p + 256 (as GGUF blocks are read: bytes, then int8).
# With -march=native on such a CPU every loop of that shape in the library (and in what it
# inlines) would be wrong; the quantized kernels are written in the unsigned x signed form that
# vpdpbusd computes exactly (qgemv_simd.h), and the baseline turns the two extensions off for
# the vectoriser. The kernels that use VNNI enable it with their own target pragma.
if(NUMATTN_NATIVE AND CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64" AND NOT CMAKE_CROSSCOMPILING)
  # Asked again at every configure (a second of work): a cached answer would outlive a change of
  # compiler or of this check.
  unset(NUMATTN_INT8_DOT_CORRECT CACHE)
  set(CMAKE_REQUIRED_FLAGS "-O2 -march=native")
  check_cxx_source_runs([=[
    #include <cstdint>
    __attribute__((noinline)) int dot(const std::uint8_t* p, const std::int8_t* x) {
      int s = 0;
      for (int j = 0; j < 32; ++j) s += static_cast<std::int8_t>(p[j]) * x[j];
      return s;
    }
    int main() {
      std::uint8_t p[32];
      std::int8_t x[32];
      for (int j = 0; j < 32; ++j) { p[j] = 0xff; x[j] = 1; }
      return dot(p, x) == -32 ? 0 : 1;
    }]=] NUMATTN_INT8_DOT_CORRECT)
  unset(CMAKE_REQUIRED_FLAGS)
  if(NOT NUMATTN_INT8_DOT_CORRECT)
    set(_workaround "")
    foreach(_flag -mno-avx512vnni -mno-avxvnni)
      string(MAKE_C_IDENTIFIER "NUMATTN_HAS_FLAG${_flag}" _var)
      check_cxx_compiler_flag(${_flag} ${_var})
      if(${_var})
        list(APPEND _workaround ${_flag})
      endif()
    endforeach()
    message(STATUS "numattn: ${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION} miscompiles signed int8 "
                   "dot products with -march=native on this CPU (vpdpbusd); compiling with ${_workaround}")
    add_compile_options(${_workaround})
    set(NUMATTN_CODEGEN_WORKAROUNDS ${_workaround})
  endif()
endif()
