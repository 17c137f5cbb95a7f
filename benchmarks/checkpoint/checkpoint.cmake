# checkpoint_bench: dtrain's Checkpointer against torch.save/torch.load (DTRAIN_PYTHON's torch)
# and dd (benchmarks/README.md). The --train mode runs under launch and needs Gloo; so does
# --sharded, the dtrain side of dcp_bench.py (sharded checkpoints beside PyTorch's DCP + FSDP2).
add_executable(checkpoint_bench benchmarks/checkpoint/checkpoint_bench.cpp
                                benchmarks/checkpoint/sharded_bench.cpp)
target_link_libraries(checkpoint_bench PRIVATE dtrain dtrain_bench_stats
                                               nlohmann_json::nlohmann_json)
target_compile_definitions(checkpoint_bench PRIVATE
  DTRAIN_CHECKPOINT_BENCH_DIR="${CMAKE_CURRENT_SOURCE_DIR}/benchmarks/checkpoint"
  DTRAIN_PYTHON="${DTRAIN_PYTHON}")
dtrain_reuse_torch_pch(checkpoint_bench)
dtrain_warnings(checkpoint_bench)
if(DTRAIN_WITH_TESTS AND DTRAIN_HAVE_GLOO)
  add_test(NAME bench_smoke.checkpoint_bench COMMAND checkpoint_bench --smoke)
  add_test(NAME bench_smoke.checkpoint_bench_train
           COMMAND launch --nproc-per-node 1 $<TARGET_FILE:checkpoint_bench> --train --smoke)
  set_tests_properties(bench_smoke.checkpoint_bench bench_smoke.checkpoint_bench_train
                       PROPERTIES LABELS integration TIMEOUT 120)
  # dcp_bench.py's smoke: a small model saved at 2 ranks and loaded at 4 on each side; it exits 1
  # unless every restore check passed. Without the venv's torch there is no peer to run.
  if(TARGET launch AND EXISTS "${DTRAIN_PYTHON}")
    add_test(NAME bench_smoke.dcp_bench
             COMMAND ${DTRAIN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/benchmarks/checkpoint/dcp_bench.py
                     $<TARGET_FILE_DIR:checkpoint_bench> --smoke)
    set_tests_properties(bench_smoke.dcp_bench PROPERTIES LABELS integration TIMEOUT 120
                         PASS_REGULAR_EXPRESSION "restore checks: all passed")
  endif()
endif()
