#!/usr/bin/env bash
# Concurrency sweep (issue 34): output tokens/s and TPOT of the tiny pair through the services
# at each closed-loop concurrency, for speculation off, fixed tree budgets and the step-cost
# model's `auto` (an unset budget on a verifier started with --step_cost_profile_s), driven by
# treespec-loadgen; writes OUT_DIR/sweep.json and plots it (tools/plot_sweep.py -> sweep.svg).
#
#   bench/concurrency_sweep.sh [OUT_DIR]
# Environment: BIN (default build/bin), RUN (a command prefix, e.g. a gpu-bundle's run),
# DEVICE (verifier and drafter device, default cpu), MODE (the drafter kind: draft_model),
# CONCURRENCY ("1 2 4 8 16 32 64"), SETTINGS ("off 4 16 64 auto"), PROMPTS_PER_CLIENT (3:
# requests per point = concurrency × this, at least 8), MAX_NEW (64), STEP_COST_S (5).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/services.sh
out=${1:-$(mktemp -d /tmp/treespec-sweep.XXXXXX)}
mkdir -p "$out"
bin=${BIN:-build/bin}
run=${RUN:-}
device=${DEVICE:-cpu}
mode=${MODE:-draft_model}
concurrency=${CONCURRENCY:-1 2 4 8 16 32 64}
settings=${SETTINGS:-off 4 16 64 auto}
per_client=${PROMPTS_PER_CLIENT:-3}
max_new=${MAX_NEW:-64}
largest=$(tr ' ' '\n' <<<"$concurrency" | sort -n | tail -1)
trap 'stop_service "${VERIFIER_PID:-}"; stop_service "${DRAFTER_PID:-}"' EXIT

start_service DRAFTER "$out/drafter.log" \
  $run $bin/treespec-drafter --port=0 --draft_model=models/tiny-draft --device="$device" \
  --dflash=models/tiny-dflash --dflash_target=models/tiny-target --max_tree_budget=64
start_service VERIFIER "$out/verifier.log" \
  $run $bin/treespec-verifier --port=0 --model=models/tiny-target --drafter="$DRAFTER_ADDR" \
  --device="$device" --max_batch="$largest" --step_cost_profile_s="${STEP_COST_S:-5}" \
  --metrics_port=-1
echo "drafter at $DRAFTER_ADDR, verifier at $VERIFIER_ADDR ($device)"

for setting in $settings; do
  for c in $concurrency; do
    n=$((c * per_client)); [ "$n" -ge 8 ] || n=8
    flags=(--mode="$mode")
    case $setting in
      off) flags=(--mode=off) ;;
      auto) ;;  # no tree budget: the verifier's step-cost model chooses
      *) flags+=(--tree_budget="$setting") ;;
    esac
    $run $bin/treespec-loadgen --target="$VERIFIER_ADDR" \
      --dataset_path=tests/data/heldout_prompts.jsonl --jsonl_output_len="$max_new" \
      --num_prompts="$n" --num_warmups=2 --max_concurrency="$c" --progress=false \
      "${flags[@]}" --result_json="$out/${setting}_c${c}.json" >/dev/null
    echo "$setting, $c concurrent: $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(f\"{d['output_throughput']:.0f} tok/s\")" "$out/${setting}_c${c}.json")"
  done
done

python3 - "$out" "$mode" "$device" "$settings" "$concurrency" <<'PY'
import json, os, sys
out, mode, device, settings, concurrency = sys.argv[1:]
sweep = {"mode": mode, "device": device, "settings": settings.split(),
         "concurrency": [int(c) for c in concurrency.split()], "points": {}}
for s in sweep["settings"]:
    for c in sweep["concurrency"]:
        d = json.load(open(os.path.join(out, f"{s}_c{c}.json")))
        sweep["points"][f"{s}_c{c}"] = {"tokens_per_s": d["output_throughput"],
                                        "mean_tpot_ms": d.get("mean_tpot_ms")}
json.dump(sweep, open(os.path.join(out, "sweep.json"), "w"), indent=1)
PY
python3 tools/plot_sweep.py "$out/sweep.json" "$out/sweep.svg"
echo "wrote $out/sweep.json and $out/sweep.svg"
