# Watching a running job (launcher/monitor), with real processes under launch: the metrics
# endpoint and file, stall reports, the memory warning in a small cgroup, the status line and
# launch's own CPU cost. Timing-bound and CPU-measuring: serial.
if(TARGET dtrain_launcher_harness AND TARGET comm_worker)
  dtrain_gtest(launcher_monitor_tests LABEL integration SERIAL TIMEOUT 180
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/launcher_monitor_test.cpp
            ${CMAKE_CURRENT_LIST_DIR}/launcher_monitor_nodes_test.cpp
    LIBS dtrain_launcher_harness dtrain_launcher dtrain_httplib nlohmann_json::nlohmann_json)
  add_dependencies(launcher_monitor_tests launch dtrain_test_worker comm_worker)
endif()
