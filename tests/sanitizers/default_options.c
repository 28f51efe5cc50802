/* The sanitizers' default options, compiled into every executable of a
 * sanitizer build (cmake/MendSanitizers.cmake), so that a test run by hand,
 * and every process a test starts, reads the same suppressions as CTest.
 * Options in the environment (UBSAN_OPTIONS, TSAN_OPTIONS) still win. */
#ifndef MEND_SUPPRESSIONS
#error "MEND_SUPPRESSIONS: the directory of ubsan.supp and tsan.supp"
#endif

const char* __ubsan_default_options(void);
const char* __tsan_default_options(void);

const char* __ubsan_default_options(void) {
  return "halt_on_error=1:print_stacktrace=1:suppressions=" MEND_SUPPRESSIONS "/ubsan.supp";
}

/* history_size=5 (1M accesses a thread, the default 3 keeps 256K): a race's
 * older access is reported with its stack only while the thread's history
 * still holds it, and a suppression that names a frame of that stack (a
 * library's, tsan.supp) matches only then. */
const char* __tsan_default_options(void) {
  return "halt_on_error=1:second_deadlock_stack=1:history_size=5:suppressions=" MEND_SUPPRESSIONS
         "/tsan.supp";
}
