# Compile settings of dtrain's own targets (not for consumers): dtrain_warnings(target) and
# dtrain_reuse_torch_pch(target).
function(dtrain_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra)
endfunction()

# A target of this tree that includes torch/torch.h reuses the torch layer's precompiled header.
# The PCH is built -fPIC (shared library); an executable's default -fPIE would make GCC reject it
# (-Winvalid-pch) and parse torch/torch.h again in every file.
function(dtrain_reuse_torch_pch target)
  target_precompile_headers(${target} REUSE_FROM dtrain)
  target_compile_options(${target} PRIVATE -fPIC)
endfunction()
