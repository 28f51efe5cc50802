/* The sanitizers' default options, compiled into every executable of a
 * sanitizer build (cmake/MendSanitizers.cmake), so that a test run by hand,
 * and every process a test starts, reads the same suppressions as CTest.
 * Options in the environment (UBSAN_OPTIONS, TSAN_OPTIONS, LSAN_OPTIONS)
 * still win. */
#ifndef MEND_SUPPRESSIONS
#error "MEND_SUPPRESSIONS: the directory of ubsan.supp, tsan.supp and lsan.supp"
#endif

const char* __ubsan_default_options(void);
const char* __tsan_default_options(void);
const char* __lsan_default_options(void);

const char* __lsan_default_options(void) { return "suppressions=" MEND_SUPPRESSIONS "/lsan.supp"; }

const char* __ubsan_default_options(void) {
  return "halt_on_error=1:print_stacktrace=1:suppressions=" MEND_SUPPRESSIONS "/ubsan.supp";
}

/* history_size=5 (1M accesses a thread, the default 3 keeps 256K): a race's
 * older access is reported with its stack only while the thread's history
 * still holds it, and a suppression that names a frame of that stack (a
 * library's, tsan.supp) matches only then.
 * suppress_equal_addresses=0: with it on, the runtime keeps every racy
 * address it has seen, suppressed ones included, in one list that it scans
 * under a global lock on each race. gRPC's callback handlers (inlined from
 * its headers into mend's code, their synchronisation inside the
 * uninstrumented library) race on a fresh heap address per call, so the list
 * grows with every RPC: a test binary that made some thousands of them spent
 * most of its time in that scan, starved its threads past their heartbeats
 * and hung (LearnerGroupTest's rack-aware case, 600 s; 6 s with it off).
 * halt_on_error=1 stops at the first unsuppressed report anyway.
 * atexit_sleep_ms=0: the runtime's default sleeps 1 s at every exit, which
 * is a second per test process, some 200 s of the TSan stage. */
const char* __tsan_default_options(void) {
  return "halt_on_error=1:second_deadlock_stack=1:history_size=5:suppress_equal_addresses=0:"
         "atexit_sleep_ms=0:"
         "suppressions=" MEND_SUPPRESSIONS "/tsan.supp";
}
