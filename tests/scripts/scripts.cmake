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

# The repository's own design documents: no citation of a document outside the repository, every
# cited section and row of docs/design.md / docs/reliability.md exists, every test a row names too.
add_test(NAME docs.references
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tests/scripts/docs_references_test.sh
                 ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(docs.references PROPERTIES LABELS unit TIMEOUT 60)
