# FindNumattnOpenBLAS: OpenBLAS itself (not the generic libblas alternative), as the imported
# target NumattnOpenBLAS::OpenBLAS. Used by numattn's own build (cmake/NumattnDeps.cmake) and
# shipped with the installed package, so that find_package(numattn) finds the same library.
#
# Debian ships several BLAS behind alternatives; numattn wants OpenBLAS itself (pthread build)
# so that openblas_set_num_threads() exists and GEMM speed is OpenBLAS's. Its cblas.h lives in
# an implementation-specific directory, hence the explicit hints.
find_path(NumattnOpenBLAS_INCLUDE_DIR cblas.h
  PATHS /usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/openblas
        /usr/include/aarch64-linux-gnu/openblas-pthread
  NO_DEFAULT_PATH)
find_library(NumattnOpenBLAS_LIBRARY NAMES openblas)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NumattnOpenBLAS
  REQUIRED_VARS NumattnOpenBLAS_LIBRARY NumattnOpenBLAS_INCLUDE_DIR
  REASON_FAILURE_MESSAGE "run scripts/setup.sh (apt-get install libopenblas-dev)")
if(NumattnOpenBLAS_FOUND AND NOT TARGET NumattnOpenBLAS::OpenBLAS)
  add_library(NumattnOpenBLAS::OpenBLAS UNKNOWN IMPORTED)
  set_target_properties(NumattnOpenBLAS::OpenBLAS PROPERTIES
    IMPORTED_LOCATION "${NumattnOpenBLAS_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NumattnOpenBLAS_INCLUDE_DIR}")
endif()
mark_as_advanced(NumattnOpenBLAS_INCLUDE_DIR NumattnOpenBLAS_LIBRARY)
