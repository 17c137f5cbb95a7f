# ZeRO across real processes (label integration): zero_worker is the training program that
# `launch` starts; dtrain_zero_process_tests drives it over shared memory and over Gloo.
if(DTRAIN_HAVE_GLOO AND TARGET dtrain_launcher_harness)
  add_executable(zero_worker tests/integration/zero_worker.cpp)
  target_link_libraries(zero_worker PRIVATE dtrain)
  dtrain_reuse_torch_pch(zero_worker)
  dtrain_warnings(zero_worker)

  dtrain_gtest(dtrain_zero_process_tests LABEL integration TIMEOUT 300
    SERIAL_TESTS "Backends/ZeroSkippedUnit.*:ZeroMemoryLimit.*"
    SOURCES tests/integration/zero_processes_test.cpp
    LIBS dtrain_launcher_harness)
  add_dependencies(dtrain_zero_process_tests zero_worker launch)
  if(TARGET train_gpt)
    add_dependencies(dtrain_zero_process_tests train_gpt)
  endif()
endif()
