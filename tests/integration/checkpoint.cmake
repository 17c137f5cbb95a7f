# Checkpoints and resume across real processes (label integration): checkpoint_worker is the
# trainer that `launch` starts (or the test starts by hand as two simulated nodes);
# dtrain_checkpoint_process_tests drives it and the `checkpoint` tool. Needs Gloo.
if(DTRAIN_HAVE_GLOO AND TARGET dtrain_launcher_harness)
  add_executable(checkpoint_worker tests/integration/checkpoint_worker.cpp)
  target_link_libraries(checkpoint_worker PRIVATE dtrain)
  dtrain_reuse_torch_pch(checkpoint_worker)
  dtrain_warnings(checkpoint_worker)

  dtrain_gtest(dtrain_checkpoint_process_tests LABEL integration TIMEOUT 300
    SOURCES tests/integration/checkpoint_processes_test.cpp
    LIBS dtrain_launcher_harness)
  add_dependencies(dtrain_checkpoint_process_tests checkpoint_worker checkpoint launch)
endif()

# The same on a simulated cluster (label e2e; tests/e2e/e2e.cmake provides the cluster).
if(TARGET checkpoint_worker AND TARGET dtrain_e2e_cluster)
  dtrain_gtest(checkpoint_e2e_tests LABEL e2e TIMEOUT 240
    SOURCES tests/e2e/checkpoint_e2e_test.cpp tests/e2e/e2e_support.cpp
    LIBS dtrain_e2e_cluster dtrain_launcher_harness)
  add_dependencies(checkpoint_e2e_tests launch checkpoint_worker)
endif()
