# Tests of dtrain_base: the store, the checkpoint file format and its I/O, metrics and TensorBoard,
# progress, faults, text. Torch-free, in one executable with the launcher's pure functions
# (tests/launcher/launcher.cmake adds those): every *_test.cpp here and one folder down; shared
# helpers: *_support.cpp.
file(GLOB DTRAIN_UNIT_TEST_SOURCES CONFIGURE_DEPENDS
  ${CMAKE_CURRENT_LIST_DIR}/*_test.cpp ${CMAKE_CURRENT_LIST_DIR}/*/*_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/*/*_support.cpp)
# The store's wire and hostile-client tests reach dtrain_base's internal headers.
dtrain_gtest(dtrain_unit_tests LABEL unit
  SOURCES ${DTRAIN_UNIT_TEST_SOURCES}
  LIBS dtrain_base dtrain_base_internal dtrain_comm dtrain_httplib)

# The store's timing-bound tests in their own executable, run serially (RUN_SERIAL) so a loaded
# machine does not make their time bounds flaky.
dtrain_gtest(dtrain_store_timing_tests LABEL unit SERIAL
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/store/tcp_store_timing.cpp
          ${CMAKE_CURRENT_LIST_DIR}/store/store_support.cpp
  LIBS dtrain_base_internal)

# The checkpoint tests' saver process (killed at every I/O call, run on a small tmpfs).
add_executable(checkpoint_io_helper ${CMAKE_CURRENT_LIST_DIR}/checkpoint/checkpoint_io_helper.cpp
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint/checkpoint_file_support.cpp)
target_link_libraries(checkpoint_io_helper PRIVATE dtrain_base dtrain_base_internal)
dtrain_warnings(checkpoint_io_helper)
add_dependencies(dtrain_unit_tests checkpoint_io_helper)

# The TensorBoard tests' writer process, and the LD_PRELOAD library that makes its flock() fail as
# on a filesystem without file locks (libdtrain_flock_errno_shim.so, DTRAIN_TEST_FLOCK_ERRNO).
add_executable(tensorboard_helper ${CMAKE_CURRENT_LIST_DIR}/metrics/tensorboard_helper.cpp)
target_link_libraries(tensorboard_helper PRIVATE dtrain_base)
dtrain_warnings(tensorboard_helper)
add_library(dtrain_flock_errno_shim MODULE ${CMAKE_CURRENT_LIST_DIR}/metrics/flock_errno_shim.c)
target_link_libraries(dtrain_flock_errno_shim PRIVATE ${CMAKE_DL_LIBS})
dtrain_warnings(dtrain_flock_errno_shim)
add_dependencies(dtrain_unit_tests tensorboard_helper dtrain_flock_errno_shim)
