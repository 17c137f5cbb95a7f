# Run by ctest before it runs anything (a TEST_INCLUDE_FILES script of dtrain_gtest(... BY_SUITE)):
# one CTest test per gtest suite of `exe`, running `--gtest_filter=<suite>.*`, named
# <prefix><suite>, with `props`; the suites `serial` names ("A.*:B.*") also RUN_SERIAL, and those
# `integration` names get the label integration. A suite passes when none of its tests failed;
# the ones it skipped are named in its output.
if(NOT EXISTS "${exe}")
  add_test("${prefix}NOT_BUILT" "${exe}")
  return()
endif()
execute_process(COMMAND "${exe}" --gtest_list_tests OUTPUT_VARIABLE listed
                RESULT_VARIABLE rc TIMEOUT 60)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${exe} --gtest_list_tests failed (${rc}): ${listed}")
endif()
string(REPLACE ":" ";" serialSuites "${serial}")
string(REPLACE ":" ";" integrationSuites "${integration}")
string(REPLACE "\n" ";" lines "${listed}")
foreach(line IN LISTS lines)
  # A suite's line is "Suite." or "Prefix/Suite.  # TypeParam = ..."; its tests are indented.
  if(NOT line MATCHES "^([A-Za-z0-9_/]+)\\.( |$)")
    continue()
  endif()
  set(suite "${CMAKE_MATCH_1}")
  add_test("${prefix}${suite}" "${exe}" "--gtest_filter=${suite}.*")
  set(suiteProps "${props}")
  list(FIND integrationSuites "${suite}.*" integrationAt)
  if(integrationAt GREATER -1)  # the label after LABELS becomes integration
    list(FIND suiteProps LABELS labelsAt)
    math(EXPR labelAt "${labelsAt} + 1")
    list(REMOVE_AT suiteProps ${labelAt})
    list(INSERT suiteProps ${labelAt} integration)
  endif()
  set_tests_properties("${prefix}${suite}" PROPERTIES ${suiteProps})
  list(FIND serialSuites "${suite}.*" serialAt)
  if(serialAt GREATER -1)
    set_tests_properties("${prefix}${suite}" PROPERTIES RUN_SERIAL TRUE)
  endif()
endforeach()
