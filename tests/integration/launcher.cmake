# Integration tests of `launch` (label integration): real processes, the test worker.
#   launcher_cli_tests     usage errors, dry run, environment, options -- quick, run in parallel
#   launcher_supervision_tests  crash detection, teardown, signals, restarts, floods, orphans,
#                               PyTorch compatibility -- timing-bound, RUN_SERIAL
#   launcher_multinode_tests    manual multi-node jobs on loopback -- RUN_SERIAL
#   launcher_scale_tests        64 simulated nodes -- RUN_SERIAL
include(${CMAKE_CURRENT_LIST_DIR}/../worker/worker.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/launcher_sim.cmake)

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
# Manual multi-node jobs on loopback: claims, rejoins, elastic growth and its exact resume.
dtrain_gtest(launcher_multinode_tests LABEL integration SERIAL TIMEOUT 240
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/launcher_multinode_test.cpp
  LIBS dtrain_launcher_harness)
add_dependencies(launcher_multinode_tests launch dtrain_test_worker)
# 64 simulated nodes (launcher_sim.h) form, run, lose one and restart elastic at 63.
dtrain_gtest(launcher_scale_tests LABEL integration SERIAL TIMEOUT 300
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/launcher_scale_test.cpp
  LIBS dtrain_launcher_harness dtrain_launch_sim)
add_dependencies(launcher_scale_tests launch dtrain_test_worker)
# launcher_multinode_tests' trainer for the exact resume of a grown job (libtorch and Gloo;
# without them that test skips).
if(DTRAIN_HAVE_GLOO AND TARGET dtrain)
  add_executable(elastic_worker ${CMAKE_CURRENT_LIST_DIR}/elastic_worker.cpp)
  target_link_libraries(elastic_worker PRIVATE dtrain)
  dtrain_reuse_torch_pch(elastic_worker)
  dtrain_warnings(elastic_worker)
  add_dependencies(launcher_multinode_tests elastic_worker)
endif()
add_dependencies(launcher_cli_tests launch dtrain_test_worker)
add_dependencies(launcher_supervision_tests launch dtrain_test_worker)
