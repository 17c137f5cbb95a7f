# Included by dependencies.cmake once libtorch is found: every target of this build reads the
# headers of the fmt it links, not those libtorch bundles. See Note [Two fmts].
#
# Note [Two fmts]
# pip's libtorch ships fmt's headers in its include directory (torch/include/fmt: fmt 11 and later
# in 2.x) while dtrain links the fmt package found by dependencies.cmake (Debian's libfmt 9). A file
# that sees both directories must read the headers of the fmt it links: compiled against one fmt
# and linked against the other, it fails to link (symbols of fmt::v12 that libfmt 9 lacks) or,
# worse, links against copies libtorch happens to export. Which one a file reads is decided by the
# order of its -isystem directories, which CMake takes from the target's own include directories
# first, then from what it links, in link order. Before this, fmt's directory came first only
# because every link list named fmt (through dtrain_base) before torch. So when libtorch bundles an
# fmt of another version, the fmt package's include directory becomes an include directory of every
# target defined after this point, ahead of anything linked, and this is checked at configure time
# by compiling against libtorch the way every target does. An fmt in the compiler's own search path
# (Debian's, in /usr/include) is searched after every -isystem directory whatever the order, so it is
# reached through a folder of the build holding only a link to its fmt/ folder, which can come first.
# A program that links dtrain's installed package with such a libtorch needs the same order.

set(_fmt_number "")
if(fmt_VERSION MATCHES "^([0-9]+)\\.([0-9]+)\\.([0-9]+)")
  math(EXPR _fmt_number "${CMAKE_MATCH_1} * 10000 + ${CMAKE_MATCH_2} * 100 + ${CMAKE_MATCH_3}")
endif()
# fmt 11 and later define FMT_VERSION in base.h, earlier ones in core.h.
set(_torch_fmt_number "")
foreach(_dir IN LISTS TORCH_INCLUDE_DIRS)
  foreach(_header base.h core.h)
    if(NOT _torch_fmt_number AND EXISTS "${_dir}/fmt/${_header}")
      file(STRINGS "${_dir}/fmt/${_header}" _line REGEX "^#[ \t]*define[ \t]+FMT_VERSION[ \t]+[0-9]+")
      if(_line MATCHES "FMT_VERSION[ \t]+([0-9]+)")
        set(_torch_fmt_number "${CMAKE_MATCH_1}")
        set(_torch_fmt_dir "${_dir}")
        math(EXPR _major "${_torch_fmt_number} / 10000")
        math(EXPR _minor "${_torch_fmt_number} / 100 % 100")
        math(EXPR _patch "${_torch_fmt_number} % 100")
        set(_torch_fmt_version "${_major}.${_minor}.${_patch}")
      endif()
    endif()
  endforeach()
endforeach()

if(_torch_fmt_number AND _fmt_number AND NOT _torch_fmt_number EQUAL _fmt_number)
  get_target_property(_fmt_includes fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
  # An fmt in the compiler's own search path is searched after every -isystem directory: it is
  # reached instead through a folder of the build that holds only a link to its fmt/ folder.
  set(_fmt_read_from "")
  foreach(_dir IN LISTS _fmt_includes)
    if(_dir IN_LIST CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES)
      if(NOT EXISTS "${_dir}/fmt/core.h")
        message(FATAL_ERROR
          "libtorch ${Torch_VERSION} bundles fmt ${_torch_fmt_version} (${_torch_fmt_dir}/fmt) and "
          "dtrain links fmt ${fmt_VERSION}, whose headers are not in ${_dir}/fmt (see Note [Two "
          "fmts] in cmake/torch_fmt.cmake). HINT: put the fmt package dtrain links first on "
          "CMAKE_PREFIX_PATH")
      endif()
      set(_dir_link "${CMAKE_BINARY_DIR}/dtrain_fmt_include")
      file(MAKE_DIRECTORY "${_dir_link}")
      if(NOT EXISTS "${_dir_link}/fmt/core.h")
        file(CREATE_LINK "${_dir}/fmt" "${_dir_link}/fmt" SYMBOLIC)
      endif()
      list(APPEND _fmt_read_from "${_dir_link}")
    else()
      list(APPEND _fmt_read_from "${_dir}")
    endif()
  endforeach()
  set(_fmt_includes ${_fmt_read_from})
  include_directories(BEFORE SYSTEM ${_fmt_includes})
  set(DTRAIN_TORCH_BUNDLES_OTHER_FMT 1)  # the installed package does the same (dtrainConfig.cmake)

  # Compiled with the include directories in the order every target gets them: this directory's
  # (fmt's, above), then libtorch's (what linking it adds), all -isystem. Its imported targets cannot
  # be linked in a try_compile (they name a protobuf target only its package defines), so the
  # directories are spelled out.
  set(_check_dir "${CMAKE_BINARY_DIR}/CMakeFiles/dtrain_torch_fmt_check")
  file(WRITE "${_check_dir}/check.cpp"
       "#include <fmt/core.h>\n"
       "static_assert(FMT_VERSION == ${_fmt_number}, \"reads another fmt's headers\");\n")
  set(_check_flags "")
  foreach(_dir IN LISTS _fmt_includes TORCH_INCLUDE_DIRS)
    string(APPEND _check_flags " -isystem \"${_dir}\"")
  endforeach()
  set(_saved_type "${CMAKE_TRY_COMPILE_TARGET_TYPE}")
  set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)
  try_compile(_fmt_order_ok "${_check_dir}/build" SOURCES "${_check_dir}/check.cpp"
              CMAKE_FLAGS "-DCMAKE_CXX_FLAGS=${_check_flags}"
              OUTPUT_VARIABLE _fmt_order_output)
  set(CMAKE_TRY_COMPILE_TARGET_TYPE "${_saved_type}")
  if(NOT _fmt_order_ok)
    message(FATAL_ERROR
      "a file of this build that includes libtorch's headers would read the fmt "
      "${_torch_fmt_version} headers libtorch bundles (${_torch_fmt_dir}/fmt), not those of the fmt "
      "${fmt_VERSION} it links (${_fmt_includes}); see Note [Two fmts] in "
      "cmake/torch_fmt.cmake. The check's compiler output:\n${_fmt_order_output}")
  endif()
  message(STATUS "fmt ${fmt_VERSION} (${_fmt_includes}) is read ahead of the fmt "
                 "${_torch_fmt_version} libtorch bundles")
endif()
