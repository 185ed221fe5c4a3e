#!/usr/bin/env bash
# The libFuzzer targets of tests/fuzz/ (issue 5), built with clang into build-fuzz/ (CPU only,
# ASan + UBSan, libFuzzer coverage):
#   tools/fuzz.sh [seconds_per_target [target...]]   # default 60 s, every target
# For each target it first replays tests/fuzz/regressions/<target>/ (inputs that once failed),
# then fuzzes for the given time from a copy of tests/fuzz/corpus/<target>/ (the committed corpus
# is never written) with its dictionary. Runs land in build-fuzz/runs/<target>/. Any crash,
# leak, timeout or OOM fails the script, which names the input that reproduces it:
#   build-fuzz/bin/<target> <input>
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift $(($# > 0 ? 1 : 0))
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(tokenizer_fuzz tokenizer_json_fuzz config_fuzz safetensors_fuzz tree_fuzz request_fuzz)
fi
# Debian 12's clang is clang-14; libFuzzer and the sanitizer runtimes are in libclang-rt-14-dev.
./tools/install_deps.sh clang libclang-rt-14-dev
dir=build-fuzz
# -O1 with line tables, as tools/sanitize.sh: quick to build on two cores, reports name lines.
cmake -S . -B "$dir" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=Fuzz -DCMAKE_CXX_FLAGS_FUZZ="-O1 -g1" -DCMAKE_C_FLAGS_FUZZ="-O1 -g1" \
  -DCMAKE_CUDA_COMPILER=NOTFOUND -DTREESPEC_FUZZ=ON >/dev/null
cmake --build "$dir" -j"$(nproc)" --target "${targets[@]}"

export ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1
export LSAN_OPTIONS=suppressions=$PWD/tools/sanitizers/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# 2 GiB per process and 10 s per input: what one request, file or tree may cost at most.
limits=(-rss_limit_mb=2048 -timeout=10)
failed=()
for t in "${targets[@]}"; do
  bin=$dir/bin/$t
  run=$dir/runs/$t
  rm -rf "$run"
  mkdir -p "$run/corpus"
  regressions=(tests/fuzz/regressions/"$t"/*)
  if [ -e "${regressions[0]}" ]; then
    echo "fuzz: $t: replaying ${#regressions[@]} regression inputs"
    if ! "$bin" "${limits[@]}" "${regressions[@]}" >"$run/regressions.log" 2>&1; then
      tail -n 40 "$run/regressions.log"
      echo "fuzz: $t FAILED on a regression input (log: $run/regressions.log)"
      failed+=("$t")
      continue
    fi
  fi
  cp -r tests/fuzz/corpus/"$t"/. "$run/corpus/"
  dict=()
  [ -f tests/fuzz/"$t".dict ] && dict=(-dict=tests/fuzz/"$t".dict)
  echo "fuzz: $t: ${seconds} s"
  if "$bin" "${limits[@]}" "${dict[@]}" -max_total_time="$seconds" -print_final_stats=1 \
    -artifact_prefix="$run/" "$run/corpus" >"$run/fuzz.log" 2>&1; then
    # The last status line: executions, coverage, corpus size, exec/s, peak memory.
    grep -E "^#[0-9]+" "$run/fuzz.log" | tail -n 1 | sed "s/^/fuzz: $t: /" || true
  else
    tail -n 60 "$run/fuzz.log"
    for artifact in "$run"/crash-* "$run"/leak-* "$run"/timeout-* "$run"/oom-*; do
      [ -e "$artifact" ] && echo "fuzz: $t: reproduce with: $bin $artifact"
    done
    echo "fuzz: $t FAILED (log: $run/fuzz.log); keep the input in tests/fuzz/regressions/$t/"
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: failed: ${failed[*]}"
  exit 1
fi
echo "fuzz: all ${#targets[@]} targets passed (${seconds} s each)"
