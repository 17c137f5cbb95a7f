# zero_bench: ZeRO stages 1, 2 and 3 against plain DDP (benchmarks/README.md), its jobs taking
# turns through the benchmarks' shared plumbing (dtrain_bench_common).
if(DTRAIN_HAVE_GLOO)
  add_executable(zero_bench
    benchmarks/zero/zero_bench.cpp
    benchmarks/zero/zero_bench_worker.cpp
    benchmarks/zero/layer_probe.cpp)
  # dtrain_testing: counting_allocator.h.
  target_link_libraries(zero_bench PRIVATE dtrain dtrain_bench_common dtrain_testing
                                           nlohmann_json::nlohmann_json)
  dtrain_reuse_torch_pch(zero_bench)
  dtrain_warnings(zero_bench)
  if(DTRAIN_WITH_TESTS)
    add_test(NAME bench_smoke.zero_bench COMMAND zero_bench --smoke)
    set_tests_properties(bench_smoke.zero_bench PROPERTIES LABELS integration TIMEOUT 120)
  endif()
endif()

# zero_peer_bench.py: ZeRO-3 and ZeRO-1 against PyTorch's FSDP2 and ZeroRedundancyOptimizer
# (zero_peer.py), in pairs of runs under launch (benchmarks/README.md). Both sides count tensor
# bytes with the tests' counting allocator: the peer loads librecompute_counting.so, which
# benchmarks/recompute defines whenever the examples' library exists. The smoke run checks the
# peers against one process and prints one pair per method at world size 2.
if(TARGET zero_bench AND TARGET launch AND TARGET dtrain_examples AND DTRAIN_WITH_TESTS)
  add_test(NAME bench_smoke.zero_peer_bench
           COMMAND ${DTRAIN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/benchmarks/zero/zero_peer_bench.py
                   ${CMAKE_BINARY_DIR} --counting-lib $<TARGET_FILE:recompute_counting> --smoke)
  # Exits 1 unless every peer passed its check and every row was printed.
  set_tests_properties(bench_smoke.zero_peer_bench PROPERTIES LABELS integration TIMEOUT 120)
endif()
