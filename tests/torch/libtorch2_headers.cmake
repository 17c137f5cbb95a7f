# dtrain's public torch headers against the shape of libtorch 2.x where it differs from the 1.13
# the CI builds with: compiled against stand-ins (tests/torch/libtorch2_headers/) that declare
# only what the header reads, as 2.x declares it, so this runs without libtorch 2.x.
set(_libtorch2_check ${CMAKE_CXX_COMPILER} -std=c++17 -fsyntax-only
    -I${CMAKE_CURRENT_SOURCE_DIR}/tests/torch/libtorch2_headers
    -I${CMAKE_CURRENT_SOURCE_DIR}/runtime/include)
# The sampler overrides Sampler::reset/next, which take and return std::optional in 2.x.
add_test(NAME torch.sampler_header_with_libtorch2
         COMMAND ${_libtorch2_check}
                 ${CMAKE_CURRENT_SOURCE_DIR}/tests/torch/libtorch2_headers/sampler_header_check.cpp)
set_tests_properties(torch.sampler_header_with_libtorch2 PROPERTIES LABELS unit TIMEOUT 60)
