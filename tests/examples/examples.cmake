# Tests of the sample trainers' helpers (examples/models, examples/data): one torch executable.
# The trainers themselves run under launch in tests/scripts.
if(TARGET dtrain_examples)
  file(GLOB DTRAIN_EXAMPLES_TEST_SOURCES CONFIGURE_DEPENDS
    ${CMAKE_CURRENT_SOURCE_DIR}/tests/examples/*_test.cpp)
  # ResNet builds every torchvision architecture (ResNet-152 included), GptInterop starts Python:
  # integration.
  dtrain_gtest(dtrain_examples_tests LABEL unit TORCH BY_SUITE TIMEOUT 300
    INTEGRATION_SUITES "ResNet.*:GptInterop.*"
    SOURCES ${DTRAIN_EXAMPLES_TEST_SOURCES}
    LIBS dtrain_examples)
endif()
