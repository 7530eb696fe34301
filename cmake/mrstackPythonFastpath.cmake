# mrstack._fastpath (src/python/fastpath.c): the Python package's hot path as a CPython
# extension, built next to libmrstack_c.so so that MRSTACK_LIBRARY's folder, setup.py and
# a gpu-bundle of the build folder all carry both. Optional: without Python's headers the
# target is skipped and the package uses ctypes for everything.
#
# It is built for the limited API of Python 3.10 (abi3): one file loads on every CPython
# from 3.10 on, whichever Python's headers built it. CMake 3.25's FindPython has no
# USE_SABI (3.26), so the define, the suffix and the link rules are set here: an
# extension module links no libpython (the interpreter that loads it provides the
# symbols), hence no --no-undefined either.
set(MRSTACK_FASTPATH_LIMITED_API 0x030A0000)

find_package(Python3 COMPONENTS Interpreter Development.Module)
if(NOT Python3_Development.Module_FOUND)
  message(STATUS "mrstack: Python's headers not found (Debian: python3-dev); skipping mrstack._fastpath, "
                 "the Python package will use ctypes only")
  return()
endif()
if(Python3_VERSION VERSION_LESS 3.10)
  message(STATUS "mrstack: Python ${Python3_VERSION}'s headers predate the 3.10 limited API; skipping mrstack._fastpath")
  return()
endif()

enable_language(C)
add_library(mrstack_fastpath MODULE ${CMAKE_CURRENT_SOURCE_DIR}/src/python/fastpath.c)
target_include_directories(mrstack_fastpath PRIVATE ${Python3_INCLUDE_DIRS} ${CMAKE_CURRENT_SOURCE_DIR}/include)
target_compile_definitions(mrstack_fastpath PRIVATE Py_LIMITED_API=${MRSTACK_FASTPATH_LIMITED_API})
set_target_properties(mrstack_fastpath PROPERTIES
  OUTPUT_NAME _fastpath PREFIX "" SUFFIX ".abi3.so"
  LIBRARY_OUTPUT_DIRECTORY $<TARGET_FILE_DIR:mrstack_c>
  C_STANDARD 11 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF
  C_VISIBILITY_PRESET hidden)   # PyInit__fastpath is exported by PyMODINIT_FUNC itself
mrstack_set_warnings(mrstack_fastpath)
message(STATUS "mrstack: building mrstack._fastpath (abi3, Python >= 3.10) with Python ${Python3_VERSION}'s headers")
