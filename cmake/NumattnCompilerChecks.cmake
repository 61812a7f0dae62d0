# Code-generation bugs of the compiler that the project's flags must avoid. Each is checked by
# running the pattern at configure time with the build's -march (the tests' compiler_check runs it
# again with every flag of the build, so a miss here fails a test instead of computing nonsense).
include(CheckCXXCompilerFlag)

# GCC 12.2 vectorises a byte dot product Σ int8(p)·int8(x), where the signed bytes p were loaded
# as unsigned and converted, into vpdpbusd (unsigned x signed) when AVX-512 VNNI or AVX-VNNI is
# enabled, so each negative p counts as p + 256 (as GGUF blocks are read: bytes, then int8).
# With -march=native on such a CPU every loop of that shape in the library (and in what it
# inlines) would be wrong; the quantized kernels are written in the unsigned x signed form that
# vpdpbusd computes exactly (qgemv_simd.h), and the baseline turns the two extensions off for
# the vectoriser. The kernels that use VNNI enable it with their own target pragma.
if(NUMATTN_NATIVE AND CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64" AND NOT CMAKE_CROSSCOMPILING)
  # The program the ctest compiler.int8_dot runs (tests/core/compiler_check.cpp), here with
  # -march=native alone; asked again at every configure (a second of work), so that a cached
  # answer cannot outlive a change of compiler.
  try_run(_int8_run _int8_compiled ${CMAKE_BINARY_DIR}/numattn_int8_check
          ${PROJECT_SOURCE_DIR}/tests/core/compiler_check.cpp
          CMAKE_FLAGS "-DINCLUDE_DIRECTORIES=${PROJECT_SOURCE_DIR}/src"
          COMPILE_DEFINITIONS -O2 -march=native
          CXX_STANDARD 20 CXX_STANDARD_REQUIRED ON)
  if(_int8_compiled AND _int8_run EQUAL 0)
    set(NUMATTN_INT8_DOT_CORRECT ON)
  else()
    set(NUMATTN_INT8_DOT_CORRECT OFF)
  endif()
  if(NOT NUMATTN_INT8_DOT_CORRECT)
    set(_workaround "")
    foreach(_flag -mno-avx512vnni -mno-avxvnni)
      string(MAKE_C_IDENTIFIER "NUMATTN_HAS_FLAG${_flag}" _var)
      check_cxx_compiler_flag(${_flag} ${_var})
      if(${_var})
        list(APPEND _workaround ${_flag})
      endif()
    endforeach()
    string(JOIN " " _shown ${_workaround})
    message(STATUS "numattn: ${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION} miscompiles signed int8 "
                   "dot products with -march=native on this CPU (vpdpbusd); compiling with ${_shown}")
    add_compile_options(${_workaround})
  endif()
endif()
