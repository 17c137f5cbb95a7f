# TensorBoard event files read back by an independent reader (tests/scripts/tensorboard_events.py:
# python3-protobuf, python3-crc32c), and the Grafana dashboard checked against a real scrape.
# Debian's /usr/bin/python3: that is where python3-protobuf and python3-crc32c are.
set(_tensorboard_test ${CMAKE_CURRENT_SOURCE_DIR}/tests/scripts/tensorboard_test.py)
add_test(NAME tensorboard.launch COMMAND /usr/bin/python3 ${_tensorboard_test} ${CMAKE_BINARY_DIR} launch)
add_test(NAME tensorboard.kill COMMAND /usr/bin/python3 ${_tensorboard_test} ${CMAKE_BINARY_DIR} kill)
add_test(NAME tensorboard.nolocks
         COMMAND /usr/bin/python3 ${_tensorboard_test} ${CMAKE_BINARY_DIR} nolocks)
set_tests_properties(tensorboard.launch tensorboard.kill tensorboard.nolocks
                     PROPERTIES LABELS integration TIMEOUT 120)
if(TARGET train_linear AND TARGET train_resnet)
  add_test(NAME tensorboard.trainer
           COMMAND /usr/bin/python3 ${_tensorboard_test} ${CMAKE_BINARY_DIR} trainer)
  # scripts/demo.sh at a small size (2 epochs of 1,024 images, a rank killed halfway).
  add_test(NAME tensorboard.demo
           COMMAND /usr/bin/python3 ${_tensorboard_test} ${CMAKE_BINARY_DIR} demo)
  set_tests_properties(tensorboard.trainer tensorboard.demo PROPERTIES LABELS e2e TIMEOUT 300)
endif()

add_test(NAME scripts.grafana_dashboard
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/tests/scripts/grafana_dashboard_test.py
                 ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_BINARY_DIR})
set_tests_properties(scripts.grafana_dashboard PROPERTIES LABELS integration TIMEOUT 90)
