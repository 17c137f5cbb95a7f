# Benchmarks: built in CI, run there only in --smoke mode (the bench_smoke.* CTest tests). Each
# area owns one include; common/ is the harness they all share.
include(benchmarks/common/common.cmake)
include(benchmarks/store/store.cmake OPTIONAL)
include(benchmarks/launch/launch.cmake OPTIONAL)
include(benchmarks/allreduce/allreduce.cmake OPTIONAL)
if(DTRAIN_HAVE_TORCH)
  include(benchmarks/ddp/ddp.cmake OPTIONAL)
  include(benchmarks/zero/zero.cmake OPTIONAL)
  include(benchmarks/checkpoint/checkpoint.cmake OPTIONAL)
  include(benchmarks/train/train.cmake OPTIONAL)
  include(benchmarks/recompute/recompute.cmake OPTIONAL)
  include(benchmarks/gpt/gpt.cmake OPTIONAL)
endif()
