# `cmake --install` rules and the CMake package: headers, libnumattn, the CLI, and
# numattnConfig.cmake with the exported target numattn::numattn, whose dependencies the config
# finds again on the user's machine (find_dependency), never by paths baked in at build time
# where a package gives a target. Used as:
#   find_package(numattn CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE numattn::numattn)
# tests/install/ checks it by building a small outside project against an installed tree.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(NUMATTN_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/numattn)

# numattn_deps carries the third-party targets and definitions (NUMATTN_HAS_BLAS, ...); it is
# exported with the library as numattn::deps.
set_target_properties(numattn_deps PROPERTIES EXPORT_NAME deps)
# Eigen's alignment is fixed by numattn_deps (EIGEN_MAX_ALIGN_BYTES), so code built against the
# package may use any -march; a NUMATTN_NATIVE library runs only on CPUs like the build machine.
install(TARGETS numattn numattn_deps EXPORT numattnTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/numattn DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET numattn_cli)
  install(TARGETS numattn_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  # `numattn report` looks for its plotting script in <bin>/../share/numattn.
  install(PROGRAMS ${PROJECT_SOURCE_DIR}/scripts/report_plots.py DESTINATION ${CMAKE_INSTALL_DATADIR}/numattn)
endif()
install(EXPORT numattnTargets NAMESPACE numattn:: DESTINATION ${NUMATTN_INSTALL_CMAKEDIR})

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/numattnConfig.cmake.in
  ${PROJECT_BINARY_DIR}/numattnConfig.cmake INSTALL_DESTINATION ${NUMATTN_INSTALL_CMAKEDIR})
# 0.x: a minor version may break the API, so only the same major.minor is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/numattnConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/numattnConfig.cmake
              ${PROJECT_BINARY_DIR}/numattnConfigVersion.cmake
              ${CMAKE_CURRENT_LIST_DIR}/FindNumattnOpenBLAS.cmake
              ${CMAKE_CURRENT_LIST_DIR}/FindNumattnFFTW3.cmake
        DESTINATION ${NUMATTN_INSTALL_CMAKEDIR})
