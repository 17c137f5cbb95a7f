# dtrain_base: errors, logging, sockets, the store, the env contract, fault injection, metrics
# (JSONL, Prometheus, TensorBoard event files), the checkpoint file format and its file I/O.
# No CUDA, no Gloo, no libtorch: `launch` links only this.
add_library(dtrain_base SHARED
  runtime/base/checkpoint/agreement.cpp
  runtime/base/checkpoint/file_io.cpp
  runtime/base/checkpoint/format.cpp
  runtime/base/checkpoint/reader.cpp
  runtime/base/checkpoint/save_thread.cpp
  runtime/base/error.cpp
  runtime/base/fault.cpp
  runtime/base/logging.cpp
  runtime/base/membership.cpp
  runtime/base/monitor/progress.cpp
  runtime/base/monitor/progress_publisher.cpp
  runtime/base/metrics/event_file.cpp
  runtime/base/metrics/fields.cpp
  runtime/base/metrics/http_server.cpp
  runtime/base/metrics/launch_sink.cpp
  runtime/base/metrics/metrics.cpp
  runtime/base/metrics/prometheus.cpp
  runtime/base/metrics/tensorboard.cpp
  runtime/base/net/net_interface.cpp
  runtime/base/net/socket.cpp
  runtime/base/parse_int.cpp
  runtime/base/text.cpp
  runtime/base/store/auth.cpp
  runtime/base/store/client_connect.cpp
  runtime/base/store/client_round_trip.cpp
  runtime/base/store/hash_store.cpp
  runtime/base/store/job_store.cpp
  runtime/base/store/kv_table.cpp
  runtime/base/store/prefix_store.cpp
  runtime/base/store/server_connection.cpp
  runtime/base/store/tcp_store_client.cpp
  runtime/base/store/tcp_store_server.cpp
  runtime/base/store/wire.cpp
  runtime/base/timeout.cpp
)
add_library(dtrain::dtrain_base ALIAS dtrain_base)
target_include_directories(dtrain_base PUBLIC
  $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/runtime/include>
  $<BUILD_INTERFACE:${DTRAIN_GENERATED_INCLUDE}>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
# Internal headers (store/wire.h, net/socket.h, checkpoint/format.h): for dtrain_base itself and, through
# dtrain_base_internal, for tests, benchmarks and fuzz targets of this tree; never installed.
target_include_directories(dtrain_base PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/runtime/base)
add_library(dtrain_base_internal INTERFACE)
target_include_directories(dtrain_base_internal INTERFACE ${CMAKE_CURRENT_SOURCE_DIR}/runtime/base)
target_link_libraries(dtrain_base_internal INTERFACE dtrain_base dtrain_libuv OpenSSL::Crypto)
target_link_libraries(dtrain_base
  PUBLIC fmt::fmt Threads::Threads
  PRIVATE dtrain_libuv OpenSSL::Crypto nlohmann_json::nlohmann_json dtrain_xxhash dtrain_isal)
set_target_properties(dtrain_base PROPERTIES OUTPUT_NAME dtrain_base VERSION ${PROJECT_VERSION}
                      SOVERSION ${PROJECT_VERSION_MAJOR})
dtrain_warnings(dtrain_base)
list(APPEND DTRAIN_INSTALL_TARGETS dtrain_base)
