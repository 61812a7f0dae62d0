# Runs in script mode (cmake -P) from ctest: install, configure, build, run.
foreach(v NUMATTN_BUILD_DIR PROJECT_DIR WORK_DIR GENERATOR CXX)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run_install_test.cmake: -D${v}=... is required")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)

function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install test: ${what} failed (${rc})\n${out}\n${err}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

step("cmake --install" ${CMAKE_COMMAND} --install ${NUMATTN_BUILD_DIR} --prefix ${prefix})
foreach(f include/numattn/attention/registry.h lib/cmake/numattn/numattnConfig.cmake
          lib/cmake/numattn/numattnTargets.cmake lib/libnumattn.a)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "install test: ${prefix}/${f} was not installed")
  endif()
endforeach()
# Only the prefix: the outside project must not see numattn's source or build tree.
step("configure the outside project" ${CMAKE_COMMAND} -S ${PROJECT_DIR} -B ${WORK_DIR}/build
     -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=Release
     -DCMAKE_PREFIX_PATH=${prefix})
step("build the outside project" ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
step("run the outside program" ${WORK_DIR}/build/numattn_consumer)
message(STATUS "${step_output}")
