# The simulated cluster of the scale test and benchmark (launcher_sim.h): many manual `launch`
# agents on loopback, each with one test worker. Shared by tests/launcher/launcher.cmake and
# benchmarks/launch/launch.cmake.
include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/../worker/worker.cmake)
add_library(dtrain_launch_sim STATIC ${CMAKE_CURRENT_LIST_DIR}/launcher_sim.cpp)
target_include_directories(dtrain_launch_sim PUBLIC ${CMAKE_CURRENT_LIST_DIR}
                                                    ${CMAKE_SOURCE_DIR}/testing)
target_link_libraries(dtrain_launch_sim PUBLIC fmt::fmt)
dtrain_warnings(dtrain_launch_sim)
