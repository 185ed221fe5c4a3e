# The sanitizers' run-time options, sourced by tools/sanitize.sh and tools/flake_hunt.sh so that
# a flake hunt in a sanitizer build fails on exactly what CI fails on. Any report fails the test
# that caused it (halt_on_error, and abort_on_error so that a child binary's report shows as its
# SIGABRT); known reports from uninstrumented system libraries are suppressed here, each with
# its reason in the .supp file.
supp=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1
export LSAN_OPTIONS=suppressions=$supp/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp
# OpenBLAS's own worker threads synchronise by spinning on flags ThreadSanitizer cannot see;
# one BLAS thread keeps the reports about our threads.
export OPENBLAS_NUM_THREADS=1
unset supp
