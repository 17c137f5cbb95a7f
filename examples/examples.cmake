# Sample trainers a new user copies to start. They read top to bottom like a tutorial; the
# helpers they share (examples/models, examples/data, examples/training) are one small library,
# which the tests and benchmarks/train_bench use as well.
add_library(dtrain_examples STATIC
  examples/models/resnet.cpp
  examples/models/gpt.cpp
  examples/data/cifar10.cpp
  examples/data/loader.cpp
  examples/training/evaluate.cpp
  examples/training/fingerprint.cpp
  examples/training/progress.cpp
  examples/training/job.cpp
  examples/training/state_dict.cpp)
target_include_directories(dtrain_examples PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/examples)
target_link_libraries(dtrain_examples PUBLIC dtrain)
dtrain_reuse_torch_pch(dtrain_examples)
dtrain_warnings(dtrain_examples)

foreach(example train_linear train_resnet train_gpt)
  add_executable(${example} examples/${example}.cpp)
  target_link_libraries(${example} PRIVATE dtrain dtrain_examples cxxopts::cxxopts)
  dtrain_reuse_torch_pch(${example})
  dtrain_warnings(${example})
endforeach()
