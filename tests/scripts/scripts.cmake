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

if(TARGET train_resnet)
  # One CTest test per part of tests/scripts/train_resnet_test.py, so they run in parallel; spelled
  # out, not a loop, because docs/reliability.md cites them and docs.references looks the names up.
  set(_train_resnet_test ${CMAKE_CURRENT_SOURCE_DIR}/tests/scripts/train_resnet_test.py)
  add_test(NAME examples.train_resnet.train
           COMMAND /usr/bin/python3 ${_train_resnet_test} ${CMAKE_BINARY_DIR} train)
  add_test(NAME examples.train_resnet.amp
           COMMAND /usr/bin/python3 ${_train_resnet_test} ${CMAKE_BINARY_DIR} amp)
  add_test(NAME examples.train_resnet.resume
           COMMAND /usr/bin/python3 ${_train_resnet_test} ${CMAKE_BINARY_DIR} resume)
  add_test(NAME examples.train_resnet.usage
           COMMAND /usr/bin/python3 ${_train_resnet_test} ${CMAKE_BINARY_DIR} usage)
  add_test(NAME examples.train_resnet.data
           COMMAND /usr/bin/python3 ${_train_resnet_test} ${CMAKE_BINARY_DIR} data)
  add_test(NAME examples.train_resnet.watch
           COMMAND /usr/bin/python3 ${_train_resnet_test} ${CMAKE_BINARY_DIR} watch)
  add_test(NAME examples.train_resnet.recompute
           COMMAND /usr/bin/python3 ${_train_resnet_test} ${CMAKE_BINARY_DIR} recompute)
  set_tests_properties(examples.train_resnet.train examples.train_resnet.amp
                       examples.train_resnet.resume examples.train_resnet.usage examples.train_resnet.data
                       examples.train_resnet.watch examples.train_resnet.recompute
                       PROPERTIES LABELS e2e TIMEOUT 300)
endif()

add_test(NAME scripts.plot_metrics
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tests/scripts/plot_metrics_test.sh
                 ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_BINARY_DIR})
# It runs a short launch job (two test workers) for a real metrics file.
set_tests_properties(scripts.plot_metrics PROPERTIES LABELS integration TIMEOUT 90)

# The repository's own design documents: no citation of a document outside the repository, every
# cited section and row of docs/design.md / docs/reliability.md exists, every test a row names too,
# every function, type or member a Note or a document names is defined in the tree.
add_test(NAME docs.references
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tests/scripts/docs_references_test.sh
                 ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(docs.references PROPERTIES LABELS unit TIMEOUT 60)
# The check of names in docs.references fails on a small tree that cites undefined names.
add_test(NAME docs.references.self_test
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tests/scripts/docs_references_self_test.sh)
set_tests_properties(docs.references.self_test PROPERTIES LABELS unit TIMEOUT 60)
