# train_bench: train_resnet's training step against PyTorch DDP's (benchmarks/README.md). Needs
# the examples' library; its CPU mode needs Gloo, its --gpu mode a CUDA libtorch with NCCL (the
# GPU check builds it without Gloo). The PyTorch peer (train_peer.py) runs when the Python
# (--python, by default DTRAIN_PYTHON) can import torch and torchvision.
if(TARGET dtrain_examples)
  add_executable(train_bench
    benchmarks/train/train_bench.cpp
    benchmarks/train/train_bench_worker.cpp)
  target_link_libraries(train_bench PRIVATE dtrain dtrain_examples dtrain_bench_common
                                            nlohmann_json::nlohmann_json)
  target_compile_definitions(train_bench PRIVATE
    DTRAIN_TRAIN_BENCH_DIR="${CMAKE_CURRENT_SOURCE_DIR}/benchmarks/train"
    DTRAIN_PYTHON="${DTRAIN_PYTHON}")
  dtrain_reuse_torch_pch(train_bench)
  dtrain_warnings(train_bench)
  if(DTRAIN_WITH_TESTS AND DTRAIN_HAVE_GLOO)
    add_test(NAME bench_smoke.train_bench COMMAND train_bench --smoke)
    set_tests_properties(bench_smoke.train_bench PROPERTIES LABELS integration TIMEOUT 180)
  endif()
endif()
