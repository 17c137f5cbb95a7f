# Tests. Few executables (each links once; torch ones are expensive to compile), labelled
# unit (one process, no sockets beyond loopback), integration (real processes of one component),
# e2e (a sample program trained under launch) | gpu. Each area owns one include below.
find_package(GTest REQUIRED)
include(GoogleTest)

# dtrain_gtest(<name> LABEL <label> SOURCES ... [LIBS ...] [SERIAL] [LOCK <resource>]
#              [TIMEOUT <s>] [TORCH] [BY_SUITE])
# One gtest executable; every TEST becomes a CTest test carrying the label (and RUN_SERIAL /
# RESOURCE_LOCK for timing-bound and namespace tests). TORCH reuses the torch layer's PCH.
# SERIAL_TESTS: a gtest filter ("Suite.*:Other.*") of timing-bound tests in an otherwise parallel
# binary; they are registered apart, RUN_SERIAL.
# BY_SUITE: every gtest suite becomes one CTest test (<name>.<Suite>, `--gtest_filter=Suite.*`),
# for binaries that take longer to start than most of their tests take to run (a libtorch
# process: ~0.5 s before main(), registering its operators). The TIMEOUT is then the suite's;
# SERIAL_TESTS names whole suites, and INTEGRATION_SUITES ("Suite.*:Other.*") the suites of a
# unit binary that belong to the integration label: timeouts waited out, large models built. One
# test alone: `<name> --gtest_filter=Suite.Test`.
function(dtrain_gtest name)
  cmake_parse_arguments(A "SERIAL;TORCH;BY_SUITE" "LABEL;LOCK;TIMEOUT;SERIAL_TESTS;INTEGRATION_SUITES"
                        "SOURCES;LIBS" ${ARGN})
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 120)
  endif()
  add_executable(${name} ${A_SOURCES})
  if(A_LABEL STREQUAL "gpu")
    set_property(GLOBAL APPEND PROPERTY DTRAIN_GPU_TEST_TARGETS ${name})
  endif()
  target_link_libraries(${name} PRIVATE ${A_LIBS} GTest::gtest GTest::gtest_main dtrain_test_support)
  target_compile_definitions(${name} PRIVATE
    DTRAIN_TEST_BINARY_DIR="${CMAKE_BINARY_DIR}" DTRAIN_TEST_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  if(A_TORCH)
    dtrain_reuse_torch_pch(${name})
  endif()
  dtrain_warnings(${name})
  set(props LABELS ${A_LABEL} TIMEOUT ${A_TIMEOUT})
  if(A_SERIAL)
    list(APPEND props RUN_SERIAL TRUE)
  endif()
  if(A_LOCK)
    list(APPEND props RESOURCE_LOCK ${A_LOCK})
  endif()
  if(A_BY_SUITE)
    set(script "${CMAKE_CURRENT_BINARY_DIR}/${name}_suites.cmake")
    file(GENERATE OUTPUT "${script}" CONTENT
"set(exe \"$<TARGET_FILE:${name}>\")
set(prefix \"${name}.\")
set(props \"${props}\")
set(serial \"${A_SERIAL_TESTS}\")
set(integration \"${A_INTEGRATION_SUITES}\")
include(\"${CMAKE_CURRENT_FUNCTION_LIST_DIR}/gtest_suites.cmake\")
")
    set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${script}")
  elseif(A_SERIAL_TESTS)
    gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST TEST_PREFIX "${name}."
                         TEST_FILTER "-${A_SERIAL_TESTS}" PROPERTIES ${props})
    gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST TEST_PREFIX "${name}."
                         TEST_FILTER "${A_SERIAL_TESTS}" PROPERTIES ${props} RUN_SERIAL TRUE)
  else()
    gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST TEST_PREFIX "${name}." PROPERTIES ${props})
  endif()
endfunction()

# The targets of the tests labelled gpu, one a line, for scripts/gpu_check.sh (it builds exactly
# these): written once every directory has added its tests.
function(dtrain_write_gpu_test_targets)
  get_property(targets GLOBAL PROPERTY DTRAIN_GPU_TEST_TARGETS)
  list(JOIN targets "\n" text)
  file(WRITE ${CMAKE_BINARY_DIR}/gpu_test_targets.txt "${text}\n")
endfunction()
cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL dtrain_write_gpu_test_targets)

# One include per area, laid out as the sources are; the kind of a test (unit, integration, e2e,
# gpu) is its label, not its folder. Worker programs a test starts live beside it. Order matters
# where an area tests with another's targets: support first, comm before launcher (comm_worker).
include(tests/support/support.cmake)
include(tests/base/base.cmake)
include(tests/comm/comm.cmake)
include(tests/launcher/launcher.cmake)
if(DTRAIN_HAVE_TORCH)
  include(tests/torch/torch.cmake)
  include(tests/examples/examples.cmake)
endif()
include(tests/scripts/scripts.cmake)
include(tests/scripts/tensorboard_grafana.cmake)
include(tests/scripts/package.cmake)
include(tests/prometheus/prometheus.cmake)
