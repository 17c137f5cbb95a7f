# Torch-free unit tests in one executable: every tests/unit/*_test.cpp (dtrain_base, the
# launcher's pure functions, dtrain_comm's torch-free parts). Shared helpers: *_support.cpp.
file(GLOB DTRAIN_UNIT_TEST_SOURCES CONFIGURE_DEPENDS
  ${CMAKE_CURRENT_SOURCE_DIR}/tests/unit/*_test.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/tests/unit/*_support.cpp)
dtrain_gtest(dtrain_unit_tests LABEL unit
  SOURCES ${DTRAIN_UNIT_TEST_SOURCES}
  LIBS dtrain_base dtrain_base_internal dtrain_comm dtrain_launcher dtrain_httplib)
include(tests/unit/store_tests.cmake OPTIONAL)
