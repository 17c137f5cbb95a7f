# allreduce_bench: dtrain's allreduce beside C++ c10d::ProcessGroupGloo (when this build has
# libtorch), torch.distributed (gloo), Open MPI, a bare shared-memory probe and memcpy; see
# benchmarks/README.md. The Python, MPI and probe peers are separate programs (torch_peer.py under
# torchrun, mpi_peer under mpirun, shm_probe), driven over FIFOs.
add_executable(allreduce_bench
  benchmarks/allreduce/allreduce_bench.cpp
  benchmarks/allreduce/allreduce_config.cpp
  benchmarks/allreduce/bench_buffers.cpp
  benchmarks/allreduce/peer_process.cpp)
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
# tests/support: free_port.h (header-only).
target_include_directories(allreduce_bench PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/runtime/comm
                                                   ${CMAKE_CURRENT_SOURCE_DIR}/tests/support)
target_compile_definitions(allreduce_bench PRIVATE
  DTRAIN_BENCH_SOURCE_DIR="${CMAKE_CURRENT_SOURCE_DIR}/benchmarks/allreduce")
target_link_libraries(allreduce_bench PRIVATE dtrain_comm dtrain_base_internal cxxopts::cxxopts)
if(DTRAIN_HAVE_NCCL)
  target_sources(allreduce_bench PRIVATE benchmarks/allreduce/bench_buffers_cuda.cpp)
  target_link_libraries(allreduce_bench PRIVATE CUDA::cudart)
endif()
dtrain_warnings(allreduce_bench)

# The ceiling: the same algorithm with nothing around it (plain loops, spin barriers).
add_executable(shm_probe benchmarks/allreduce/shm_probe.cpp)
target_link_libraries(shm_probe PRIVATE Threads::Threads)
dtrain_warnings(shm_probe)
add_dependencies(allreduce_bench shm_probe)

# Open MPI's MPI_Allreduce as a peer (Debian's libopenmpi-dev + openmpi-bin), when found.
find_package(MPI COMPONENTS C QUIET)
if(MPI_C_FOUND)
  add_executable(mpi_peer benchmarks/allreduce/mpi_peer.c)
  target_link_libraries(mpi_peer PRIVATE MPI::MPI_C)
  add_dependencies(allreduce_bench mpi_peer)
else()
  message(STATUS "allreduce_bench: no MPI found; its Open MPI peer is not built")
endif()

if(DTRAIN_WITH_TESTS AND DTRAIN_HAVE_GLOO)
  # Started the way it is meant to be: by launch, one process per rank, rank 0's table only.
  add_test(NAME bench_smoke.allreduce_bench
           COMMAND $<TARGET_FILE:launch> --nproc-per-node 2 --local-ranks-filter 0
                   --log-line-prefix-template "" $<TARGET_FILE:allreduce_bench> --smoke)
  set_tests_properties(bench_smoke.allreduce_bench PROPERTIES LABELS integration TIMEOUT 90
                       RUN_SERIAL TRUE)
endif()
