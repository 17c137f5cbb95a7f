# Tests of the scripts and of the installed package.
add_test(NAME install.consumer
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tests/scripts/install_test.sh
                 ${CMAKE_BINARY_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(install.consumer PROPERTIES LABELS integration TIMEOUT 300)

if(TARGET train_linear)
  add_test(NAME examples.train_linear
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tests/scripts/train_linear_test.sh ${CMAKE_BINARY_DIR})
  set_tests_properties(examples.train_linear PROPERTIES LABELS e2e TIMEOUT 120)
endif()
