# Torch tests in one executable (ranks as threads): every tests/torch/*_test.cpp and
# tests/torch/zero/*_test.cpp, sharing the torch layer's precompiled header. Real-process tests
# live in tests/integration.
file(GLOB DTRAIN_TORCH_TEST_SOURCES CONFIGURE_DEPENDS
  ${CMAKE_CURRENT_SOURCE_DIR}/tests/torch/*_test.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/tests/torch/zero/*_test.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/tests/torch/*_support.cpp)
if(DTRAIN_TORCH_TEST_SOURCES)
  dtrain_gtest(dtrain_torch_tests LABEL unit TORCH BY_SUITE TIMEOUT 300
    SERIAL_TESTS "DdpOverlap.*"
    SOURCES ${DTRAIN_TORCH_TEST_SOURCES}
    LIBS dtrain dtrain_base_internal)
  # checkpoint_zero3_test runs the `checkpoint` tool on the directories it writes.
  add_dependencies(dtrain_torch_tests checkpoint)
endif()
