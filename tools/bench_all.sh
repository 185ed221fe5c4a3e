#!/usr/bin/env bash
# Runs the benchmarks behind docs/performance.md, each writing its JSON into OUT_DIR, plus
# OUT_DIR/meta-<set>.json (per benchmark: its command, date, commit and machine);
# tools/perf_report.py then regenerates docs/performance.md and README.md's "Current figures".
#
#   tools/bench_all.sh OUT_DIR gpu [BENCH...]  # on a GPU machine; BENCH of: ceilings
#                                              # verify_step verify_step_ddtree attention gemm
#                                              # e2e drafter_gpu tau_sweep_gpu sweep_gpu
#                                              # sweep_dflash_gpu sweep_replay_gpu
#                                              # sweep_replay_tau2_gpu sweep_replay_tau6_gpu
#   tools/bench_all.sh OUT_DIR cpu [BENCH...]  # on any machine; BENCH of: forward drafter_cpu
#                                              # feature_wire tau_sweep sweep_cpu
#                                              # conversation_cpu
#
# Environment: BIN (default build/bin), RUN (a command prefix for the binaries: ".gpu/run" for
# a gpu-bundle), COMMIT (the commit measured, when the tree has no .git, e.g. a bundle's copy),
# MACHINE (a name for the machine; default: the GPU's name, or the CPU model).
# Each benchmark runs with its defaults (the points docs/performance.md shows); one that fails
# is reported and the others still run; the exit status is 1 if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: tools/bench_all.sh OUT_DIR gpu|cpu [BENCH...]}
set_name=${2:?usage: tools/bench_all.sh OUT_DIR gpu|cpu [BENCH...]}
shift 2
bin=${BIN:-build/bin}
run=${RUN:-}
mkdir -p "$out"

case $set_name in
  gpu) default_benches=(ceilings verify_step verify_step_ddtree attention gemm e2e drafter_gpu
         tau_sweep_gpu sweep_gpu sweep_dflash_gpu sweep_replay_gpu sweep_replay_tau2_gpu
         sweep_replay_tau6_gpu) ;;
  cpu) default_benches=(forward drafter_cpu feature_wire tau_sweep sweep_cpu conversation_cpu) ;;
  *) echo "bench_all: the set is gpu or cpu, not '$set_name'" >&2; exit 2 ;;
esac
benches=("$@")
[ ${#benches[@]} -gt 0 ] || benches=("${default_benches[@]}")

commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
if [ -z "${MACHINE:-}" ]; then
  MACHINE=$( (nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || true) | head -n1)
  [ "$set_name" = cpu ] || [ -z "$MACHINE" ] &&
    MACHINE="$(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -n1)"
fi

declare -A commands=(
  [ceilings]="$bin/treespec-gpu-ceilings"
  [verify_step]="$bin/treespec-verify-step-bench --tp=1 --json=$out/verify_step.json"
  [verify_step_ddtree]="$bin/treespec-verify-step-bench --contexts=1024,8192 --nodes=16,128,256,512 --json=$out/verify_step_ddtree.json"
  [attention]="$bin/treespec-attention-bench --json=$out/attention.json"
  [gemm]="$bin/treespec-gemm-bench --json=$out/gemm.json"
  [e2e]="bench/e2e.sh ${E2E_DIR:-/tmp/treespec-e2e}"
  [drafter_gpu]="$bin/treespec-drafter-bench --draft_model=models/tiny-draft --device=cuda --json=$out/drafter_gpu.json"
  [forward]="$bin/treespec-forward-bench --json=$out/forward_cpu.json"
  [drafter_cpu]="$bin/treespec-drafter-bench --draft_model=models/tiny-draft --device=cpu --json=$out/drafter_cpu.json"
  [feature_wire]="$bin/treespec-feature-wire-bench --json=$out/feature_wire.json"
  [tau_sweep]="bench/tau_sweep.sh ${TAU_DIR:-/tmp/treespec-tau}"
  [tau_sweep_gpu]="bench/tau_sweep.sh ${TAU_GPU_DIR:-/tmp/treespec-tau-gpu}"
  [sweep_gpu]="env DEVICE=cuda:0 ROUNDS=3 PROMPTS_PER_CLIENT=8 MIN_PROMPTS=64 bench/concurrency_sweep.sh /tmp/treespec-sweep-gpu"
  [sweep_dflash_gpu]="env DEVICE=cuda:0 MODE=dflash ROUNDS=3 PROMPTS_PER_CLIENT=8 MIN_PROMPTS=64 bench/concurrency_sweep.sh /tmp/treespec-sweep-dflash-gpu"
  [sweep_cpu]="env ROUNDS=3 PROMPTS_PER_CLIENT=6 MIN_PROMPTS=16 bench/concurrency_sweep.sh /tmp/treespec-sweep-cpu"
  [conversation_cpu]="bench/conversation.sh /tmp/treespec-conversation-cpu"
)
# The 8B-shape replay sweeps: τ ≈ 4, 2 and 6 (replace rates 0.22, 0.5, 0.13).
for tau_rate in ":0.22" "_tau2:0.5" "_tau6:0.13"; do
  commands[sweep_replay${tau_rate%%:*}_gpu]="env DEVICE=cuda:0 MODE=replay TARGET=models/llama3-8b-shape RANDOM_WEIGHTS=1 CONCURRENCY='1 4 16 64' ROUNDS=3 PROMPTS_PER_CLIENT=2 MIN_PROMPTS=8 MAX_NEW=128 REPLAY_RATES=${tau_rate#*:} START_TIMEOUT_S=240 VERIFIER_FLAGS='--context_length=1024 --kv_pages=8192' bench/concurrency_sweep.sh /tmp/treespec-sweep-replay"
done
# Where a sweep leaves the JSON that is copied to OUT_DIR/<bench>.json.
declare -A sweep_json=(
  [sweep_gpu]=/tmp/treespec-sweep-gpu/sweep.json
  [sweep_dflash_gpu]=/tmp/treespec-sweep-dflash-gpu/sweep.json
  [sweep_replay_gpu]=/tmp/treespec-sweep-replay/replay_0.22/sweep.json
  [sweep_replay_tau2_gpu]=/tmp/treespec-sweep-replay/replay_0.5/sweep.json
  [sweep_replay_tau6_gpu]=/tmp/treespec-sweep-replay/replay_0.13/sweep.json
  [sweep_cpu]=/tmp/treespec-sweep-cpu/sweep.json
  [conversation_cpu]=/tmp/treespec-conversation-cpu/conversation.json
)

failed=0
ran=()
for b in "${benches[@]}"; do
  cmd=${commands[$b]:-}
  if [ -z "$cmd" ]; then echo "bench_all: unknown benchmark '$b'" >&2; failed=1; continue; fi
  echo "== $b: $cmd" >&2
  start=$(date +%s)
  if [ "$b" = ceilings ]; then
    $run $cmd >"$out/ceilings.json" || { echo "bench_all: $b failed" >&2; failed=1; continue; }
  elif [ "$b" = e2e ]; then
    BIN=$bin RUN=$run $cmd || { echo "bench_all: $b failed" >&2; failed=1; continue; }
    cp "${E2E_DIR:-/tmp/treespec-e2e}/e2e_summary.json" "$out/e2e.json"
  elif [ "$b" = tau_sweep ]; then
    BIN=$bin RUN=$run $cmd || { echo "bench_all: $b failed" >&2; failed=1; continue; }
    cp "${TAU_DIR:-/tmp/treespec-tau}/tau_sweep.json" "$out/tau_sweep.json"
  elif [ "$b" = tau_sweep_gpu ]; then
    DEVICE=cuda:0 BIN=$bin RUN=$run $cmd || { echo "bench_all: $b failed" >&2; failed=1; continue; }
    cp "${TAU_GPU_DIR:-/tmp/treespec-tau-gpu}/tau_sweep.json" "$out/tau_sweep_gpu.json"
  elif [ -n "${sweep_json[$b]:-}" ]; then
    # eval: the command's quoted environment values ('1 4 16 64') stay one word each.
    BIN=$bin RUN=$run eval "$cmd" || { echo "bench_all: $b failed" >&2; failed=1; continue; }
    cp "${sweep_json[$b]}" "$out/$b.json"
  else
    $run $cmd || { echo "bench_all: $b failed" >&2; failed=1; continue; }
  fi
  echo "== $b: $(( $(date +%s) - start )) s" >&2
  ran+=("$b=${cmd//$out\//OUT/}")
done

# Merged into an existing meta file, so a set run in several calls keeps every benchmark; each
# benchmark keeps the date, commit and machine of its own run.
python3 - "$out/meta-$set_name.json" "$set_name" "$commit" "$MACHINE" "${ran[@]}" <<'PY'
import datetime, json, os, sys
path, set_name, commit, machine, *ran = sys.argv[1:]
meta = json.load(open(path)) if os.path.exists(path) else {"benches": {}}
meta["command"] = f"tools/bench_all.sh OUT {set_name}"
for entry in ran:
    name, command = entry.split("=", 1)
    meta["benches"][name] = {"command": command, "commit": commit, "machine": machine,
                             "date": datetime.date.today().isoformat()}
json.dump(meta, open(path, "w"), indent=1)
PY
exit $failed
