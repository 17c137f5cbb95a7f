# Benchmarks: built in CI, run there only in --smoke mode (tests/scripts). Each area owns one include.
include(benchmarks/store/store.cmake OPTIONAL)
include(benchmarks/launch/launch.cmake OPTIONAL)
include(benchmarks/allreduce/allreduce.cmake OPTIONAL)
if(DTRAIN_HAVE_TORCH)
  include(benchmarks/ddp/ddp.cmake OPTIONAL)
  include(benchmarks/checkpoint/checkpoint.cmake OPTIONAL)
endif()
