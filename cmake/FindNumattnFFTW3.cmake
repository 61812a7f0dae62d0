# FindNumattnFFTW3: FFTW3 in double precision (the TensorSketch's circular convolutions,
# decomp/sketch.h), as the imported target NumattnFFTW3::FFTW3. Debian's libfftw3-dev ships no
# usable CMake config, hence this module; it is installed with numattn's package config.
find_path(NumattnFFTW3_INCLUDE_DIR fftw3.h)
find_library(NumattnFFTW3_LIBRARY NAMES fftw3)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NumattnFFTW3
  REQUIRED_VARS NumattnFFTW3_LIBRARY NumattnFFTW3_INCLUDE_DIR
  REASON_FAILURE_MESSAGE "run scripts/setup.sh (apt-get install libfftw3-dev)")
if(NumattnFFTW3_FOUND AND NOT TARGET NumattnFFTW3::FFTW3)
  add_library(NumattnFFTW3::FFTW3 UNKNOWN IMPORTED)
  set_target_properties(NumattnFFTW3::FFTW3 PROPERTIES
    IMPORTED_LOCATION "${NumattnFFTW3_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NumattnFFTW3_INCLUDE_DIR}")
endif()
mark_as_advanced(NumattnFFTW3_INCLUDE_DIR NumattnFFTW3_LIBRARY)
