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
           COMMAND ${DTRAIN_PYTHON} ${_train_resnet_test} ${CMAKE_BINARY_DIR} train)
  add_test(NAME examples.train_resnet.amp
           COMMAND ${DTRAIN_PYTHON} ${_train_resnet_test} ${CMAKE_BINARY_DIR} amp)
  add_test(NAME examples.train_resnet.resume
           COMMAND ${DTRAIN_PYTHON} ${_train_resnet_test} ${CMAKE_BINARY_DIR} resume)
  add_test(NAME examples.train_resnet.usage
           COMMAND ${DTRAIN_PYTHON} ${_train_resnet_test} ${CMAKE_BINARY_DIR} usage)
  add_test(NAME examples.train_resnet.data
           COMMAND ${DTRAIN_PYTHON} ${_train_resnet_test} ${CMAKE_BINARY_DIR} data)
  add_test(NAME examples.train_resnet.watch
           COMMAND ${DTRAIN_PYTHON} ${_train_resnet_test} ${CMAKE_BINARY_DIR} watch)
  add_test(NAME examples.train_resnet.zero
           COMMAND ${DTRAIN_PYTHON} ${_train_resnet_test} ${CMAKE_BINARY_DIR} zero)
  add_test(NAME examples.train_resnet.zero3
           COMMAND ${DTRAIN_PYTHON} ${_train_resnet_test} ${CMAKE_BINARY_DIR} zero3)
  add_test(NAME examples.train_resnet.recompute
           COMMAND ${DTRAIN_PYTHON} ${_train_resnet_test} ${CMAKE_BINARY_DIR} recompute)
  set_tests_properties(examples.train_resnet.train examples.train_resnet.amp
                       examples.train_resnet.resume examples.train_resnet.usage examples.train_resnet.data
                       examples.train_resnet.watch examples.train_resnet.zero
                       examples.train_resnet.zero3 examples.train_resnet.recompute
                       PROPERTIES LABELS e2e TIMEOUT 300)
endif()

if(TARGET train_gpt)
  # One CTest test per part of tests/scripts/train_gpt_test.py, spelled out as train_resnet's.
  set(_train_gpt_test ${CMAKE_CURRENT_SOURCE_DIR}/tests/scripts/train_gpt_test.py)
  add_test(NAME examples.train_gpt.train
           COMMAND ${DTRAIN_PYTHON} ${_train_gpt_test} ${CMAKE_BINARY_DIR} train)
  add_test(NAME examples.train_gpt.zero
           COMMAND ${DTRAIN_PYTHON} ${_train_gpt_test} ${CMAKE_BINARY_DIR} zero)
  add_test(NAME examples.train_gpt.resume
           COMMAND ${DTRAIN_PYTHON} ${_train_gpt_test} ${CMAKE_BINARY_DIR} resume)
  add_test(NAME examples.train_gpt.interop
           COMMAND ${DTRAIN_PYTHON} ${_train_gpt_test} ${CMAKE_BINARY_DIR} interop)
  add_test(NAME examples.train_gpt.lora
           COMMAND ${DTRAIN_PYTHON} ${_train_gpt_test} ${CMAKE_BINARY_DIR} lora)
  add_test(NAME examples.train_gpt.peer
           COMMAND ${DTRAIN_PYTHON} ${_train_gpt_test} ${CMAKE_BINARY_DIR} peer)
  add_test(NAME examples.train_gpt.usage
           COMMAND ${DTRAIN_PYTHON} ${_train_gpt_test} ${CMAKE_BINARY_DIR} usage)
  add_test(NAME examples.train_gpt.node_loss
           COMMAND ${DTRAIN_PYTHON} ${_train_gpt_test} ${CMAKE_BINARY_DIR} node_loss)
  add_test(NAME examples.train_gpt.node_join
           COMMAND ${DTRAIN_PYTHON} ${_train_gpt_test} ${CMAKE_BINARY_DIR} node_join)
  add_test(NAME examples.train_gpt.node_join_zero
           COMMAND ${DTRAIN_PYTHON} ${_train_gpt_test} ${CMAKE_BINARY_DIR} node_join_zero)
  set_tests_properties(examples.train_gpt.train examples.train_gpt.zero
                       examples.train_gpt.resume examples.train_gpt.interop
                       examples.train_gpt.lora examples.train_gpt.peer examples.train_gpt.usage
                       examples.train_gpt.node_loss examples.train_gpt.node_join
                       examples.train_gpt.node_join_zero PROPERTIES LABELS e2e TIMEOUT 300)
  # Three launches on loopback, each a node with its store traffic and heartbeats: serial.
  set_tests_properties(examples.train_gpt.node_loss examples.train_gpt.node_join
                       examples.train_gpt.node_join_zero PROPERTIES RUN_SERIAL TRUE)
endif()

add_test(NAME scripts.plot_metrics
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tests/scripts/plot_metrics_test.sh
                 ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_BINARY_DIR} ${DTRAIN_PYTHON})
# It runs a short launch job (two test workers) for a real metrics file.
set_tests_properties(scripts.plot_metrics PROPERTIES LABELS integration TIMEOUT 90)

# docs/launch.md's table of torchrun's options: a row for every option of DTRAIN_PYTHON's torchrun,
# and launch accepts, warns about or refuses each spelling as its row says.
add_test(NAME launch.torchrun_flags
         COMMAND ${DTRAIN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/tests/scripts/torchrun_flags_test.py
                 ${CMAKE_BINARY_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(launch.torchrun_flags PROPERTIES LABELS integration TIMEOUT 120)

# The repository's own documents: no citation of a document outside the repository, every cited
# section and row of docs/design.md / docs/reliability.md exists, every test a row names too, every
# function, type or member a Note or a document names is defined in the tree; every guide's links,
# anchors and paths resolve, docs/launch.md has every option and exit code, and every
# troubleshooting entry's message still occurs in the sources and its test exists.
add_test(NAME docs.references
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tests/scripts/docs_references_test.sh
                 ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(docs.references PROPERTIES LABELS unit TIMEOUT 60)
# The check of names in docs.references fails on a small tree that cites undefined names.
add_test(NAME docs.references.self_test
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tests/scripts/docs_references_self_test.sh)
set_tests_properties(docs.references.self_test PROPERTIES LABELS unit TIMEOUT 60)

# scripts/gpu_check.sh on a fake GPU machine (a pip-style site-packages tree with a stand-in torch
# answered by a fake python, a fake nvcc; for real runs fake cmake, ctest and benchmarks): the paths
# it resolves, its one-line refusals, and its rows' time limits and budget.
add_test(NAME scripts.gpu_check_pip_layout
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tests/scripts/gpu_check_fake_test.sh
                 ${CMAKE_CURRENT_SOURCE_DIR} pip-layout)
add_test(NAME scripts.gpu_check_budget
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tests/scripts/gpu_check_fake_test.sh
                 ${CMAKE_CURRENT_SOURCE_DIR} budget)
set_tests_properties(scripts.gpu_check_pip_layout PROPERTIES LABELS unit TIMEOUT 90)
# Runs gpu_check.sh's whole budget logic over fake builds (~14 s): integration.
set_tests_properties(scripts.gpu_check_budget PROPERTIES LABELS integration TIMEOUT 90)

# dtrain's CMake against a fake pip libtorch (configure only): fmt's headers ahead of libtorch's
# bundled fmt (Note [Two fmts] in cmake/torch_fmt.cmake), C++20 for libtorch 2.14, the toolkit's
# nvcc handed to libtorch's package, no c10d Gloo peer against a libtorch with its own Gloo.
add_test(NAME cmake.pip_torch
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tests/scripts/cmake_pip_torch_test.sh
                 ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(cmake.pip_torch PROPERTIES LABELS unit TIMEOUT 180)

# The include graph keeps the layers of docs/design.md (Layout): no include runs up a layer or
# into another folder's internals outside the seams tests/scripts/layering_test.py lists, launch
# stays on dtrain_base, dtrain_base and dtrain_comm stay torch-free. The self test breaks each rule
# on a small tree.
add_test(NAME docs.layering
         COMMAND ${DTRAIN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/tests/scripts/layering_test.py
                 ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(docs.layering PROPERTIES LABELS unit TIMEOUT 60)
add_test(NAME docs.layering.self_test
         COMMAND ${DTRAIN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/tests/scripts/layering_test.py
                 --self-test)
set_tests_properties(docs.layering.self_test PROPERTIES LABELS unit TIMEOUT 60)

# The C/C++ sources are formatted as .clang-format says (clang-format 14) and keep to 100 columns
# (scripts/format.sh --check); the test fails where clang-format 14 is not installed. The self test
# plants a misformat and a long line in a small tree.
add_test(NAME docs.format
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tests/scripts/format_test.sh
                 ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(docs.format PROPERTIES LABELS unit TIMEOUT 60)
add_test(NAME docs.format.self_test
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tests/scripts/format_test.sh --self-test)
set_tests_properties(docs.format.self_test PROPERTIES LABELS unit TIMEOUT 60)

# The GPU check script itself, on every machine: --dry-run prints each step, and --check-build
# checks what it would build and run (targets, allreduce_bench flags, gpu-labelled tests) against
# this build, failing on any mismatch.
add_test(NAME scripts.gpu_check_dry_run
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/scripts/gpu_check.sh --dry-run
                 --check-build ${CMAKE_BINARY_DIR})
set_tests_properties(scripts.gpu_check_dry_run PROPERTIES LABELS unit TIMEOUT 60)
