# launch's GPU sampling on a real GPU (label gpu): torch- and CUDA-free, built everywhere, skipped
# without an NVIDIA driver. scripts/gpu_check.sh runs it, and launch sampling a GPU test.
dtrain_gtest(dtrain_gpu_monitor_tests LABEL gpu TIMEOUT 120
  SOURCES tests/gpu/monitor_gpu_test.cpp
  LIBS dtrain_launcher)
