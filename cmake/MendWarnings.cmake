# Warnings applied to mend's own targets (not to generated protobuf code), and
# clang's thread-safety analysis when MEND_THREAD_SAFETY_ANALYSIS is on
# (cmake/MendThreadSafety.cmake).
# -Wshadow=local is GCC's; clang (the fuzz build) has no equivalent and would
# warn about the unknown option in every file.
function(mend_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wno-unused-parameter
                                           -Wnon-virtual-dtor
                                           $<$<CXX_COMPILER_ID:GNU>:-Wshadow=local>
                                           ${MEND_THREAD_SAFETY_FLAGS})
endfunction()
