# Tests of dtrain_comm. Torch-free communicator tests with ranks as threads sharing a HashStore:
# every *_test.cpp here and in shm/ but for comm_processes_test.cpp. Failure and timing tests are
# in *_failure_test.cpp and run serially (they measure deadlines). The NCCL backend's tests are in
# nccl/.
file(GLOB DTRAIN_COMM_TEST_SOURCES CONFIGURE_DEPENDS
  ${CMAKE_CURRENT_LIST_DIR}/*_test.cpp ${CMAKE_CURRENT_LIST_DIR}/shm/*_test.cpp)
list(FILTER DTRAIN_COMM_TEST_SOURCES EXCLUDE REGEX "/comm_processes_test\\.cpp$")
set(DTRAIN_COMM_FAILURE_TEST_SOURCES ${DTRAIN_COMM_TEST_SOURCES})
list(FILTER DTRAIN_COMM_TEST_SOURCES EXCLUDE REGEX "_failure_test\\.cpp$")
list(FILTER DTRAIN_COMM_FAILURE_TEST_SOURCES INCLUDE REGEX "_failure_test\\.cpp$")
if(NOT DTRAIN_HAVE_GLOO)
  # Without Gloo only the backend-independent parts can be tested here.
  list(FILTER DTRAIN_COMM_TEST_SOURCES EXCLUDE REGEX "/gloo_[^/]*\\.cpp$")
  set(DTRAIN_COMM_FAILURE_TEST_SOURCES "")
endif()

add_library(dtrain_comm_support STATIC ${CMAKE_CURRENT_LIST_DIR}/comm_support.cpp)
# Tests also reach dtrain_comm's internal headers (kernels, recorder, queue): the shared library
# exports every symbol.
target_include_directories(dtrain_comm_support PUBLIC
  ${CMAKE_CURRENT_LIST_DIR} ${CMAKE_SOURCE_DIR}/runtime/comm
  ${CMAKE_SOURCE_DIR}/runtime/comm/shm ${CMAKE_SOURCE_DIR}/runtime/base)
target_link_libraries(dtrain_comm_support
  PUBLIC dtrain_thread_comm_support dtrain_comm GTest::gtest)
dtrain_warnings(dtrain_comm_support)
if(TARGET dtrain_gloo)
  add_dependencies(dtrain_comm_support dtrain_gloo)  # loaded at run time by dtrain_comm
endif()

dtrain_gtest(dtrain_comm_tests LABEL unit TIMEOUT 120
  SERIAL_TESTS "ShmPlacement.*"
  SOURCES ${DTRAIN_COMM_TEST_SOURCES}
  LIBS dtrain_comm_support)
if(DTRAIN_COMM_FAILURE_TEST_SOURCES)
  # Timing-bound (the bounds of docs/reliability.md P1, P2): serial, labelled integration.
  dtrain_gtest(dtrain_comm_failure_tests LABEL integration SERIAL TIMEOUT 60
    SOURCES ${DTRAIN_COMM_FAILURE_TEST_SOURCES}
    LIBS dtrain_comm_support)
endif()

# The communicator across real processes (label integration): comm_worker is the torch-free
# program that `launch` (or the test itself, srun/mpirun-style) starts; dtrain_comm_process_tests
# drives it. Timing-bound (docs/reliability.md P1, P2): serial.
add_executable(comm_worker ${CMAKE_CURRENT_LIST_DIR}/comm_worker.cpp)
target_link_libraries(comm_worker PRIVATE dtrain_comm dtrain_base_internal)  # fault.h: injectAt()
dtrain_warnings(comm_worker)
if(DTRAIN_HAVE_GLOO)
  dtrain_gtest(dtrain_comm_process_tests LABEL integration SERIAL TIMEOUT 120
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/comm_processes_test.cpp
    LIBS dtrain_launcher_support dtrain_base)
  add_dependencies(dtrain_comm_process_tests comm_worker launch)
endif()

include(${CMAKE_CURRENT_LIST_DIR}/nccl/nccl.cmake)
