# recompute_bench: activation recompute's memory and time, dtrain beside PyTorch's
# checkpoint_sequential (benchmarks/README.md). Needs the examples' library (ResNet-50). The peer
# (recompute_peer.py) runs when the Python (--python, by default DTRAIN_PYTHON) can import torch
# and torchvision; on the CPU it counts tensor bytes with librecompute_counting.so, the tests'
# counting allocator, loaded after torch: it links this build's libtorch, so the peer runs there
# only when the Python's torch is the same release.
if(TARGET dtrain_examples)
  add_library(recompute_counting SHARED benchmarks/recompute/counting_library.cpp)
  target_link_libraries(recompute_counting PRIVATE torch dtrain_testing)  # counting_allocator.h
  # dtrain/comm/communicator.h's Buffer, whose virtual functions it calls on the buffers of the
  # communicator it counts when preloaded into a dtrain program (gpt_bench): headers only, so
  # that the Python peers can load it beside their libtorch without dtrain's libraries.
  target_include_directories(recompute_counting PRIVATE
                             $<TARGET_PROPERTY:dtrain_comm,INTERFACE_INCLUDE_DIRECTORIES>)
  dtrain_warnings(recompute_counting)

  add_executable(recompute_bench
    benchmarks/recompute/recompute_bench.cpp
    benchmarks/recompute/recompute_worker.cpp
    benchmarks/recompute/cuda_memory.cpp)
  # dtrain_testing: counting_allocator.h.
  target_link_libraries(recompute_bench PRIVATE dtrain dtrain_examples dtrain_bench_common
                                                dtrain_testing nlohmann_json::nlohmann_json)
  target_compile_definitions(recompute_bench PRIVATE
    DTRAIN_RECOMPUTE_BENCH_DIR="${CMAKE_CURRENT_SOURCE_DIR}/benchmarks/recompute"
    DTRAIN_RECOMPUTE_COUNTING_LIBRARY="$<TARGET_FILE:recompute_counting>"
    DTRAIN_PYTHON="${DTRAIN_PYTHON}")
  add_dependencies(recompute_bench recompute_counting)
  dtrain_reuse_torch_pch(recompute_bench)
  dtrain_warnings(recompute_bench)
  if(DTRAIN_WITH_TESTS)
    add_test(NAME bench_smoke.recompute_bench COMMAND recompute_bench --smoke)
    set_tests_properties(bench_smoke.recompute_bench PROPERTIES LABELS integration TIMEOUT 180)
  endif()
endif()
