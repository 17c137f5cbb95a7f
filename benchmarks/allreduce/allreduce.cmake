# allreduce_bench: dtrain's allreduce beside PyTorch's, C++ c10d::ProcessGroupGloo (when this build
# has libtorch) and torch.distributed from Python (python3-torch, driven over FIFOs), and memcpy;
# see benchmarks/README.md.
add_executable(allreduce_bench
  benchmarks/allreduce/allreduce_bench.cpp
  benchmarks/allreduce/bench_buffers.cpp
  benchmarks/allreduce/torch_peer.cpp)
if(DTRAIN_HAVE_TORCH AND DTRAIN_HAVE_GLOO)
  # Only for the C++ peer: c10d::ProcessGroupGloo and c10d::TCPStore are exported by libtorch_cpu
  # (which links the same system libgloo as dtrain). Its header is compiled only with this macro.
  target_sources(allreduce_bench PRIVATE benchmarks/allreduce/c10d_peer.cpp)
  set_source_files_properties(benchmarks/allreduce/c10d_peer.cpp PROPERTIES
                              COMPILE_DEFINITIONS USE_C10D_GLOO)
  target_link_libraries(allreduce_bench PRIVATE torch)
else()
  target_sources(allreduce_bench PRIVATE benchmarks/allreduce/c10d_peer_unavailable.cpp)
endif()
target_include_directories(allreduce_bench PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/runtime/comm)
target_compile_definitions(allreduce_bench PRIVATE
  DTRAIN_BENCH_SOURCE_DIR="${CMAKE_CURRENT_SOURCE_DIR}/benchmarks/allreduce")
target_link_libraries(allreduce_bench PRIVATE dtrain_comm cxxopts::cxxopts)
if(DTRAIN_HAVE_NCCL)
  target_sources(allreduce_bench PRIVATE benchmarks/allreduce/bench_buffers_cuda.cpp)
  target_link_libraries(allreduce_bench PRIVATE CUDA::cudart)
endif()
dtrain_warnings(allreduce_bench)

if(DTRAIN_WITH_TESTS AND DTRAIN_HAVE_GLOO)
  # Started the way it is meant to be: by launch, one process per rank, rank 0's table only.
  add_test(NAME bench_smoke.allreduce_bench
           COMMAND $<TARGET_FILE:launch> --nproc-per-node 2 --local-ranks-filter 0
                   --log-line-prefix-template "" $<TARGET_FILE:allreduce_bench> --smoke)
  set_tests_properties(bench_smoke.allreduce_bench PROPERTIES LABELS integration TIMEOUT 60
                       RUN_SERIAL TRUE)
endif()
