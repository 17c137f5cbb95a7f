# Compile settings of dtrain's own targets (not for consumers): dtrain_warnings(target) and
# dtrain_reuse_torch_pch(target).
function(dtrain_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra)
  # GCC 12 in C++20 warns -Wrestrict inside libstdc++'s own constexpr std::string code for
  # `"literal" + std::move(str)` (GCC bug 105329: the warning is about an overlap the code cannot
  # have); GCC 13 fixed it. Off only where it is wrong.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13
     AND CMAKE_CXX_STANDARD GREATER_EQUAL 20)
    target_compile_options(${target} PRIVATE -Wno-restrict)
  endif()
endfunction()

# A target of this tree that includes torch/torch.h reuses the torch layer's precompiled header.
# The PCH is built -fPIC (shared library); an executable's default -fPIE would make GCC reject it
# (-Winvalid-pch) and parse torch/torch.h again in every file.
function(dtrain_reuse_torch_pch target)
  target_precompile_headers(${target} REUSE_FROM dtrain)
  target_compile_options(${target} PRIVATE -fPIC)
endfunction()
