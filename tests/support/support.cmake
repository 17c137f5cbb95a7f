# Helpers shared by the tests of several areas (each file <topic>_support.{h,cpp}), one library
# per dependency they bring:
#   dtrain_test_support         paths of built binaries and of DTRAIN_PYTHON, temporary
#                               directories, process checks, a hostile HTTP client
#   dtrain_thread_comm_support  ranks as threads: runRanks, real Gloo worlds (makeGlooWorld) and
#                               the thread-backed fake communicator (ThreadWorld)
#   dtrain_launcher_support     `launch` and the test worker as real processes
#   dtrain_cluster_support      a simulated cluster of network namespaces for multi-node jobs
add_library(dtrain_test_support STATIC ${CMAKE_CURRENT_LIST_DIR}/test_support.cpp
  ${CMAKE_CURRENT_LIST_DIR}/hostile_http_support.cpp)
target_include_directories(dtrain_test_support PUBLIC ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(dtrain_test_support PUBLIC dtrain_base dtrain_testing GTest::gtest)
target_compile_definitions(dtrain_test_support PRIVATE
  DTRAIN_TEST_BINARY_DIR="${CMAKE_BINARY_DIR}" DTRAIN_TEST_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
  DTRAIN_TEST_PYTHON="${DTRAIN_PYTHON}")
dtrain_warnings(dtrain_test_support)

# Torch-free, so that the communicator tests and the torch tests share one fake. It reaches
# dtrain_comm's internal half.h for the float16 / bfloat16 reductions and collective_faults.h,
# and dtrain_base's fault.h, for the faults a test injects.
add_library(dtrain_thread_comm_support STATIC
  ${CMAKE_CURRENT_LIST_DIR}/thread_communicator_support.cpp)
target_include_directories(dtrain_thread_comm_support PUBLIC ${CMAKE_CURRENT_LIST_DIR}
  PRIVATE ${CMAKE_SOURCE_DIR}/runtime/comm)
target_link_libraries(dtrain_thread_comm_support
  PUBLIC dtrain_comm dtrain_base_internal GTest::gtest PRIVATE fmt::fmt)
dtrain_warnings(dtrain_thread_comm_support)

add_library(dtrain_launcher_support STATIC ${CMAKE_CURRENT_LIST_DIR}/launcher_support.cpp)
target_link_libraries(dtrain_launcher_support PUBLIC dtrain_test_support GTest::gtest)
target_compile_definitions(dtrain_launcher_support PRIVATE
  DTRAIN_TEST_BINARY_DIR="${CMAKE_BINARY_DIR}" DTRAIN_TEST_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
dtrain_warnings(dtrain_launcher_support)

# scripts/netns-cluster.sh driven from a test (cluster_support.h), and the timings and fan-out
# options the multi-node tests share (multinode_support.h). Without root or network namespaces
# every test that brings up a cluster reports SKIP with the reason.
add_library(dtrain_cluster_support STATIC ${CMAKE_CURRENT_LIST_DIR}/cluster_support.cpp
  ${CMAKE_CURRENT_LIST_DIR}/multinode_support.cpp)
target_link_libraries(dtrain_cluster_support PUBLIC dtrain_launcher_support)
dtrain_warnings(dtrain_cluster_support)
