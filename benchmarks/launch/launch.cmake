# launch_bench: start-to-exit wall time of `launch` beside torchrun (see launch_bench.cpp).
# Its libtorch worker builds only with libtorch; the smoke run (CTest bench_smoke.launch_bench,
# label integration) needs neither libtorch nor torchrun.
include(${CMAKE_CURRENT_SOURCE_DIR}/testing/worker/worker.cmake)

set(_launch_bench_torch_worker "")
if(DTRAIN_HAVE_TORCH)
  add_executable(launch_torch_worker ${CMAKE_CURRENT_LIST_DIR}/torch_worker.cpp)
  target_link_libraries(launch_torch_worker PRIVATE dtrain_base torch)
  set_target_properties(launch_torch_worker PROPERTIES
    RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/benchmarks/launch)
  dtrain_warnings(launch_torch_worker)
  set(_launch_bench_torch_worker $<TARGET_FILE:launch_torch_worker>)
endif()

# The Python peers' interpreter, DTRAIN_PYTHON (cmake/python.cmake), and the torchrun beside it
# (its torch's), which the benchmarks start as `python torchrun`.
get_filename_component(_launch_bench_python_dir "${DTRAIN_PYTHON}" DIRECTORY)
set(_launch_bench_python DTRAIN_PYTHON="${DTRAIN_PYTHON}"
                         DTRAIN_TORCHRUN="${_launch_bench_python_dir}/torchrun")

# What the launch benchmarks share: their plumbing (bench_run.*, with the benchmarks' statistics
# and testing/'s free_port.h), and what they drive: launch and the test worker.
add_library(dtrain_launch_bench_run STATIC ${CMAKE_CURRENT_LIST_DIR}/bench_run.cpp)
target_include_directories(dtrain_launch_bench_run PUBLIC ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(dtrain_launch_bench_run PUBLIC dtrain_bench_stats dtrain_testing fmt::fmt)
dtrain_warnings(dtrain_launch_bench_run)
# crash_latency_bench: a worker's crash -> SIGTERM at the others, launch beside torchrun.
foreach(bench launch_bench crash_latency_bench)
  add_executable(${bench} ${CMAKE_CURRENT_LIST_DIR}/${bench}.cpp)
  target_link_libraries(${bench} PRIVATE dtrain_launch_bench_run)
  target_compile_definitions(${bench} PRIVATE
    DTRAIN_BENCH_LAUNCH="$<TARGET_FILE:launch>"
    DTRAIN_BENCH_WORKER="$<TARGET_FILE:dtrain_test_worker>"
    ${_launch_bench_python})
  set_target_properties(${bench} PROPERTIES
    RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/benchmarks/launch)
  add_dependencies(${bench} launch dtrain_test_worker)
  dtrain_warnings(${bench})
endforeach()

# launch_bench --multinode hosts the store its workers' barrier runs on (dtrain_base).
target_sources(launch_bench PRIVATE ${CMAKE_CURRENT_LIST_DIR}/multinode_bench.cpp)
target_link_libraries(launch_bench PRIVATE dtrain_base)
target_compile_definitions(launch_bench PRIVATE
  DTRAIN_BENCH_TORCH_WORKER="${_launch_bench_torch_worker}"
  DTRAIN_BENCH_SCRIPT="${CMAKE_CURRENT_LIST_DIR}/bench_worker.py"
  DTRAIN_BENCH_CLUSTER_SCRIPT="${CMAKE_SOURCE_DIR}/scripts/netns-cluster.sh")
if(DTRAIN_HAVE_TORCH)
  add_dependencies(launch_bench launch_torch_worker)
endif()

# launch_scale_bench: N simulated nodes (testing/launcher_sim/launcher_sim.h) beside torchrun.
include(${CMAKE_SOURCE_DIR}/testing/launcher_sim/launcher_sim.cmake)
add_executable(launch_scale_bench ${CMAKE_CURRENT_LIST_DIR}/scale_bench.cpp
                                  ${CMAKE_CURRENT_LIST_DIR}/scale_runs.cpp)
target_link_libraries(launch_scale_bench PRIVATE dtrain_launch_bench_run dtrain_launch_sim)
target_compile_definitions(launch_scale_bench PRIVATE
  DTRAIN_BENCH_LAUNCH="$<TARGET_FILE:launch>"
  DTRAIN_BENCH_WORKER="$<TARGET_FILE:dtrain_test_worker>"
  ${_launch_bench_python})
set_target_properties(launch_scale_bench PROPERTIES
  RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/benchmarks/launch)
add_dependencies(launch_scale_bench launch dtrain_test_worker)
dtrain_warnings(launch_scale_bench)

if(DTRAIN_WITH_TESTS)
  add_test(NAME bench_smoke.launch_scale_bench COMMAND launch_scale_bench --smoke)
  set_tests_properties(bench_smoke.launch_scale_bench PROPERTIES LABELS integration TIMEOUT 120
                       RUN_SERIAL TRUE)
  add_test(NAME bench_smoke.launch_bench COMMAND launch_bench --smoke)
  set_tests_properties(bench_smoke.launch_bench PROPERTIES LABELS integration TIMEOUT 60)
  add_test(NAME bench_smoke.crash_latency_bench COMMAND crash_latency_bench --smoke)
  set_tests_properties(bench_smoke.crash_latency_bench PROPERTIES LABELS integration TIMEOUT 60)
endif()
