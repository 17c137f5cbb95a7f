# Sample trainers a new user copies to start. They read top to bottom like a tutorial.
add_executable(train_linear examples/train_linear.cpp)
target_link_libraries(train_linear PRIVATE dtrain)
target_precompile_headers(train_linear REUSE_FROM dtrain)
# The PCH is built -fPIC (shared library); -fPIE would make GCC ignore it and recompile torch.h.
target_compile_options(train_linear PRIVATE -fPIC)
dtrain_warnings(train_linear)
