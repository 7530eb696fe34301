# `cmake --install` puts headers, libmrstack.a and a package config so that another
# project can `find_package(mrstack)` and link `mrstack::mrstack`.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/mrstack DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS mrstack EXPORT mrstackTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# OPTIONAL: an install after building only some targets (the README's first command
# builds mrstack-replay alone) still installs the headers, the static library and the
# package config instead of failing on the missing shared library (the tools' rule,
# tools/CMakeLists.txt, is OPTIONAL for the same reason).
if(TARGET mrstack_c)
  install(TARGETS mrstack_c LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} OPTIONAL)
endif()
install(EXPORT mrstackTargets NAMESPACE mrstack:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/mrstack)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/mrstackConfig.cmake.in
  ${PROJECT_BINARY_DIR}/mrstackConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/mrstack)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/mrstackConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/mrstackConfig.cmake ${PROJECT_BINARY_DIR}/mrstackConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/mrstack)
