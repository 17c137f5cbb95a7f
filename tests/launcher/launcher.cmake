# Tests of `launch`: the one-node job here, multi-node jobs in cluster/, watching a job in
# monitor/.
#   dtrain_unit_tests           the launcher's pure functions (every *_test.cpp named
#                               launcher_*_test.cpp but for the real-process ones below)
#   launcher_cli_tests          usage errors, dry run, environment, options -- quick, parallel
#   launcher_supervision_tests  crash detection, teardown, signals, restarts, floods, orphans,
#                               PyTorch compatibility -- timing-bound, RUN_SERIAL
#   launcher_multinode_tests    manual multi-node jobs on loopback -- RUN_SERIAL
#   launcher_scale_tests        64 simulated nodes -- RUN_SERIAL
#   launcher_monitor_tests      the metrics endpoint and file, stall reports, the memory warning in
#                               a small cgroup, the status line, launch's own CPU cost -- RUN_SERIAL
#   multinode_e2e_tests, multinode_fault_e2e_tests, monitor_e2e_tests
#                               real ssh into network namespaces on this machine
#                               (scripts/netns-cluster.sh); the fault and monitor ones serial
#   dtrain_gpu_monitor_tests    launch's GPU sampling on a real GPU (skipped without a driver)
include(${CMAKE_SOURCE_DIR}/testing/worker/worker.cmake)
include(${CMAKE_SOURCE_DIR}/testing/launcher_sim/launcher_sim.cmake)
set(_dir ${CMAKE_CURRENT_LIST_DIR})

target_sources(dtrain_unit_tests PRIVATE
  ${_dir}/launcher_args_test.cpp ${_dir}/launcher_config_test.cpp ${_dir}/launcher_output_test.cpp
  ${_dir}/launcher_process_info_test.cpp ${_dir}/launcher_report_test.cpp
  ${_dir}/launcher_worker_env_test.cpp
  ${_dir}/cluster/launcher_hosts_test.cpp ${_dir}/cluster/launcher_multinode_config_test.cpp
  ${_dir}/cluster/launcher_remote_test.cpp ${_dir}/cluster/launcher_rendezvous_test.cpp
  ${_dir}/cluster/launcher_node_loss_test.cpp
  ${_dir}/monitor/launcher_monitor_analysis_test.cpp
  ${_dir}/monitor/launcher_monitor_cluster_test.cpp ${_dir}/monitor/launcher_monitor_node_test.cpp
  ${_dir}/monitor/launcher_monitor_options_test.cpp
  ${_dir}/monitor/launcher_monitor_sampling_test.cpp)
target_link_libraries(dtrain_unit_tests PRIVATE dtrain_launcher)

dtrain_gtest(launcher_cli_tests LABEL integration TIMEOUT 60
  SOURCES ${_dir}/launcher_cli_test.cpp
  LIBS dtrain_launcher_support)
dtrain_gtest(launcher_supervision_tests LABEL integration SERIAL TIMEOUT 90
  SOURCES ${_dir}/launcher_supervision_test.cpp
          ${_dir}/launcher_output_processes_test.cpp
          ${_dir}/launcher_compat_test.cpp
          ${_dir}/launcher_job_control_test.cpp
  LIBS dtrain_launcher_support)
add_dependencies(launcher_cli_tests launch dtrain_test_worker)
add_dependencies(launcher_supervision_tests launch dtrain_test_worker)

# Manual multi-node jobs on loopback: claims, rejoins, elastic growth and its exact resume.
dtrain_gtest(launcher_multinode_tests LABEL integration SERIAL TIMEOUT 240
  SOURCES ${_dir}/cluster/launcher_multinode_test.cpp
  LIBS dtrain_launcher_support)
add_dependencies(launcher_multinode_tests launch dtrain_test_worker)
# 64 simulated nodes (launcher_sim.h) form, run, lose one and restart elastic at 63.
dtrain_gtest(launcher_scale_tests LABEL integration SERIAL TIMEOUT 300
  SOURCES ${_dir}/cluster/launcher_scale_test.cpp
  LIBS dtrain_launcher_support dtrain_launch_sim)
add_dependencies(launcher_scale_tests launch dtrain_test_worker)
# launcher_multinode_tests' trainer for the exact resume of a grown job (libtorch and Gloo;
# without them that test skips).
if(DTRAIN_HAVE_GLOO AND TARGET dtrain)
  add_executable(elastic_worker ${_dir}/cluster/elastic_worker.cpp)
  target_link_libraries(elastic_worker PRIVATE dtrain)
  dtrain_reuse_torch_pch(elastic_worker)
  dtrain_warnings(elastic_worker)
  add_dependencies(launcher_multinode_tests elastic_worker)
endif()

# Multi-node launch end to end: each test brings up a cluster of its own under a unique name, so
# they run in parallel; the fault tests measure time bounds and run serially.
dtrain_gtest(multinode_e2e_tests LABEL e2e TIMEOUT 120
  SOURCES ${_dir}/cluster/multinode_test.cpp
  LIBS dtrain_cluster_support)
dtrain_gtest(multinode_fault_e2e_tests LABEL e2e SERIAL TIMEOUT 120
  SOURCES ${_dir}/cluster/multinode_fault_test.cpp
  LIBS dtrain_cluster_support)
# --on-node-loss continue: the survivors go on in the next membership epoch, or restart.
dtrain_gtest(multinode_node_loss_e2e_tests LABEL e2e SERIAL TIMEOUT 120
  SOURCES ${_dir}/cluster/multinode_node_loss_test.cpp
  LIBS dtrain_cluster_support)

# Watching a running job (launcher/monitor) with real processes under launch, on one node and on
# the simulated cluster. Timing-bound and CPU-measuring: serial.
if(TARGET comm_worker)
  dtrain_gtest(launcher_monitor_tests LABEL integration SERIAL TIMEOUT 180
    SOURCES ${_dir}/monitor/launcher_monitor_test.cpp
            ${_dir}/monitor/launcher_monitor_nodes_test.cpp
    LIBS dtrain_launcher_support dtrain_launcher dtrain_httplib nlohmann_json::nlohmann_json)
  add_dependencies(launcher_monitor_tests launch dtrain_test_worker comm_worker)
endif()
dtrain_gtest(monitor_e2e_tests LABEL e2e SERIAL TIMEOUT 150
  SOURCES ${_dir}/monitor/monitor_e2e_test.cpp
  LIBS dtrain_cluster_support dtrain_launcher dtrain_httplib nlohmann_json::nlohmann_json)
foreach(t multinode_e2e_tests multinode_fault_e2e_tests multinode_node_loss_e2e_tests
          monitor_e2e_tests)
  add_dependencies(${t} launch dtrain_test_worker)
  if(TARGET comm_worker)
    add_dependencies(${t} comm_worker)
  endif()
endforeach()
foreach(t multinode_e2e_tests multinode_fault_e2e_tests)
  if(TARGET train_linear)
    add_dependencies(${t} train_linear)
  endif()
endforeach()

# Torch- and CUDA-free, built everywhere; scripts/gpu_check.sh runs it, and launch sampling a GPU
# test.
dtrain_gtest(dtrain_gpu_monitor_tests LABEL gpu TIMEOUT 120
  SOURCES ${_dir}/monitor/monitor_gpu_test.cpp
  LIBS dtrain_launcher)
