# gpt_bench: train_gpt against its PyTorch peer (benchmarks/gpt/gpt_peer.py: DDP, FSDP2) in pairs
# of runs, and a memory pass counting both sides' tensor bytes with librecompute_counting.so
# (benchmarks/recompute) (benchmarks/README.md). A Python driver over the built train_gpt and
# launch; CI runs one pair of a few steps of the nano model, and its memory pass.
if(TARGET train_gpt AND TARGET recompute_counting AND DTRAIN_WITH_TESTS)
  add_test(NAME bench_smoke.gpt_bench
           COMMAND ${DTRAIN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/benchmarks/gpt/gpt_bench.py
                   ${CMAKE_BINARY_DIR} --presets nano --worlds 2 --pairs 1 --steps 3 --warmup 1
                   --configs ddp,zero3 --batch-size 2 --memory-steps 2
                   --counting-lib $<TARGET_FILE:recompute_counting>)
  set_tests_properties(bench_smoke.gpt_bench PROPERTIES LABELS integration TIMEOUT 180)
endif()
