# Warnings for dtrain's own targets (not for consumers): dtrain_warnings(target).
function(dtrain_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra)
endfunction()
