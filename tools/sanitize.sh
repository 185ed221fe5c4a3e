#!/usr/bin/env bash
# The CPU test suite under a sanitizer (issue 5), in its own build directory (CPU only):
#   tools/sanitize.sh address   # AddressSanitizer + UndefinedBehaviorSanitizer, every CPU test
#   tools/sanitize.sh thread    # ThreadSanitizer, the engine's threading tests
# Extra arguments go to ctest. Any report fails the test that caused it; the run-time options
# and suppressions are in tools/sanitizers/ (env.sh).
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
source tools/sanitizers/env.sh
cd "$dir"
ctest --output-on-failure -j"$(nproc)" "${tests[@]}" "$@"
