# Watching a multi-node job on the simulated cluster (label e2e; SKIP without root or netns).
if(TARGET dtrain_e2e_cluster)
  dtrain_gtest(monitor_e2e_tests LABEL e2e SERIAL TIMEOUT 150
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/monitor_e2e_test.cpp ${CMAKE_CURRENT_LIST_DIR}/e2e_support.cpp
    LIBS dtrain_e2e_cluster dtrain_launcher_harness dtrain_launcher dtrain_httplib
         nlohmann_json::nlohmann_json)
  add_dependencies(monitor_e2e_tests launch dtrain_test_worker)
  if(TARGET comm_worker)
    add_dependencies(monitor_e2e_tests comm_worker)
  endif()
endif()
