# Tests of the torch layer, laid out as runtime/torch is: ddp/, zero/, recompute/, checkpoint/.
# Ranks as threads in one executable (dtrain_torch_tests, sharing the torch layer's precompiled
# header): every *_test.cpp here and one folder down but the real-process ones
# (*_processes_test.cpp: a worker program beside them that `launch` starts), the multi-node
# checkpoint test (*_e2e_test.cpp) and the CUDA one (*_cuda_test.cpp).
file(GLOB DTRAIN_TORCH_TEST_SOURCES CONFIGURE_DEPENDS
  ${CMAKE_CURRENT_LIST_DIR}/*_test.cpp ${CMAKE_CURRENT_LIST_DIR}/*/*_test.cpp)
list(FILTER DTRAIN_TORCH_TEST_SOURCES EXCLUDE REGEX "_(processes|e2e|cuda)_test\\.cpp$")
set(_dir ${CMAKE_CURRENT_LIST_DIR})
if(DTRAIN_TORCH_TEST_SOURCES)
  # CheckpointerTimeouts waits its saves' timeouts out (~10 s): integration.
  dtrain_gtest(dtrain_torch_tests LABEL unit TORCH BY_SUITE TIMEOUT 300
    SERIAL_TESTS "DdpOverlap.*"
    INTEGRATION_SUITES "CheckpointerTimeouts.*"
    SOURCES ${DTRAIN_TORCH_TEST_SOURCES}
    LIBS dtrain dtrain_base_internal dtrain_thread_comm_support)
  # checkpoint_zero3_test runs the `checkpoint` tool on the directories it writes.
  add_dependencies(dtrain_torch_tests checkpoint)
  # Note [One Gloo per process]: with a libtorch that carries its own Gloo forced ahead of the
  # system's (LD_PRELOAD), the Gloo backend is refused with the message that names both, and
  # nothing crashes.
  set(_torch_cpu "${TORCH_INSTALL_PREFIX}/lib/libtorch_cpu.so")
  if(DTRAIN_HAVE_GLOO AND EXISTS "${_torch_cpu}")
    execute_process(COMMAND nm -D --defined-only "${_torch_cpu}" OUTPUT_VARIABLE _torch_symbols
                    ERROR_QUIET)
    if(_torch_symbols MATCHES "_ZN4gloo7Context8nextSlotEi")
      add_test(NAME gloo.another_gloo_first_is_refused
               COMMAND ${CMAKE_COMMAND} -E env "LD_PRELOAD=${_torch_cpu}"
                       $<TARGET_FILE:dtrain_torch_tests>
                       --gtest_filter=ProcessGroupCollectives.GlooRunsBesideTheGlooInsideLibtorch)
      set_tests_properties(gloo.another_gloo_first_is_refused PROPERTIES LABELS unit TIMEOUT 120
        PASS_REGULAR_EXPRESSION "gloo:: symbols of this process resolve to [^ ]*libtorch_cpu.so")
    endif()
  endif()
endif()

# Built wherever libtorch is (a CPU-only one included), so every CI run compiles them; they skip
# without a GPU, and without NCCL init() says dtrain was built without it.
dtrain_gtest(dtrain_gpu_torch_tests LABEL gpu SERIAL TORCH TIMEOUT 180
  SOURCES ${_dir}/process_group_cuda_test.cpp
  LIBS dtrain)

# A worker program for the real-process tests of each concept: the trainer that `launch` starts.
function(dtrain_torch_worker name source)
  add_executable(${name} ${source})
  target_link_libraries(${name} PRIVATE dtrain)
  dtrain_reuse_torch_pch(${name})
  dtrain_warnings(${name})
endfunction()

# Real processes under `launch` (label integration). Need Gloo.
if(DTRAIN_HAVE_GLOO)
  # DDP: ddp_worker trains; dtrain_ddp_process_tests drives it.
  dtrain_torch_worker(ddp_worker ${_dir}/ddp/ddp_worker.cpp)
  dtrain_gtest(dtrain_ddp_process_tests LABEL integration TIMEOUT 240
    SOURCES ${_dir}/ddp/ddp_processes_test.cpp
    LIBS dtrain_launcher_support)
  add_dependencies(dtrain_ddp_process_tests ddp_worker launch)
  # Surviving a lost node (launch --on-node-loss continue): node_loss_worker trains; the e2e test
  # kills a node of a simulated cluster under it.
  dtrain_torch_worker(node_loss_worker ${_dir}/ddp/node_loss_worker.cpp)
  dtrain_gtest(node_loss_e2e_tests LABEL e2e SERIAL TIMEOUT 240
    SOURCES ${_dir}/ddp/node_loss_e2e_test.cpp
    LIBS dtrain_cluster_support)
  add_dependencies(node_loss_e2e_tests launch node_loss_worker)

  # ZeRO over shared memory and over Gloo.
  dtrain_torch_worker(zero_worker ${_dir}/zero/zero_worker.cpp)
  # Its training loop is the thread tests' (zero_support.h), whose headers reach the shared
  # thread helpers.
  target_link_libraries(zero_worker PRIVATE dtrain_thread_comm_support)
  dtrain_gtest(dtrain_zero_process_tests LABEL integration TIMEOUT 300
    SERIAL_TESTS "Backends/ZeroSkippedUnit.*:ZeroMemoryLimit.*"
    SOURCES ${_dir}/zero/zero_processes_test.cpp
    LIBS dtrain_launcher_support)
  add_dependencies(dtrain_zero_process_tests zero_worker launch)
  if(TARGET train_gpt)
    add_dependencies(dtrain_zero_process_tests train_gpt)
  endif()

  # Activation recompute under DDP; recompute_rss_worker: resident memory of a recomputed step
  # (docs/training.md, "Host memory cache").
  dtrain_torch_worker(recompute_worker ${_dir}/recompute/recompute_worker.cpp)
  dtrain_torch_worker(recompute_rss_worker ${_dir}/recompute/recompute_rss_worker.cpp)
  dtrain_gtest(dtrain_recompute_process_tests LABEL integration TIMEOUT 180
    SOURCES ${_dir}/recompute/recompute_processes_test.cpp
    LIBS dtrain_launcher_support)
  add_dependencies(dtrain_recompute_process_tests recompute_worker recompute_rss_worker launch)

  # Checkpoints and resume: checkpoint_worker is the trainer that `launch` starts (or the test
  # starts by hand as two simulated nodes); the tests drive it and the `checkpoint` tool, on one
  # machine and on a simulated cluster (label e2e; SKIP without root or network namespaces).
  dtrain_torch_worker(checkpoint_worker ${_dir}/checkpoint/checkpoint_worker.cpp)
  target_link_libraries(checkpoint_worker PRIVATE dtrain_base_internal)  # fault.h: injectAt()
  dtrain_gtest(dtrain_checkpoint_process_tests LABEL integration TIMEOUT 300
    SOURCES ${_dir}/checkpoint/checkpoint_processes_test.cpp
    LIBS dtrain_launcher_support)
  add_dependencies(dtrain_checkpoint_process_tests checkpoint_worker checkpoint launch)
  dtrain_gtest(checkpoint_e2e_tests LABEL e2e TIMEOUT 240
    SOURCES ${_dir}/checkpoint/checkpoint_e2e_test.cpp
    LIBS dtrain_cluster_support)
  add_dependencies(checkpoint_e2e_tests launch checkpoint_worker)
endif()
