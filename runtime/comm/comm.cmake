# dtrain_comm: the Communicator and its backends (Gloo, NCCL, shared memory). No libtorch.
add_library(dtrain_comm SHARED
  runtime/comm/communicator.cpp
)
add_library(dtrain::dtrain_comm ALIAS dtrain_comm)
target_link_libraries(dtrain_comm PUBLIC dtrain_base)
if(DTRAIN_HAVE_GLOO)
  target_link_libraries(dtrain_comm PRIVATE gloo)
endif()
if(DTRAIN_HAVE_NCCL)
  target_link_libraries(dtrain_comm PRIVATE NCCL::nccl CUDA::cudart)
endif()
set_target_properties(dtrain_comm PROPERTIES VERSION ${PROJECT_VERSION}
                      SOVERSION ${PROJECT_VERSION_MAJOR})
dtrain_warnings(dtrain_comm)
list(APPEND DTRAIN_INSTALL_TARGETS dtrain_comm)
