# allreduce_bench: dtrain's allreduce beside C++ c10d::ProcessGroupGloo (when this build has
# libtorch), torch.distributed (gloo), Open MPI, a bare shared-memory probe and memcpy; see
# benchmarks/README.md. The Python, MPI and probe peers are separate programs (torch_peer.py under
# torchrun, mpi_peer under mpirun, shm_probe), driven over FIFOs.
add_executable(allreduce_bench
  benchmarks/allreduce/allreduce_bench.cpp
  benchmarks/allreduce/allreduce_config.cpp
  benchmarks/allreduce/bench_buffers.cpp
  benchmarks/allreduce/peer_process.cpp)
# The C++ peer compiles c10d's ProcessGroupGloo.hpp, which includes Gloo's headers: those dtrain
# found. They are the headers libtorch was built with only when libtorch_cpu links that Gloo as a
# shared library (Debian's libtorch links libgloo.so.0). pip's libtorch has its own Gloo inside
# libtorch_cpu: compiled against other Gloo headers, c10d's classes could be laid out differently
# from the code that runs them, so the peer is skipped there and says why.
set(_c10d_gloo_missing "")
if(NOT DTRAIN_HAVE_TORCH)
  set(_c10d_gloo_missing "this build has no libtorch")
elseif(NOT DTRAIN_HAVE_GLOO)
  set(_c10d_gloo_missing "this build has no Gloo")
else()
  find_library(_torch_cpu_library torch_cpu HINTS "${TORCH_INSTALL_PREFIX}/lib" NO_CACHE)
  if(_torch_cpu_library AND CMAKE_OBJDUMP)
    execute_process(COMMAND ${CMAKE_OBJDUMP} -p "${_torch_cpu_library}"
                    OUTPUT_VARIABLE _torch_cpu_headers ERROR_QUIET)
  endif()
  if(NOT _torch_cpu_headers MATCHES "NEEDED +libgloo")
    string(CONCAT _c10d_gloo_missing "libtorch (${_torch_cpu_library}) does not link the "
                  "system Gloo whose headers dtrain found (pip's bundles its own)")
  endif()
endif()
if(NOT _c10d_gloo_missing)
  # Only for the C++ peer: c10d::ProcessGroupGloo and c10d::TCPStore are exported by libtorch_cpu.
  # Its header is compiled only with this macro.
  target_sources(allreduce_bench PRIVATE benchmarks/allreduce/c10d_peer.cpp)
  set_source_files_properties(benchmarks/allreduce/c10d_peer.cpp PROPERTIES
                              COMPILE_DEFINITIONS USE_C10D_GLOO)
  target_link_libraries(allreduce_bench PRIVATE torch)
else()
  message(STATUS "allreduce_bench: the c10d Gloo peer is not built: ${_c10d_gloo_missing}")
  target_sources(allreduce_bench PRIVATE benchmarks/allreduce/c10d_peer_unavailable.cpp)
  set_source_files_properties(benchmarks/allreduce/c10d_peer_unavailable.cpp PROPERTIES
                              COMPILE_DEFINITIONS "DTRAIN_C10D_PEER_MISSING=\"${_c10d_gloo_missing}\"")
endif()
target_include_directories(allreduce_bench PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/runtime/comm)
target_compile_definitions(allreduce_bench PRIVATE
  DTRAIN_BENCH_SOURCE_DIR="${CMAKE_CURRENT_SOURCE_DIR}/benchmarks/allreduce"
  DTRAIN_PYTHON="${DTRAIN_PYTHON}")
# dtrain_testing: free_port.h.
target_link_libraries(allreduce_bench PRIVATE dtrain_comm dtrain_base_internal dtrain_bench_stats
                                              dtrain_testing cxxopts::cxxopts)
if(DTRAIN_HAVE_NCCL)
  target_sources(allreduce_bench PRIVATE benchmarks/allreduce/bench_buffers_cuda.cpp)
  target_link_libraries(allreduce_bench PRIVATE CUDA::cudart)
endif()
dtrain_warnings(allreduce_bench)

# The ceiling: the same algorithm with nothing around it (plain loops, spin barriers).
add_executable(shm_probe benchmarks/allreduce/shm_probe.cpp)
target_link_libraries(shm_probe PRIVATE dtrain_bench_stats Threads::Threads)
dtrain_warnings(shm_probe)
add_dependencies(allreduce_bench shm_probe)

# Open MPI's MPI_Allreduce as a peer (Debian's libopenmpi-dev + openmpi-bin), when found.
find_package(MPI COMPONENTS C QUIET)
if(MPI_C_FOUND)
  add_executable(mpi_peer benchmarks/allreduce/mpi_peer.cpp)
  # The C API from C++: without these mpi.h would pull in the MPI C++ bindings and their library.
  target_compile_definitions(mpi_peer PRIVATE OMPI_SKIP_MPICXX MPICH_SKIP_MPICXX)
  target_link_libraries(mpi_peer PRIVATE MPI::MPI_C dtrain_bench_stats)
  dtrain_warnings(mpi_peer)
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
