# Third-party dependencies: all from Debian packages (scripts/setup.sh installs them).
add_library(numattn_deps INTERFACE)

find_package(fmt REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(Eigen3 3.4 REQUIRED NO_MODULE)
find_package(ZLIB REQUIRED)
find_package(Threads REQUIRED)
target_link_libraries(numattn_deps INTERFACE fmt::fmt nlohmann_json::nlohmann_json Eigen3::Eigen
                      ZLIB::ZLIB Threads::Threads)
# numattn starts threads only through parallel_for (core/exec.h): Eigen must not open OpenMP
# teams of its own under -fopenmp.
target_compile_definitions(numattn_deps INTERFACE EIGEN_DONT_PARALLELIZE)
# Eigen's alignment (EIGEN_MAX_ALIGN_BYTES) is part of the ABI of every Eigen object that crosses
# the library's interface (decomp::MatrixXd); by default it follows the widest vector ISA of the
# compile flags. Fixed at 64 bytes, it no longer depends on -march: the library, its tests and a
# program built against the installed package agree whatever each was compiled for.
target_compile_definitions(numattn_deps INTERFACE EIGEN_MAX_ALIGN_BYTES=64)

if(NUMATTN_OPENMP)
  find_package(OpenMP REQUIRED)
  target_link_libraries(numattn_deps INTERFACE OpenMP::OpenMP_CXX)
  target_compile_definitions(numattn_deps INTERFACE NUMATTN_HAS_OPENMP=1)
endif()

# OpenBLAS and FFTW3 through find modules of our own (cmake/Find*.cmake), which the installed
# package config reuses, so that find_package(numattn) finds the same libraries (NumattnInstall).
list(APPEND CMAKE_MODULE_PATH ${CMAKE_CURRENT_LIST_DIR})
if(NUMATTN_BLAS)
  find_package(NumattnOpenBLAS REQUIRED)
  target_link_libraries(numattn_deps INTERFACE NumattnOpenBLAS::OpenBLAS)
  target_compile_definitions(numattn_deps INTERFACE NUMATTN_HAS_BLAS=1)
else()
  message(FATAL_ERROR "NUMATTN_BLAS=OFF is not supported yet: GEMM has no fallback")
endif()

# FFTW3 (double precision) for the TensorSketch's circular convolutions (decomp/sketch.h).
find_package(NumattnFFTW3 REQUIRED)
target_link_libraries(numattn_deps INTERFACE NumattnFFTW3::FFTW3)

# MPI for the dist layer (src/dist/mpi/), linked into the library only: no MPI header reaches
# include/numattn/ (dist/comm.h is MPI-free), so nothing else needs MPI to build against numattn.
set(NUMATTN_HAS_MPI OFF)
if(NOT NUMATTN_MPI STREQUAL "OFF")
  # The C API through the C++ compiler (the project enables only CXX); the deprecated MPI C++
  # bindings are not wanted.
  set(MPI_CXX_SKIP_MPICXX ON)
  find_package(MPI COMPONENTS CXX QUIET)
  if(MPI_CXX_FOUND)
    set(NUMATTN_HAS_MPI ON)
    message(STATUS "numattn: MPI found (${MPI_CXX_LIBRARIES}); dist layer built with MPI")
  elseif(NUMATTN_MPI STREQUAL "ON")
    message(FATAL_ERROR "NUMATTN_MPI=ON but MPI was not found: run scripts/setup.sh "
                        "(apt-get install libopenmpi-dev openmpi-bin)")
  else()
    message(STATUS "numattn: MPI not found; dist methods run single-rank, MPI tests skipped")
  endif()
endif()
