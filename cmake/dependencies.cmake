# Finds dtrain's dependencies (docs/design.md#libraries) and decides the feature switches:
# DTRAIN_HAVE_{TORCH,TORCH_CUDA,GLOO,NCCL} and their 0/1 twins for dtrain/config.h.
# Header-only and small dependencies may come from a folder on CMAKE_PREFIX_PATH (the GPU check
# unpacks Debian packages there).

find_package(Threads REQUIRED)
find_package(fmt REQUIRED)
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
find_package(nlohmann_json REQUIRED)
# cxxopts reads the sample trainers' and allreduce_bench's options: launch parses its own command
# line (see Note [Option parsing] in launcher/config/launch_args.cpp for why).
if(DTRAIN_WITH_BENCHMARKS OR DTRAIN_WITH_EXAMPLES)
  find_package(cxxopts REQUIRED)
endif()

# dtrain_plain_dependency(<name> <VAR> <header> <package> <library names...>): a library Debian
# ships without a CMake package, found by its header and library (cache variables <VAR>_INCLUDE_DIR
# and <VAR>_LIBRARY), as the INTERFACE target dtrain_<name>; missing, a FATAL_ERROR naming the
# Debian package that has it.
function(dtrain_plain_dependency name var header package)
  find_path(${var}_INCLUDE_DIR ${header})
  find_library(${var}_LIBRARY NAMES ${ARGN})
  if(NOT ${var}_INCLUDE_DIR OR NOT ${var}_LIBRARY)
    message(FATAL_ERROR "${name} not found. HINT: scripts/setup.sh installs ${package}")
  endif()
  add_library(dtrain_${name} INTERFACE)
  target_include_directories(dtrain_${name} SYSTEM INTERFACE "${${var}_INCLUDE_DIR}")
  target_link_libraries(dtrain_${name} INTERFACE "${${var}_LIBRARY}")
endfunction()

# libuv (the store's event loop; no CMake package in Debian 12).
dtrain_plain_dependency(libuv LIBUV uv.h libuv1-dev uv libuv.so.1)
# xxHash (XXH3 checksums).
dtrain_plain_dependency(xxhash XXHASH xxhash.h libxxhash-dev xxhash libxxhash.so.0)
# ISA-L (CRC32C of TensorBoard's event records: crc32_iscsi).
dtrain_plain_dependency(isal ISAL isa-l/crc.h libisal-dev isal libisal.so.2)

# cpp-httplib (the tests' HTTP client; the metrics endpoint is served by libuv). Debian ships it
# as a compiled library whose pkg-config file lists the defines it was built with (OpenSSL, zlib,
# Brotli); they change its classes' layout, so every user must compile with the same ones.
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(CPPHTTPLIB QUIET cpp-httplib)
endif()
find_path(HTTPLIB_INCLUDE_DIR httplib.h HINTS ${CPPHTTPLIB_INCLUDE_DIRS})
find_library(HTTPLIB_LIBRARY NAMES cpp-httplib libcpp-httplib.so.0.11 HINTS ${CPPHTTPLIB_LIBRARY_DIRS})
if(NOT HTTPLIB_INCLUDE_DIR OR NOT HTTPLIB_LIBRARY)
  message(FATAL_ERROR "cpp-httplib not found. HINT: scripts/setup.sh installs libcpp-httplib-dev")
endif()
add_library(dtrain_httplib INTERFACE)
target_include_directories(dtrain_httplib SYSTEM INTERFACE "${HTTPLIB_INCLUDE_DIR}")
target_link_libraries(dtrain_httplib INTERFACE "${HTTPLIB_LIBRARY}")
if(CPPHTTPLIB_FOUND)
  target_compile_options(dtrain_httplib INTERFACE ${CPPHTTPLIB_CFLAGS_OTHER})
else()
  # Without pkg-config (unpacked Debian packages): Debian's build flags.
  target_compile_definitions(dtrain_httplib INTERFACE
    CPPHTTPLIB_OPENSSL_SUPPORT CPPHTTPLIB_ZLIB_SUPPORT CPPHTTPLIB_BROTLI_SUPPORT)
endif()

# Gloo (CPU collectives).
set(DTRAIN_HAVE_GLOO OFF)
if(DTRAIN_WITH_GLOO)
  find_package(Gloo QUIET)
  if(Gloo_FOUND AND TARGET gloo)
    set(DTRAIN_HAVE_GLOO ON)
  else()
    message(STATUS "Gloo not found: the Gloo backend is not built (HINT: apt-get install libgloo-dev)")
  endif()
endif()

# NCCL + CUDA runtime (GPU collectives). Compiles and links without a GPU.
set(DTRAIN_HAVE_NCCL OFF)
if(DTRAIN_WITH_NCCL)
  if(NOT CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT} AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  # Unless told otherwise, the NCCL of the project's Python environment (scripts/setup.sh): the pip
  # nvidia-nccl wheel PyTorch 2.x loads, not whatever NCCL a CUDA toolkit carries.
  if(NOT NCCL_ROOT AND NOT DEFINED ENV{NCCL_ROOT})
    file(GLOB _venv_nccl "${CMAKE_SOURCE_DIR}/.venv/lib/python3*/site-packages/nvidia/nccl")
    if(_venv_nccl)
      list(GET _venv_nccl 0 NCCL_ROOT)
    endif()
  endif()
  # The oldest NCCL the backend builds against (runtime/comm/nccl/nccl_compat.h says why).
  set(DTRAIN_NCCL_MINIMUM_VERSION 2.14)
  find_package(NCCL ${DTRAIN_NCCL_MINIMUM_VERSION} QUIET)
  if(CUDAToolkit_FOUND AND NCCL_FOUND)
    set(DTRAIN_HAVE_NCCL ON)
    message(STATUS "NCCL ${NCCL_VERSION} (${NCCL_LIBRARY}), CUDA ${CUDAToolkit_VERSION}")
  elseif(NCCL_VERSION AND NCCL_VERSION VERSION_LESS DTRAIN_NCCL_MINIMUM_VERSION)
    message(STATUS "NCCL ${NCCL_VERSION} in ${NCCL_INCLUDE_DIR} is older than "
                   "${DTRAIN_NCCL_MINIMUM_VERSION}: the NCCL backend is not built "
                   "(HINT: point NCCL_ROOT at NCCL >= ${DTRAIN_NCCL_MINIMUM_VERSION})")
  else()
    message(STATUS "NCCL or CUDA not found: the NCCL backend is not built "
                   "(HINT: set NCCL_ROOT / CUDAToolkit_ROOT)")
  endif()
endif()

# libtorch (the dtrain library, examples, torch tests). Not needed by `launch`. The versions
# dtrain supports, and why: docs/design.md#libraries.
set(DTRAIN_HAVE_TORCH OFF)
set(DTRAIN_HAVE_TORCH_CUDA OFF)
if(DTRAIN_WITH_TORCH)
  # Which libtorch: by default the pip torch of the project's Python environment (scripts/setup.sh
  # makes .venv: torch 2.14.1, its CUDA 13 build). DTRAIN_LIBTORCH names a libtorch root (the folder
  # with lib/ and share/cmake/Torch: pip's site-packages/torch, or an unpacked libtorch zip); empty,
  # the usual CMAKE_PREFIX_PATH / Torch_DIR search. The root goes first on CMAKE_PREFIX_PATH, not
  # only into Torch_DIR: TorchConfig looks its libraries up with find_library, which would otherwise
  # take a system libtorch's libc10.so (Debian's) ahead of the one beside its headers.
  file(GLOB _venv_torch "${CMAKE_SOURCE_DIR}/.venv/lib/python3*/site-packages/torch/share/cmake/Torch")
  set(_default_libtorch "")
  if(_venv_torch AND NOT Torch_DIR AND NOT DEFINED ENV{Torch_DIR})
    list(GET _venv_torch 0 _default_libtorch)
    get_filename_component(_default_libtorch "${_default_libtorch}/../../.." ABSOLUTE)
  endif()
  set(DTRAIN_LIBTORCH "${_default_libtorch}" CACHE PATH
      "libtorch root to build against (default: the project's .venv torch; empty: search)")
  if(DTRAIN_LIBTORCH)
    if(NOT EXISTS "${DTRAIN_LIBTORCH}/share/cmake/Torch/TorchConfig.cmake")
      message(FATAL_ERROR "DTRAIN_LIBTORCH=${DTRAIN_LIBTORCH} has no share/cmake/Torch/TorchConfig.cmake "
                          "(HINT: name the folder of a libtorch: pip's site-packages/torch, or an "
                          "unpacked libtorch; run scripts/setup.sh for the project's .venv)")
    endif()
    list(PREPEND CMAKE_PREFIX_PATH "${DTRAIN_LIBTORCH}")
    # A CUDA wheel's libtorch needs NVRTC, which the wheels carry (nvidia/cu*/lib) and a CUDA toolkit
    # may not: take the wheel's unless told otherwise.
    if(NOT CUDA_nvrtc_LIBRARY)
      file(GLOB _wheel_nvrtc "${DTRAIN_LIBTORCH}/../nvidia/cu*/lib/libnvrtc.so.[0-9]*")
      if(_wheel_nvrtc)
        list(GET _wheel_nvrtc 0 _wheel_nvrtc)
        set(CUDA_nvrtc_LIBRARY "${_wheel_nvrtc}" CACHE FILEPATH "NVRTC of the libtorch wheel")
      endif()
    endif()
  endif()
  # A CUDA libtorch 2.x's package enables the CUDA language, which needs nvcc, and refuses an nvcc
  # whose version is not its toolkit's: hand it the toolkit found above, unless told otherwise
  # (-DCMAKE_CUDA_COMPILER, CUDACXX, -DCUDA_TOOLKIT_ROOT_DIR). A CPU libtorch ignores both.
  if(CUDAToolkit_FOUND AND CUDAToolkit_NVCC_EXECUTABLE)
    if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
      set(CMAKE_CUDA_COMPILER "${CUDAToolkit_NVCC_EXECUTABLE}")
    endif()
    if(NOT CUDA_TOOLKIT_ROOT_DIR)
      get_filename_component(CUDA_TOOLKIT_ROOT_DIR "${CUDAToolkit_BIN_DIR}" DIRECTORY)
    endif()
  endif()
  find_package(Torch QUIET)
  if(Torch_FOUND OR TORCH_FOUND)
    set(DTRAIN_HAVE_TORCH ON)
    # A CUDA build of libtorch brings c10_cuda.
    foreach(_lib IN LISTS TORCH_LIBRARIES)
      if(_lib MATCHES "c10_cuda")
        set(DTRAIN_HAVE_TORCH_CUDA ON)
      endif()
    endforeach()
    message(STATUS "libtorch ${Torch_VERSION} (cuda=${DTRAIN_HAVE_TORCH_CUDA})")
    # The versions built and tested (docs/building.md, "Which libtorch"): 2.14 (CI's default), 2.13
    # (CI's CPU-only configuration), 2.11 (the GPU machine's, scripts/gpu_check.sh).
    if(Torch_VERSION VERSION_LESS 2.11 OR Torch_VERSION VERSION_GREATER_EQUAL 2.15)
      message(FATAL_ERROR "libtorch ${Torch_VERSION} (${TORCH_INSTALL_PREFIX}) is not a version "
                          "dtrain supports (2.11 - 2.14; docs/building.md, \"Which libtorch\"). "
                          "HINT: pip install torch in that range and pass -DDTRAIN_LIBTORCH=<its "
                          "site-packages/torch>, or run scripts/setup.sh for the project's .venv")
    endif()
    # Libraries from pip wheels (this libtorch, the NCCL beside it) belong to no Debian package and
    # sit in no folder the loader searches: the installed binaries that need them name their folders
    # in their RUNPATH (cmake/install.cmake), and packaging leaves them out of the dependencies
    # (cmake/package.cmake). docs/building.md says what a node then needs.
    set(DTRAIN_WHEEL_LIBRARY_DIRS "")
    if(DTRAIN_LIBTORCH)
      list(APPEND DTRAIN_WHEEL_LIBRARY_DIRS "${TORCH_INSTALL_PREFIX}/lib")
      get_filename_component(_wheel_site "${DTRAIN_LIBTORCH}" DIRECTORY)
      if(DTRAIN_HAVE_NCCL AND NCCL_LIBRARY MATCHES "^${_wheel_site}/")
        get_filename_component(_nccl_dir "${NCCL_LIBRARY}" DIRECTORY)
        list(APPEND DTRAIN_WHEEL_LIBRARY_DIRS "${_nccl_dir}")
      endif()
    endif()
    # One NCCL per process: a pip libtorch loads the nvidia-nccl wheel its metadata pins; the NCCL
    # backend must be built against that version, not another one a CUDA toolkit carries.
    get_filename_component(_torch_site "${TORCH_INSTALL_PREFIX}" DIRECTORY)
    file(GLOB _torch_metadata "${_torch_site}/torch-*.dist-info/METADATA")
    if(DTRAIN_HAVE_NCCL AND _torch_metadata)
      list(GET _torch_metadata 0 _torch_metadata)
      file(STRINGS "${_torch_metadata}" _torch_nccl REGEX "^Requires-Dist: nvidia-nccl-cu[0-9]+==")
      if(_torch_nccl MATCHES "==([0-9]+\\.[0-9]+\\.[0-9]+)" AND
         NOT CMAKE_MATCH_1 VERSION_EQUAL NCCL_VERSION)
        message(FATAL_ERROR "libtorch ${Torch_VERSION} (${TORCH_INSTALL_PREFIX}) loads NCCL "
                            "${CMAKE_MATCH_1} and the NCCL found is ${NCCL_VERSION} "
                            "(${NCCL_INCLUDE_DIR}): a process would hold both. HINT: point NCCL_ROOT "
                            "at the nvidia-nccl wheel beside torch (site-packages/nvidia/nccl), or "
                            "-DDTRAIN_WITH_NCCL=OFF")
      endif()
    endif()
    # libtorch 2.13's headers need C++20 and 2.14's refuse anything older (#error); the whole build
    # then uses it, so that dtrain's libraries and their users agree on one standard.
    if(Torch_VERSION VERSION_GREATER_EQUAL 2.13 AND CMAKE_CXX_STANDARD LESS 20)
      set(CMAKE_CXX_STANDARD 20)
      message(STATUS "libtorch ${Torch_VERSION} needs C++20: building as C++20")
    endif()
    include(${CMAKE_CURRENT_LIST_DIR}/torch_fmt.cmake)
  else()
    message(STATUS "libtorch not found: only launch and the torch-free libraries are built "
                   "(HINT: run scripts/setup.sh for the project's .venv, or -DDTRAIN_LIBTORCH=<a libtorch root>)")
  endif()
endif()

foreach(_feature GLOO NCCL TORCH TORCH_CUDA)
  if(DTRAIN_HAVE_${_feature})
    set(DTRAIN_WITH_${_feature}_01 1)
  else()
    set(DTRAIN_WITH_${_feature}_01 0)
  endif()
endforeach()
