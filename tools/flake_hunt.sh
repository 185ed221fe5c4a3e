#!/usr/bin/env bash
# Shakes out flaky tests before CI meets them: runs the chosen tests ROUNDS times, several at
# once, while busy loops load every core (CI runs on two shared cores, under sanitizers too).
# Stops at the first failure and prints its output.
#
#   tools/flake_hunt.sh [--rounds 20] [--build build] [--burn N] [ctest selection...]
#   tools/flake_hunt.sh --rounds 20 -L integration                 # the default selection
#   tools/flake_hunt.sh --rounds 50 --build build-address -R 'tls_test|drafter_limits_test'
#
# Run it over the integration tests before landing anything timing-sensitive (deadlines,
# keepalive, health polling, round-robin spreading, drains). --burn: busy loops beside the
# tests (default: one per core); the tests run with -j twice the cores.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=20
build=build
burn=$(nproc)
selection=()
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --burn) burn=$2; shift 2 ;;
    *) selection+=("$1"); shift ;;
  esac
done
[ ${#selection[@]} -gt 0 ] || selection=(-L integration -LE soak)
[ -d "$build" ] || { echo "flake_hunt: no build directory '$build'" >&2; exit 2; }
# A sanitizer build (tools/sanitize.sh's build-address or build-thread) runs with CI's options.
if grep -q '^TREESPEC_SANITIZE:[A-Z]*=[a-z]' "$build/CMakeCache.txt" 2>/dev/null; then
  source tools/sanitizers/env.sh
fi

burners=()
trap 'kill "${burners[@]}" 2>/dev/null || true' EXIT
for _ in $(seq 1 "$burn"); do
  (while :; do :; done) &
  burners+=($!)
done
echo "flake_hunt: ${rounds} rounds of ${selection[*]} in $build, ${burn} busy loops beside" >&2
cd "$build"
# until-fail: each test is repeated up to `rounds` times and stops at its first failure.
ctest --output-on-failure -j"$(( 2 * $(nproc) ))" --repeat until-fail:"$rounds" "${selection[@]}"
