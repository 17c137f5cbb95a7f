# Torch-free unit tests: one executable for dtrain_base, the launcher's pure functions and
# dtrain_comm's torch-free parts. Add sources here.
dtrain_gtest(dtrain_unit_tests LABEL unit
  SOURCES
    tests/unit/fault_test.cpp
    tests/unit/store_conformance_test.cpp
    tests/unit/store_factories.cpp
  LIBS dtrain_base dtrain_launcher)
