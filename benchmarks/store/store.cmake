# store_bench: TcpStore round trips beside c10d::TCPStore (from libtorch, when this build has it).
add_executable(store_bench benchmarks/store/store_bench.cpp)
target_link_libraries(store_bench PRIVATE dtrain_base dtrain_bench_stats)
if(DTRAIN_HAVE_TORCH)
  # Only for the peer: c10d::TCPStore is exported by libtorch_cpu.
  target_link_libraries(store_bench PRIVATE torch)
endif()
dtrain_warnings(store_bench)

if(DTRAIN_WITH_TESTS)
  add_test(NAME bench_smoke.store_bench COMMAND store_bench --smoke)
  set_tests_properties(bench_smoke.store_bench PROPERTIES LABELS integration TIMEOUT 60)
endif()
