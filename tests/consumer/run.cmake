# Installs the build into WORK_DIR/prefix, then builds and runs the consumer project
# against it: its own main.cpp, and the README's C++ snippet (the first ```cpp block of
# README), which must run on a machine without a GPU. Any failing step fails the test.
file(REMOVE_RECURSE ${WORK_DIR})
file(READ ${README} readme)
string(FIND "${readme}" "```cpp\n" start)
if(start EQUAL -1)
  message(FATAL_ERROR "README ${README} has no ```cpp block to build")
endif()
math(EXPR start "${start} + 7")
string(SUBSTRING "${readme}" ${start} -1 rest)
string(FIND "${rest}" "```" stop)
string(SUBSTRING "${rest}" 0 ${stop} snippet)
file(WRITE ${WORK_DIR}/readme_snippet.cpp "${snippet}")
function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()
step(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
step(${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/build -G ${GENERATOR}
     -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release
     -DREADME_SNIPPET=${WORK_DIR}/readme_snippet.cpp)
step(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
step(${WORK_DIR}/build/consumer)
step(${WORK_DIR}/build/readme_snippet)
