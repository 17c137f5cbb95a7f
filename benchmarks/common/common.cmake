# The harness every benchmark shares (benchmarks/README.md), so that no benchmark reaches into
# another's folder, nor into tests/: included by "common/<file>".
#   dtrain_bench_stats   the statistics of every table: median, percentile, spread, paired ratios
#                        (stats.h; the Python drivers' twin is stats.py), header-only
#   dtrain_bench_common  the process plumbing of the drivers that run their jobs in turns (Note
#                        [Turns]): ddp_step_bench, train_bench, zero_bench, recompute_bench.
#                        Torch-free.
add_library(dtrain_bench_stats INTERFACE)
target_include_directories(dtrain_bench_stats INTERFACE ${CMAKE_SOURCE_DIR}/benchmarks)

add_library(dtrain_bench_common STATIC ${CMAKE_CURRENT_LIST_DIR}/bench_process.cpp)
target_link_libraries(dtrain_bench_common PUBLIC dtrain_bench_stats dtrain_base
                                          PRIVATE dtrain_testing)  # free_port.h
dtrain_warnings(dtrain_bench_common)
