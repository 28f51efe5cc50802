# -DMEND_BUILD_FUZZ=ON (clang only): every target in the build is compiled with
# libFuzzer's coverage hooks and ASan+UBSan, so the fuzz targets in fuzz/ see
# coverage inside mend's libraries (and generated protobuf code), not just in
# their own entry points. Only the fuzz executables link libFuzzer itself.
# Use a build directory of its own; it is not meant for tests or releases.
if(NOT MEND_BUILD_FUZZ)
  return()
endif()
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "MEND_BUILD_FUZZ=ON needs clang (libFuzzer); configure with "
                      "-DCMAKE_CXX_COMPILER=clang++ in a separate build directory")
endif()
if(MEND_SANITIZE STREQUAL "thread")
  message(FATAL_ERROR "MEND_BUILD_FUZZ=ON builds with ASan+UBSan; it cannot be combined "
                      "with MEND_SANITIZE=thread")
endif()
add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer
                    -fno-sanitize-recover=undefined)
add_link_options(-fsanitize=address,undefined)
