# ft_bench: what a lost node costs a DDP job under `launch --on-node-loss continue`, beside today's
# restart path in the same run, and with --zero a ZeRO job whose sharded state is mirrored on
# another node (benchmarks/README.md). One program: the driver (root: it brings
# up a simulated cluster, scripts/netns-cluster.sh) and, with --worker, the job's worker. Built in
# CI, never run there: no smoke test, since it needs root, network namespaces and sshd.
if(DTRAIN_HAVE_GLOO)
  add_executable(ft_bench benchmarks/ft/ft_bench.cpp benchmarks/ft/ft_job.cpp
                          benchmarks/ft/ft_measure.cpp benchmarks/ft/ft_worker.cpp
                          benchmarks/ft/ft_zero.cpp benchmarks/ft/ft_join.cpp)
  target_link_libraries(ft_bench PRIVATE dtrain dtrain_launch_bench_run dtrain_testing fmt::fmt)
  target_compile_definitions(ft_bench PRIVATE
    DTRAIN_FT_LAUNCH="$<TARGET_FILE:launch>"
    DTRAIN_FT_SELF="$<TARGET_FILE:ft_bench>"
    DTRAIN_FT_CLUSTER_SCRIPT="${CMAKE_SOURCE_DIR}/scripts/netns-cluster.sh")
  set_target_properties(ft_bench PROPERTIES
    RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/benchmarks/ft)
  add_dependencies(ft_bench launch)
  dtrain_reuse_torch_pch(ft_bench)
  dtrain_warnings(ft_bench)
endif()
