# Warnings applied to mend's own targets (not to generated protobuf code).
function(mend_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wno-unused-parameter
                                           -Wnon-virtual-dtor -Wshadow=local)
endfunction()
