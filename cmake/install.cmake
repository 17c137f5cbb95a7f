# `cmake --install`: headers, libraries, `launch`, and the CMake package that lets a user's
# program do find_package(dtrain) and link dtrain::dtrain.
include(CMakePackageConfigHelpers)

install(TARGETS ${DTRAIN_INSTALL_TARGETS} EXPORT dtrainTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY runtime/include/dtrain DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES "${DTRAIN_GENERATED_INCLUDE}/dtrain/config.h"
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/dtrain)

set(DTRAIN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/dtrain)
install(EXPORT dtrainTargets NAMESPACE dtrain:: DESTINATION ${DTRAIN_CMAKE_DIR})
configure_package_config_file(cmake/dtrainConfig.cmake.in
  "${CMAKE_CURRENT_BINARY_DIR}/dtrainConfig.cmake" INSTALL_DESTINATION ${DTRAIN_CMAKE_DIR})
write_basic_package_version_file("${CMAKE_CURRENT_BINARY_DIR}/dtrainConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion)
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/dtrainConfig.cmake"
              "${CMAKE_CURRENT_BINARY_DIR}/dtrainConfigVersion.cmake"
        DESTINATION ${DTRAIN_CMAKE_DIR})
