# The test worker (testing/worker/worker.cpp documents its flags): a torch-free program that joins
# the job's store, passes barriers and obeys DTRAIN_FAULT. Integration tests of every area run it
# through `launch` as real processes; its path is stable: <build>/testing/worker/worker.
include_guard(GLOBAL)
add_executable(dtrain_test_worker ${CMAKE_CURRENT_LIST_DIR}/worker.cpp)
target_link_libraries(dtrain_test_worker PRIVATE dtrain_base dtrain_base_internal)
set_target_properties(dtrain_test_worker PROPERTIES
  OUTPUT_NAME worker
  RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/testing/worker)
dtrain_warnings(dtrain_test_worker)
