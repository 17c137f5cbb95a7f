# The NCCL backend (labels gpu and unit): built whenever NCCL and CUDA are found, the GPU tests
# skipped at run time without a GPU. scripts/gpu_check.sh builds and runs them on a GPU machine.
if(DTRAIN_HAVE_NCCL)
  dtrain_gtest(dtrain_gpu_tests LABEL gpu SERIAL TIMEOUT 180
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/nccl_gpu_test.cpp
    LIBS dtrain_comm dtrain_base_internal CUDA::cudart)
  target_include_directories(dtrain_gpu_tests PRIVATE ${CMAKE_SOURCE_DIR}/runtime/comm)
  # What of the NCCL backend needs no GPU (device guard, dtype/op mapping): label unit, runs here.
  dtrain_gtest(dtrain_nccl_build_tests LABEL unit
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/nccl_build_test.cpp
    LIBS dtrain_comm NCCL::nccl CUDA::cudart)
  target_include_directories(dtrain_nccl_build_tests PRIVATE
    ${CMAKE_SOURCE_DIR}/runtime/comm ${CMAKE_SOURCE_DIR}/runtime/comm/nccl)
endif()

# The NCCL compat header refuses an NCCL older than the minimum and accepts the minimum: compiled
# against two stand-in nccl.h files holding only what it reads, so this runs without NCCL.
foreach(_minor 13 14)
  file(WRITE ${CMAKE_BINARY_DIR}/fake_nccl/2.${_minor}/nccl.h
       "#define NCCL_MAJOR 2\n#define NCCL_MINOR ${_minor}\n#define NCCL_PATCH 0\n"
       "#define NCCL_VERSION_CODE 2${_minor}00\n"
       "typedef struct ncclComm* ncclComm_t;\nconst char* ncclGetLastError(ncclComm_t comm);\n")
endforeach()
set(_compat_check ${CMAKE_CXX_COMPILER} -std=c++17 -fsyntax-only -x c++
    ${CMAKE_SOURCE_DIR}/runtime/comm/nccl/nccl_compat.h)
add_test(NAME nccl.compat_header_with_nccl_2.13
         COMMAND ${_compat_check} -I${CMAKE_BINARY_DIR}/fake_nccl/2.13)
add_test(NAME nccl.compat_header_with_nccl_2.14
         COMMAND ${_compat_check} -I${CMAKE_BINARY_DIR}/fake_nccl/2.14)
set_tests_properties(nccl.compat_header_with_nccl_2.13 nccl.compat_header_with_nccl_2.14
                     PROPERTIES LABELS unit TIMEOUT 60)
set_tests_properties(nccl.compat_header_with_nccl_2.13 PROPERTIES
                     PASS_REGULAR_EXPRESSION "dtrain needs NCCL >= 2.14")
