# dtrain: the libtorch layer (init, ProcessGroup, DDP, GradScaler, Checkpointer, sampler).
# torch/torch.h costs ~15-30 s per translation unit: the layer shares one precompiled header.
add_library(dtrain SHARED
  runtime/torch/version.cpp
)
add_library(dtrain::dtrain ALIAS dtrain)
target_link_libraries(dtrain PUBLIC dtrain_comm torch)
target_precompile_headers(dtrain PRIVATE runtime/torch/pch.h)
set_target_properties(dtrain PROPERTIES VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR})
dtrain_warnings(dtrain)
list(APPEND DTRAIN_INSTALL_TARGETS dtrain)
