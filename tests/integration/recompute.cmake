# Activation recompute under DDP across real processes (label integration): recompute_worker is
# the training program that `launch` starts; dtrain_recompute_process_tests drives it. Needs Gloo.
if(DTRAIN_HAVE_GLOO AND TARGET dtrain_launcher_harness)
  add_executable(recompute_worker tests/integration/recompute_worker.cpp)
  target_link_libraries(recompute_worker PRIVATE dtrain)
  dtrain_reuse_torch_pch(recompute_worker)
  dtrain_warnings(recompute_worker)

  # recompute_rss_worker: resident memory of a recomputed step (docs/training.md, "Host memory
  # cache").
  add_executable(recompute_rss_worker tests/integration/recompute_rss_worker.cpp)
  target_link_libraries(recompute_rss_worker PRIVATE dtrain)
  dtrain_reuse_torch_pch(recompute_rss_worker)
  dtrain_warnings(recompute_rss_worker)

  dtrain_gtest(dtrain_recompute_process_tests LABEL integration TIMEOUT 180
    SOURCES tests/integration/recompute_processes_test.cpp
    LIBS dtrain_launcher_harness)
  add_dependencies(dtrain_recompute_process_tests recompute_worker recompute_rss_worker launch)
endif()
