# DDP across real processes (label integration): ddp_worker is the training program that `launch`
# starts; dtrain_ddp_process_tests drives it. Needs Gloo.
if(DTRAIN_HAVE_GLOO AND TARGET dtrain_launcher_harness)
  add_executable(ddp_worker tests/integration/ddp_worker.cpp)
  target_link_libraries(ddp_worker PRIVATE dtrain)
  dtrain_reuse_torch_pch(ddp_worker)
  dtrain_warnings(ddp_worker)

  dtrain_gtest(dtrain_ddp_process_tests LABEL integration TIMEOUT 240
    SOURCES tests/integration/ddp_processes_test.cpp
    LIBS dtrain_launcher_harness)
  add_dependencies(dtrain_ddp_process_tests ddp_worker launch)
endif()
