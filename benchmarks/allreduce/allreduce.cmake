# allreduce_bench: dtrain's allreduce beside torch.distributed (gloo) and memcpy; see
# benchmarks/README.md. Torch-free: the peer is Python (python3-torch), driven over FIFOs.
add_executable(allreduce_bench
  benchmarks/allreduce/allreduce_bench.cpp
  benchmarks/allreduce/bench_buffers.cpp
  benchmarks/allreduce/torch_peer.cpp)
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
