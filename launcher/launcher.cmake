# `launch`: links dtrain_base only, so it starts on a node without CUDA libraries or libtorch.
# The launcher's logic lives in dtrain_launcher (a static library) so tests can link it.
add_library(dtrain_launcher STATIC
  launcher/version.cpp
)
target_include_directories(dtrain_launcher PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(dtrain_launcher PUBLIC dtrain_base cxxopts::cxxopts)
dtrain_warnings(dtrain_launcher)

add_executable(launch launcher/main.cpp)
target_link_libraries(launch PRIVATE dtrain_launcher)
dtrain_warnings(launch)
list(APPEND DTRAIN_INSTALL_TARGETS launch)
