# `cmake --install`: headers, libraries, `launch`, the `checkpoint` tool, the sample trainers, and
# the CMake package that lets a user's program do find_package(dtrain) and link dtrain::dtrain.
# Two components, which cmake/package.cmake makes the two Debian packages: `runtime` (what every
# node of a job runs) and `dev` (what building a program against dtrain needs).
include(CMakePackageConfigHelpers)

install(TARGETS ${DTRAIN_INSTALL_TARGETS} EXPORT dtrainTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
install(DIRECTORY runtime/include/dtrain DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev)
install(FILES "${DTRAIN_GENERATED_INCLUDE}/dtrain/config.h"
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/dtrain COMPONENT dev)

# The sample trainers, out of the PATH (their names are generic): <libexec>/dtrain/train_resnet.
set(DTRAIN_EXAMPLES_INSTALL_DIR ${CMAKE_INSTALL_LIBEXECDIR}/dtrain)
foreach(example train_linear train_resnet)
  if(TARGET ${example})
    file(RELATIVE_PATH _to_lib "/${DTRAIN_EXAMPLES_INSTALL_DIR}" "/${CMAKE_INSTALL_LIBDIR}")
    set_target_properties(${example} PROPERTIES INSTALL_RPATH "$ORIGIN/${_to_lib}")
    install(TARGETS ${example} RUNTIME DESTINATION ${DTRAIN_EXAMPLES_INSTALL_DIR} COMPONENT runtime)
  endif()
endforeach()

# Libraries from pip wheels (cmake/dependencies.cmake): their folders go into the RUNPATH of the
# installed binaries that load them, after the package's own library folder.
if(DTRAIN_WHEEL_LIBRARY_DIRS)
  foreach(_target dtrain_comm dtrain_gloo dtrain checkpoint train_linear train_resnet)
    if(TARGET ${_target})
      get_target_property(_rpath ${_target} INSTALL_RPATH)
      if(NOT _rpath)
        set(_rpath "${CMAKE_INSTALL_RPATH}")
      endif()
      list(APPEND _rpath ${DTRAIN_WHEEL_LIBRARY_DIRS})
      set_target_properties(${_target} PROPERTIES INSTALL_RPATH "${_rpath}")
    endif()
  endforeach()
endif()

# What watching a job needs beside launch (docs/monitoring.md): the Prometheus alert rules and the
# Grafana dashboard, in <datadir>/dtrain/.
install(FILES docs/prometheus/dtrain-alerts.yml
        DESTINATION ${CMAKE_INSTALL_DATADIR}/dtrain/prometheus COMPONENT runtime)
install(FILES docs/grafana/dtrain.json
        DESTINATION ${CMAKE_INSTALL_DATADIR}/dtrain/grafana COMPONENT runtime)

set(DTRAIN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/dtrain)
install(EXPORT dtrainTargets NAMESPACE dtrain:: DESTINATION ${DTRAIN_CMAKE_DIR} COMPONENT dev)
configure_package_config_file(cmake/dtrainConfig.cmake.in
  "${CMAKE_CURRENT_BINARY_DIR}/dtrainConfig.cmake" INSTALL_DESTINATION ${DTRAIN_CMAKE_DIR})
write_basic_package_version_file("${CMAKE_CURRENT_BINARY_DIR}/dtrainConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion)
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/dtrainConfig.cmake"
              "${CMAKE_CURRENT_BINARY_DIR}/dtrainConfigVersion.cmake"
        DESTINATION ${DTRAIN_CMAKE_DIR} COMPONENT dev)
