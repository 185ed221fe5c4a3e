#!/usr/bin/env bash
# The CPU test suite under a sanitizer (issue 5), in its own build directory (CPU only):
#   tools/sanitize.sh address   # AddressSanitizer + UndefinedBehaviorSanitizer, every CPU test
#   tools/sanitize.sh thread    # ThreadSanitizer, the engine's threading tests
# Extra arguments go to ctest. Any report fails the test that caused it (halt_on_error); known
# reports from uninstrumented system libraries are suppressed in tools/sanitizers/, each with
# its reason.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:?usage: tools/sanitize.sh address|thread [ctest args]}
shift
targets=()  # everything
case "$mode" in
  address)
    # Every CPU test; the GPU ones skip themselves (the build has no CUDA anyway). Not the soak
    # (soak_short): its verdict rests on the services' resident memory, which under ASan is
    # mostly the allocator's quarantine of freed blocks (up to 256 MiB by default) and shadow
    # memory, not the services' own; and services killed with SIGKILL never run the leak check.
    # The paths it drives (drafter crash and reconnect, client cancels) run under ASan in
    # fault_test and loadgen_driver_test. Nor the docs checks (label docs): they compare pages
    # with the binaries' --helpfull and the benchmark JSON, as the plain run already does.
    tests=(-LE "gpu|deploy|soak|docs")
    ;;
  thread)
    # The engine's threads (batching loop, rank threads, in-process communicator, the CPU
    # model's tensor-parallel ranks) and the drafter's (the draft batcher and the sessions
    # that wait on it); only these are built. Tests that run gRPC are left out:
    # Debian's gRPC and Abseil are not built with ThreadSanitizer, and their internal
    # synchronisation shows up as races (drafter_client_test: epoll_create1 vs epoll_wait in
    # gRPC's poller, then absl::Mutex's deadlock graph).
    names=(engine_test rank_threads_test communicator_test cpu_causal_lm_test
      output_processor_test ngram_drafter_test ddtree_test draft_batcher_test
      draft_model_drafter_test)
    tests=(-R "^($(IFS='|'; echo "${names[*]}"))$")
    targets=(--target "${names[@]}")
    ;;
  *) echo "sanitize.sh: unknown mode '$mode' (address or thread)" >&2; exit 2 ;;
esac
./tools/install_deps.sh
dir=build-$mode
# -O1 with line tables: fast enough to build on two cores, and the reports name source lines.
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Sanitize -DCMAKE_CXX_FLAGS_SANITIZE="-O1 -g1" \
  -DCMAKE_C_FLAGS_SANITIZE="-O1 -g1" -DCMAKE_CUDA_COMPILER=NOTFOUND \
  -DTREESPEC_SANITIZE="$mode" >/dev/null
cmake --build "$dir" -j"$(nproc)" "${targets[@]}"
supp=$PWD/tools/sanitizers
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1
export LSAN_OPTIONS=suppressions=$supp/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp
# OpenBLAS's own worker threads synchronise by spinning on flags ThreadSanitizer cannot see;
# one BLAS thread keeps the reports about our threads.
export OPENBLAS_NUM_THREADS=1
cd "$dir"
ctest --output-on-failure -j"$(nproc)" "${tests[@]}" "$@"
