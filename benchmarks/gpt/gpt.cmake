# gpt_bench: train_gpt against its PyTorch peer (benchmarks/gpt/gpt_peer.py: DDP, FSDP2) in pairs
# of runs (benchmarks/README.md). A Python driver over the built train_gpt and launch; CI runs one
# pair of a few steps of the nano model.
if(TARGET train_gpt AND DTRAIN_WITH_TESTS)
  add_test(NAME bench_smoke.gpt_bench
           COMMAND ${DTRAIN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/benchmarks/gpt/gpt_bench.py
                   ${CMAKE_BINARY_DIR} --presets nano --worlds 2 --pairs 1 --steps 3 --warmup 1
                   --configs ddp,zero3 --batch-size 2)
  set_tests_properties(bench_smoke.gpt_bench PROPERTIES LABELS integration TIMEOUT 180)
endif()
