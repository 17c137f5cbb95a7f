# What the tests and the benchmarks share, header-only and never installed: a free TCP port
# (free_port.h) and the counting CPU allocator that measures tensor bytes (counting_allocator.h,
# needs libtorch). Benchmarks include these, never tests/.
add_library(dtrain_testing INTERFACE)
target_include_directories(dtrain_testing INTERFACE ${CMAKE_CURRENT_SOURCE_DIR}/testing)
