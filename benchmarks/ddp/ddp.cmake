# ddp_step_bench: dtrain's DDP against PyTorch's (benchmarks/README.md). Needs Gloo for the ranks'
# collectives; the PyTorch peer (ddp_step_peer.py) runs when DTRAIN_PYTHON can import torch.
if(DTRAIN_HAVE_GLOO)
  add_executable(ddp_step_bench
    benchmarks/ddp/ddp_step_bench.cpp
    benchmarks/ddp/ddp_step_worker.cpp)
  target_link_libraries(ddp_step_bench PRIVATE dtrain dtrain_bench_common
                                               nlohmann_json::nlohmann_json)
  target_compile_definitions(ddp_step_bench PRIVATE
    DTRAIN_DDP_BENCH_DIR="${CMAKE_CURRENT_SOURCE_DIR}/benchmarks/ddp"
    DTRAIN_PYTHON="${DTRAIN_PYTHON}")
  dtrain_reuse_torch_pch(ddp_step_bench)
  dtrain_warnings(ddp_step_bench)
  if(DTRAIN_WITH_TESTS)
    add_test(NAME bench_smoke.ddp_step_bench COMMAND ddp_step_bench --smoke)
    set_tests_properties(bench_smoke.ddp_step_bench PROPERTIES LABELS integration TIMEOUT 120)
  endif()
endif()
