# End-to-end tests of multi-node launch (label e2e): real ssh into network namespaces on this
# machine (scripts/netns-cluster.sh, tests/e2e/cluster.*). Each test brings up a cluster of its
# own under a unique name, so they run in parallel; the fault tests measure time bounds and run
# serially. Without root or network namespaces every test reports SKIP with the reason.
add_library(dtrain_e2e_cluster STATIC ${CMAKE_CURRENT_LIST_DIR}/cluster.cpp)
target_include_directories(dtrain_e2e_cluster PUBLIC ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(dtrain_e2e_cluster PUBLIC dtrain_test_support)
dtrain_warnings(dtrain_e2e_cluster)

dtrain_gtest(multinode_e2e_tests LABEL e2e TIMEOUT 120
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/multinode_test.cpp ${CMAKE_CURRENT_LIST_DIR}/e2e_support.cpp
  LIBS dtrain_e2e_cluster dtrain_launcher_harness)
dtrain_gtest(multinode_fault_e2e_tests LABEL e2e SERIAL TIMEOUT 120
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/multinode_fault_test.cpp ${CMAKE_CURRENT_LIST_DIR}/e2e_support.cpp
  LIBS dtrain_e2e_cluster dtrain_launcher_harness)
foreach(t multinode_e2e_tests multinode_fault_e2e_tests)
  add_dependencies(${t} launch dtrain_test_worker)
  if(TARGET comm_worker)
    add_dependencies(${t} comm_worker)
  endif()
  if(TARGET train_linear)
    add_dependencies(${t} train_linear)
  endif()
endforeach()
