# dtrain: the libtorch layer (init, ProcessGroup, DDP, GradScaler, TrainingState, Checkpointer,
# sampler, ZeRO): every runtime/torch/*.cpp and those of its folders, one per concept (state/,
# ddp/, checkpoint/, recompute/, zero/). torch/torch.h costs ~15-30 s per translation unit: the layer and the torch
# tests share one precompiled header.
file(GLOB DTRAIN_TORCH_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/runtime/torch/*.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/runtime/torch/state/*.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/runtime/torch/ddp/*.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/runtime/torch/checkpoint/*.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/runtime/torch/recompute/*.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/runtime/torch/zero/*.cpp)
add_library(dtrain SHARED ${DTRAIN_TORCH_SOURCES})
if(TARGET dtrain_gloo)
  add_dependencies(dtrain dtrain_gloo)  # loaded at run time by dtrain_comm: built with dtrain
endif()
add_library(dtrain::dtrain ALIAS dtrain)
target_link_libraries(dtrain PUBLIC dtrain_comm torch)
if(CMAKE_CXX_STANDARD GREATER_EQUAL 20)
  target_compile_features(dtrain PUBLIC cxx_std_20)  # libtorch >= 2.13: so must its users be
endif()
# dtrain_base's internal headers: the checkpoint format (checkpoint/format.h) and parse_int.h.
target_include_directories(dtrain PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/runtime/base)
if(DTRAIN_HAVE_TORCH_CUDA AND DTRAIN_HAVE_NCCL)
  target_link_libraries(dtrain PRIVATE CUDA::cudart)
endif()
target_precompile_headers(dtrain PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/runtime/torch/pch.h)
# No dtrain_EXPORTS macro (nothing uses it): GCC refuses a PCH built with a macro the reusing
# target lacks, and the torch tests and benchmarks reuse this one.
set_target_properties(dtrain PROPERTIES DEFINE_SYMBOL "")
set_target_properties(dtrain PROPERTIES VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR})
dtrain_warnings(dtrain)
list(APPEND DTRAIN_INSTALL_TARGETS dtrain)
