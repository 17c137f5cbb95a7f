# The communicator across real processes (label integration): comm_worker is the torch-free
# program that `launch` (or the test itself, srun/mpirun-style) starts; dtrain_comm_process_tests
# drives it. Timing-bound (docs/reliability.md P1, P2): serial.
add_executable(comm_worker tests/integration/comm_worker.cpp)
target_link_libraries(comm_worker PRIVATE dtrain_comm)
dtrain_warnings(comm_worker)

if(DTRAIN_HAVE_GLOO AND TARGET dtrain_launcher_harness)
  dtrain_gtest(dtrain_comm_process_tests LABEL integration SERIAL TIMEOUT 120
    SOURCES tests/integration/comm_processes_test.cpp
    LIBS dtrain_launcher_harness dtrain_base)
  add_dependencies(dtrain_comm_process_tests comm_worker launch)
endif()
