# `checkpoint`: list, verify and export dtrain checkpoints. Its list and verify use only the
# torch-free reader in dtrain_base; export writes PyTorch's formats through libtorch.
add_executable(checkpoint tools/checkpoint/main.cpp)
target_link_libraries(checkpoint PRIVATE dtrain dtrain_base_internal)
dtrain_warnings(checkpoint)
list(APPEND DTRAIN_INSTALL_TARGETS checkpoint)
