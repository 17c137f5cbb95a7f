# dtrain_base: errors, logging, sockets, the store, the env contract, fault injection.
# No CUDA, no Gloo, no libtorch: `launch` links only this.
add_library(dtrain_base SHARED
  runtime/base/error.cpp
  runtime/base/fault.cpp
  runtime/base/logging.cpp
  runtime/base/store/hash_store.cpp
  runtime/base/store/prefix_store.cpp
)
add_library(dtrain::dtrain_base ALIAS dtrain_base)
target_include_directories(dtrain_base PUBLIC
  $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/runtime/include>
  $<BUILD_INTERFACE:${DTRAIN_GENERATED_INCLUDE}>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_link_libraries(dtrain_base
  PUBLIC fmt::fmt Threads::Threads
  PRIVATE dtrain_libuv OpenSSL::Crypto)
set_target_properties(dtrain_base PROPERTIES OUTPUT_NAME dtrain_base VERSION ${PROJECT_VERSION}
                      SOVERSION ${PROJECT_VERSION_MAJOR})
dtrain_warnings(dtrain_base)
list(APPEND DTRAIN_INSTALL_TARGETS dtrain_base)
