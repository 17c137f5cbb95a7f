# TensorBoard event files read back by an independent reader (tests/scripts/tensorboard_events.py:
# google.protobuf, which DTRAIN_PYTHON has with TensorBoard, and its own CRC32C), and the Grafana
# dashboard checked against a real scrape.
set(_tensorboard_test ${CMAKE_CURRENT_SOURCE_DIR}/tests/scripts/tensorboard_test.py)
add_test(NAME tensorboard.launch
         COMMAND ${DTRAIN_PYTHON} ${_tensorboard_test} ${CMAKE_BINARY_DIR} launch)
add_test(NAME tensorboard.kill
         COMMAND ${DTRAIN_PYTHON} ${_tensorboard_test} ${CMAKE_BINARY_DIR} kill)
add_test(NAME tensorboard.nolocks
         COMMAND ${DTRAIN_PYTHON} ${_tensorboard_test} ${CMAKE_BINARY_DIR} nolocks)
set_tests_properties(tensorboard.launch tensorboard.kill tensorboard.nolocks
                     PROPERTIES LABELS integration TIMEOUT 120)
if(TARGET train_linear AND TARGET train_resnet)
  add_test(NAME tensorboard.trainer
           COMMAND ${DTRAIN_PYTHON} ${_tensorboard_test} ${CMAKE_BINARY_DIR} trainer)
  # scripts/demo.sh at a small size (2 epochs of 1,024 images, a rank killed halfway).
  add_test(NAME tensorboard.demo
           COMMAND ${DTRAIN_PYTHON} ${_tensorboard_test} ${CMAKE_BINARY_DIR} demo)
  set_tests_properties(tensorboard.trainer tensorboard.demo PROPERTIES LABELS e2e TIMEOUT 300)
endif()

add_test(NAME scripts.grafana_dashboard
         COMMAND ${DTRAIN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/tests/scripts/grafana_dashboard_test.py
                 ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_BINARY_DIR})
set_tests_properties(scripts.grafana_dashboard PROPERTIES LABELS integration TIMEOUT 90)
