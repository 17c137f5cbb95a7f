# dtrain_comm: the Communicator and its backends (Gloo, NCCL, shared memory). No libtorch.
add_library(dtrain_comm SHARED
  runtime/comm/backends.cpp
  runtime/comm/communicator.cpp
  runtime/comm/communicator_base.cpp
  runtime/comm/collective.cpp
  runtime/comm/collective_faults.cpp
  runtime/comm/collective_queue.cpp
  runtime/comm/failure_report.cpp
  runtime/comm/flight_recorder.cpp
  runtime/comm/heartbeat_monitor.cpp
  runtime/comm/host_buffer_pool.cpp
  runtime/comm/membership_watcher.cpp
  runtime/comm/nccl_env.cpp
  runtime/comm/queued_communicator.cpp
  runtime/comm/reduce_kernels.cpp
  runtime/comm/shm/shm_arena.cpp
  runtime/comm/shm/shm_communicator.cpp
  runtime/comm/shm/shm_engine.cpp
  runtime/comm/shm/shm_handover.cpp
  runtime/comm/shm/shm_hierarchical.cpp
  runtime/comm/shm/shm_kernels.cpp
  runtime/comm/shm/shm_segment.cpp
  runtime/comm/shm/shm_wait.cpp
  runtime/comm/sigpipe_guard.cpp
  runtime/comm/store_collective_check.cpp
  runtime/comm/subgroup.cpp
  runtime/comm/world.cpp
  runtime/comm/world_env.cpp
  runtime/comm/world_reform.cpp
)
add_library(dtrain::dtrain_comm ALIAS dtrain_comm)
target_link_libraries(dtrain_comm PUBLIC dtrain_base)
target_include_directories(dtrain_comm PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/runtime/comm
                           ${CMAKE_CURRENT_SOURCE_DIR}/runtime/comm/shm)
# dtrain_base's internal parse_int.h (one integer rule everywhere).
target_include_directories(dtrain_comm PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/runtime/base)
if(DTRAIN_HAVE_GLOO)
  # The Gloo backend is a library of its own that dtrain_comm loads on first use, once it has seen
  # that gloo:: symbols resolve to the system's libgloo and not to the Gloo a pip libtorch carries
  # (Note [One Gloo per process] in runtime/comm/gloo_loader.cpp). Built wherever dtrain_comm is.
  target_sources(dtrain_comm PRIVATE runtime/comm/gloo_loader.cpp)
  target_link_libraries(dtrain_comm PRIVATE ${CMAKE_DL_LIBS})
  add_library(dtrain_gloo MODULE
    runtime/comm/gloo/gloo_algorithms.cpp
    runtime/comm/gloo/gloo_communicator.cpp
    runtime/comm/gloo/gloo_failure.cpp
    runtime/comm/gloo/gloo_mesh.cpp
    runtime/comm/gloo/gloo_store.cpp)
  set_target_properties(dtrain_gloo PROPERTIES PREFIX "lib" OUTPUT_NAME dtrain_gloo
                        LIBRARY_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}")
  target_include_directories(dtrain_gloo PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/runtime/comm
                             ${CMAKE_CURRENT_SOURCE_DIR}/runtime/comm/gloo
                             ${CMAKE_CURRENT_SOURCE_DIR}/runtime/base)
  target_link_libraries(dtrain_gloo PRIVATE dtrain_comm gloo)
  dtrain_warnings(dtrain_gloo)
  # The system's libgloo comes first among the libraries of every program that links dtrain_comm,
  # ahead of a libtorch that carries its own Gloo, so that gloo:: symbols resolve to it.
  get_target_property(DTRAIN_GLOO_LIBRARY gloo LOCATION)  # the imported library's file
  if(DTRAIN_GLOO_LIBRARY)
    target_link_options(dtrain_comm INTERFACE "LINKER:--push-state,--no-as-needed"
                        "${DTRAIN_GLOO_LIBRARY}" "LINKER:--pop-state")
    target_compile_definitions(dtrain_comm PRIVATE DTRAIN_GLOO_LIBRARY="${DTRAIN_GLOO_LIBRARY}")
  endif()
  install(TARGETS dtrain_gloo LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime)
else()
  target_sources(dtrain_comm PRIVATE runtime/comm/gloo_unavailable.cpp)
endif()
if(DTRAIN_HAVE_NCCL)
  target_sources(dtrain_comm PRIVATE
    runtime/comm/nccl/cuda_device.cpp
    runtime/comm/nccl/nccl_communicator.cpp
    runtime/comm/nccl/nccl_errors.cpp
    runtime/comm/nccl/nccl_types.cpp
    runtime/comm/nccl/nccl_work.cpp)
  target_include_directories(dtrain_comm PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/runtime/comm/nccl)
  target_link_libraries(dtrain_comm PRIVATE NCCL::nccl CUDA::cudart)
else()
  target_sources(dtrain_comm PRIVATE runtime/comm/nccl_unavailable.cpp)
endif()
set_target_properties(dtrain_comm PROPERTIES VERSION ${PROJECT_VERSION}
                      SOVERSION ${PROJECT_VERSION_MAJOR})
dtrain_warnings(dtrain_comm)
list(APPEND DTRAIN_INSTALL_TARGETS dtrain_comm)
