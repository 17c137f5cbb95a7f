# Torch tests in one executable (ranks as threads): every tests/torch/*_test.cpp and
# tests/torch/zero/*_test.cpp, sharing the torch layer's precompiled header. Real-process tests
# live in tests/integration.
file(GLOB DTRAIN_TORCH_TEST_SOURCES CONFIGURE_DEPENDS
  ${CMAKE_CURRENT_SOURCE_DIR}/tests/torch/*_test.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/tests/torch/zero/*_test.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/tests/torch/*_support.cpp)
if(DTRAIN_TORCH_TEST_SOURCES)
  # CheckpointerTimeouts waits its saves' timeouts out (~10 s): integration.
  dtrain_gtest(dtrain_torch_tests LABEL unit TORCH BY_SUITE TIMEOUT 300
    SERIAL_TESTS "DdpOverlap.*"
    INTEGRATION_SUITES "CheckpointerTimeouts.*"
    SOURCES ${DTRAIN_TORCH_TEST_SOURCES}
    LIBS dtrain dtrain_base_internal)
  # checkpoint_zero3_test runs the `checkpoint` tool on the directories it writes.
  add_dependencies(dtrain_torch_tests checkpoint)
  # Note [One Gloo per process]: with a libtorch that carries its own Gloo forced ahead of the
  # system's (LD_PRELOAD), the Gloo backend is refused with the message that names both, and
  # nothing crashes.
  set(_torch_cpu "${TORCH_INSTALL_PREFIX}/lib/libtorch_cpu.so")
  if(DTRAIN_HAVE_GLOO AND EXISTS "${_torch_cpu}")
    execute_process(COMMAND nm -D --defined-only "${_torch_cpu}" OUTPUT_VARIABLE _torch_symbols
                    ERROR_QUIET)
    if(_torch_symbols MATCHES "_ZN4gloo7Context8nextSlotEi")
      add_test(NAME gloo.another_gloo_first_is_refused
               COMMAND ${CMAKE_COMMAND} -E env "LD_PRELOAD=${_torch_cpu}"
                       $<TARGET_FILE:dtrain_torch_tests>
                       --gtest_filter=ProcessGroupCollectives.GlooRunsBesideTheGlooInsideLibtorch)
      set_tests_properties(gloo.another_gloo_first_is_refused PROPERTIES LABELS unit TIMEOUT 120
        PASS_REGULAR_EXPRESSION "gloo:: symbols of this process resolve to [^ ]*libtorch_cpu.so")
    endif()
  endif()
endif()
