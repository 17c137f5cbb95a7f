# The store's tests beyond the shared unit executable: internal headers for the wire and hostile
# client tests, and the timing-bound tests in their own executable, run serially (RUN_SERIAL) so
# a loaded machine does not make their time bounds flaky.
target_link_libraries(dtrain_unit_tests PRIVATE dtrain_base_internal)

dtrain_gtest(dtrain_store_timing_tests LABEL unit SERIAL
  SOURCES tests/unit/tcp_store_timing.cpp tests/unit/store_test_support.cpp
  LIBS dtrain_base_internal)
