# -DMEND_SANITIZE=address builds everything with ASan+UBSan; =thread with TSan.
if(MEND_SANITIZE STREQUAL "address")
  # Every UBSan finding stops the process (halt_on_error in
  # tests/sanitizers/default_options.c); the vptr check is recoverable only
  # so that its suppression (a library's, tests/sanitizers/ubsan.supp) can
  # apply: suppressions skip unrecoverable checks.
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
                      -fsanitize-recover=vptr)
  add_link_options(-fsanitize=address,undefined)
elseif(MEND_SANITIZE STREQUAL "thread")
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
elseif(NOT MEND_SANITIZE STREQUAL "")
  message(FATAL_ERROR "MEND_SANITIZE='${MEND_SANITIZE}': must be '', 'address' or 'thread'")
endif()
# A sanitizer build has line tables only (-g1), after the build type's flags
# so that these win: full stacks with file and line. TSan optimises at -O1,
# as it recommends (its tests run several times slower than plain ones).
# ASan+UBSan compiles at -O0: UBSan's checks made -O1 twice as slow to
# compile (lighthouse_core.cc: 31 s at -O0, 59 s at -O1, on a loaded
# machine), and the ASan stage's tests are a minute of its time, its build
# ten; both find the same faults at either level.
if(MEND_SANITIZE STREQUAL "address")
  add_compile_options(-O0 -g1)
elseif(NOT MEND_SANITIZE STREQUAL "")
  add_compile_options(-O1 -g1)
endif()

# Every executable of a sanitizer build carries the runtime's default
# options (tests/sanitizers/default_options.c: the suppression files for
# libraries outside mend), compiled here once and linked into each.
if(NOT MEND_SANITIZE STREQUAL "")
  set(MEND_SANITIZER_OPTIONS_OBJECT ${CMAKE_BINARY_DIR}/mend_sanitizer_options.o)
  execute_process(
    COMMAND ${CMAKE_C_COMPILER} -O1 -fPIC -c ${PROJECT_SOURCE_DIR}/tests/sanitizers/default_options.c
            "-DMEND_SUPPRESSIONS=\"${PROJECT_SOURCE_DIR}/tests/sanitizers\"" -o ${MEND_SANITIZER_OPTIONS_OBJECT}
    RESULT_VARIABLE compiled)
  if(NOT compiled EQUAL 0)
    message(FATAL_ERROR "could not compile tests/sanitizers/default_options.c")
  endif()
  string(APPEND CMAKE_EXE_LINKER_FLAGS " ${MEND_SANITIZER_OPTIONS_OBJECT}")
endif()
