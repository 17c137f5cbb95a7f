# Torch-free communicator tests (ranks as threads sharing a HashStore): every tests/comm/*_test.cpp.
# Failure and timing tests are in *_failure_test.cpp and run serially (they measure deadlines).
file(GLOB DTRAIN_COMM_TEST_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/tests/comm/*_test.cpp)
list(FILTER DTRAIN_COMM_TEST_SOURCES EXCLUDE REGEX "_failure_test\\.cpp$")
file(GLOB DTRAIN_COMM_FAILURE_TEST_SOURCES CONFIGURE_DEPENDS
  ${CMAKE_CURRENT_SOURCE_DIR}/tests/comm/*_failure_test.cpp)
if(NOT DTRAIN_HAVE_GLOO)
  # Without Gloo only the backend-independent parts can be tested here.
  list(FILTER DTRAIN_COMM_TEST_SOURCES EXCLUDE REGEX "/gloo_[^/]*\\.cpp$")
  set(DTRAIN_COMM_FAILURE_TEST_SOURCES "")
endif()

add_library(dtrain_comm_test_support STATIC tests/comm/comm_test_support.cpp)
# Tests also reach dtrain_comm's internal headers (kernels, recorder, queue): the shared library
# exports every symbol.
target_include_directories(dtrain_comm_test_support PUBLIC
  ${CMAKE_CURRENT_SOURCE_DIR}/tests/comm ${CMAKE_CURRENT_SOURCE_DIR}/runtime/comm
  ${CMAKE_CURRENT_SOURCE_DIR}/runtime/comm/shm ${CMAKE_CURRENT_SOURCE_DIR}/runtime/base)
target_link_libraries(dtrain_comm_test_support PUBLIC dtrain_comm GTest::gtest)
dtrain_warnings(dtrain_comm_test_support)
if(TARGET dtrain_gloo)
  add_dependencies(dtrain_comm_test_support dtrain_gloo)  # loaded at run time by dtrain_comm
endif()

dtrain_gtest(dtrain_comm_tests LABEL unit TIMEOUT 120
  SERIAL_TESTS "ShmPlacement.*"
  SOURCES ${DTRAIN_COMM_TEST_SOURCES}
  LIBS dtrain_comm_test_support)
if(DTRAIN_COMM_FAILURE_TEST_SOURCES)
  # Timing-bound (the bounds of docs/reliability.md P1, P2): serial, labelled integration.
  dtrain_gtest(dtrain_comm_failure_tests LABEL integration SERIAL TIMEOUT 60
    SOURCES ${DTRAIN_COMM_FAILURE_TEST_SOURCES}
    LIBS dtrain_comm_test_support)
endif()
