# Integration tests of `launch` (label integration): real processes, the test worker.
#   launcher_cli_tests     usage errors, dry run, environment, options -- quick, run in parallel
#   launcher_supervision_tests  crash detection, teardown, signals, restarts, floods, orphans,
#                               PyTorch compatibility -- timing-bound, RUN_SERIAL
include(${CMAKE_CURRENT_LIST_DIR}/../worker/worker.cmake)

add_library(dtrain_launcher_harness STATIC ${CMAKE_CURRENT_LIST_DIR}/launcher_harness.cpp)
target_include_directories(dtrain_launcher_harness PUBLIC ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(dtrain_launcher_harness PUBLIC dtrain_test_support GTest::gtest)
target_compile_definitions(dtrain_launcher_harness PRIVATE
  DTRAIN_TEST_BINARY_DIR="${CMAKE_BINARY_DIR}" DTRAIN_TEST_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
dtrain_warnings(dtrain_launcher_harness)

dtrain_gtest(launcher_cli_tests LABEL integration TIMEOUT 60
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/launcher_cli_test.cpp
  LIBS dtrain_launcher_harness)
dtrain_gtest(launcher_supervision_tests LABEL integration SERIAL TIMEOUT 90
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/launcher_supervision_test.cpp
          ${CMAKE_CURRENT_LIST_DIR}/launcher_output_test.cpp
          ${CMAKE_CURRENT_LIST_DIR}/launcher_compat_test.cpp
          ${CMAKE_CURRENT_LIST_DIR}/launcher_job_control_test.cpp
  LIBS dtrain_launcher_harness)
add_dependencies(launcher_cli_tests launch dtrain_test_worker)
add_dependencies(launcher_supervision_tests launch dtrain_test_worker)
