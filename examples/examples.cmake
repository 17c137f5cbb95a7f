# Sample trainers a new user copies to start. They read top to bottom like a tutorial; the model
# and data helpers they share (examples/models, examples/data) are one small library, which the
# tests and benchmarks/train_bench use as well.
add_library(dtrain_examples STATIC
  examples/models/resnet.cpp
  examples/data/cifar10.cpp
  examples/data/loader.cpp
  examples/training/evaluate.cpp
  examples/training/progress.cpp)
target_include_directories(dtrain_examples PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/examples)
target_link_libraries(dtrain_examples PUBLIC dtrain)
target_precompile_headers(dtrain_examples REUSE_FROM dtrain)
target_compile_options(dtrain_examples PRIVATE -fPIC)  # to match the PCH, as below
dtrain_warnings(dtrain_examples)

foreach(example train_linear train_resnet)
  add_executable(${example} examples/${example}.cpp)
  target_link_libraries(${example} PRIVATE dtrain dtrain_examples cxxopts::cxxopts)
  target_precompile_headers(${example} REUSE_FROM dtrain)
  # The PCH is built -fPIC (shared library); -fPIE would make GCC ignore it and recompile torch.h.
  target_compile_options(${example} PRIVATE -fPIC)
  dtrain_warnings(${example})
endforeach()
