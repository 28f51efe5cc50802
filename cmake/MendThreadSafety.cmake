# -DMEND_THREAD_SAFETY_ANALYSIS=ON: clang's thread-safety analysis over mend's
# own targets (those that call mend_warnings), every finding an error. It
# checks the ABSL_GUARDED_BY / ABSL_EXCLUSIVE_LOCKS_REQUIRED annotations on
# members guarded by a mend::Mutex (src/core/mutex.h). GCC has no such
# analysis: the option needs clang (CC=clang CXX=clang++).
# scripts/thread-safety.sh runs it over the LibTorch-free part.
option(MEND_THREAD_SAFETY_ANALYSIS "Check the thread-safety annotations with clang (-Wthread-safety as errors)" OFF)
set(MEND_THREAD_SAFETY_FLAGS "")
if(MEND_THREAD_SAFETY_ANALYSIS)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "MEND_THREAD_SAFETY_ANALYSIS=ON needs clang, but the C++ compiler is "
                        "${CMAKE_CXX_COMPILER_ID} (${CMAKE_CXX_COMPILER}): configure a fresh build "
                        "directory with CC=clang CXX=clang++")
  endif()
  set(MEND_THREAD_SAFETY_FLAGS -Wthread-safety -Werror=thread-safety)
endif()
