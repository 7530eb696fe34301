# Helper functions shared by the library, tests, benchmarks and tools.

# Warnings: -Wall -Wextra -Wpedantic everywhere; errors when MRSTACK_WARNINGS_AS_ERRORS (CI).
function(mrstack_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic
    $<$<BOOL:${MRSTACK_WARNINGS_AS_ERRORS}>:-Werror>)
endfunction()

# Sanitizers chosen by MRSTACK_SANITIZE (a list: address;undefined or thread). The standard
# library's own checks come with them (_GLIBCXX_ASSERTIONS: bounds of operator[], ordered
# bounds of std::clamp, ...), which catch misuse that is undefined without a crash.
function(mrstack_set_sanitizers target)
  if(MRSTACK_SANITIZE)
    list(JOIN MRSTACK_SANITIZE "," _san)
    target_compile_options(${target} PRIVATE -fsanitize=${_san} -fno-omit-frame-pointer -fno-sanitize-recover=all
                                             -D_GLIBCXX_ASSERTIONS)
    target_link_options(${target} PUBLIC -fsanitize=${_san})
  endif()
endfunction()

# One executable per source file under a folder: tests, benchmarks and tools add
# themselves by existing, so parallel work never edits the same CMake list.
#   mrstack_add_programs(GLOB <pattern> PREFIX <name prefix> LIBS <libs...> OUT_VAR <var>
#                        [EXCLUDE <sources...>])
function(mrstack_add_programs)
  cmake_parse_arguments(ARG "" "GLOB;PREFIX;OUT_VAR" "LIBS;EXCLUDE" ${ARGN})
  file(GLOB _sources CONFIGURE_DEPENDS ${ARG_GLOB})
  if(ARG_EXCLUDE)
    list(REMOVE_ITEM _sources ${ARG_EXCLUDE})
  endif()
  set(_targets "")
  foreach(_src IN LISTS _sources)
    get_filename_component(_name ${_src} NAME_WE)
    set(_target ${ARG_PREFIX}${_name})
    add_executable(${_target} ${_src})
    target_link_libraries(${_target} PRIVATE ${ARG_LIBS})
    mrstack_set_warnings(${_target})
    mrstack_set_sanitizers(${_target})
    list(APPEND _targets ${_target})
  endforeach()
  if(ARG_OUT_VAR)
    set(${ARG_OUT_VAR} ${_targets} PARENT_SCOPE)
  endif()
endfunction()
