# Builds main.cpp with the clang++ CLANG names, plainly and with -fsanitize=thread, runs
# each and checks what it says: plainly host allocations fail on request; under
# ThreadSanitizer, whose runtime clang links whole into the program with an operator new
# of its own, the header must not define a second one (the link failed) and says why.
# Without clang's ThreadSanitizer runtime it prints SKIPPED and the reason.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
file(WRITE ${WORK_DIR}/probe.cpp "int main() { return 0; }\n")
execute_process(COMMAND ${CLANG} -fsanitize=thread ${WORK_DIR}/probe.cpp -o ${WORK_DIR}/probe
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(STATUS "SKIPPED: ${CLANG} cannot link a ThreadSanitizer program here:\n${err}")
  return()
endif()
function(build_and_run name expected)
  execute_process(COMMAND ${CLANG} -std=c++20 ${ARGN} -I${SUPPORT_DIR} ${SOURCE} -o ${WORK_DIR}/${name}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${name}: the build failed (${rc}):\n${out}\n${err}")
  endif()
  execute_process(COMMAND ${WORK_DIR}/${name} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "${expected}")
    message(FATAL_ERROR "${name}: exit status ${rc}, expected output matching \"${expected}\":\n${out}\n${err}")
  endif()
  message(STATUS "${name}: ${out}")
endfunction()
build_and_run(plain "^host allocations can fail")
build_and_run(tsan "^host allocations cannot fail: clang's ThreadSanitizer" -fsanitize=thread)
