# Torch-free unit tests in one executable: every tests/unit/*_test.cpp (dtrain_base, dtrain_comm's
# torch-free parts) and tests/unit/launcher/*_test.cpp (the launcher's pure functions). Shared
# helpers: *_support.cpp.
file(GLOB DTRAIN_UNIT_TEST_SOURCES CONFIGURE_DEPENDS
  ${CMAKE_CURRENT_SOURCE_DIR}/tests/unit/*_test.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/tests/unit/launcher/*_test.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/tests/unit/*_support.cpp)
dtrain_gtest(dtrain_unit_tests LABEL unit
  SOURCES ${DTRAIN_UNIT_TEST_SOURCES}
  LIBS dtrain_base dtrain_base_internal dtrain_comm dtrain_launcher dtrain_httplib)
include(tests/unit/store_tests.cmake OPTIONAL)

# The checkpoint tests' saver process (killed at every I/O call, run on a small tmpfs).
add_executable(checkpoint_io_helper tests/unit/checkpoint_io_helper.cpp
  tests/unit/checkpoint_test_support.cpp)
target_link_libraries(checkpoint_io_helper PRIVATE dtrain_base dtrain_base_internal)
dtrain_warnings(checkpoint_io_helper)
add_dependencies(dtrain_unit_tests checkpoint_io_helper)

# The TensorBoard tests' writer process, and the LD_PRELOAD library that makes its flock() fail as
# on a filesystem without file locks (libdtrain_flock_errno_shim.so, DTRAIN_TEST_FLOCK_ERRNO).
add_executable(tensorboard_helper tests/unit/tensorboard_helper.cpp)
target_link_libraries(tensorboard_helper PRIVATE dtrain_base)
dtrain_warnings(tensorboard_helper)
add_library(dtrain_flock_errno_shim MODULE tests/unit/flock_errno_shim.c)
target_link_libraries(dtrain_flock_errno_shim PRIVATE ${CMAKE_DL_LIBS})
dtrain_warnings(dtrain_flock_errno_shim)
add_dependencies(dtrain_unit_tests tensorboard_helper dtrain_flock_errno_shim)
