#!/usr/bin/env bash
# Tokens per verify step (tau, the bonus counted) against the tree budget (issue 33): DFlash +
# DDTree and the draft-model drafter's tree on the held-out prompts, through the real services
# (one drafter serving both kinds, one verifier on the tiny target), greedy; then each drafter
# in chain mode. The verifier waits for every draft (a 10 s draft timeout), so a slow drafter
# shows in its step time, never as steps verified without a tree. Writes OUT_DIR/tau_sweep.json (tools/perf_report.py renders it) and prints a
# table. tau does not depend on the device (up to kernels' rounding near ties), so a CPU run
# measures the curve; the step times are the device's.
#
#   bench/tau_sweep.sh [OUT_DIR]
# Environment: BIN (build/bin), RUN (command prefix, e.g. a gpu-bundle's run), DEVICE (cpu; the
# verifier's and drafter's --device), PROMPTS (24), MAX_NEW (128), BUDGETS ("16 32 64 128 256
# 512"), DFLASH (models/tiny-dflash), DFLASH_DEPTH (15: its block size - 1), DRAFT_DEPTH (8).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/services.sh
out=${1:-$(mktemp -d /tmp/treespec-tau.XXXXXX)}
mkdir -p "$out"
bin=${BIN:-build/bin}
run=${RUN:-}
device=${DEVICE:-cpu}
prompts=${PROMPTS:-24}
max_new=${MAX_NEW:-128}
budgets=${BUDGETS:-16 32 64 128 256 512}
dflash=${DFLASH:-models/tiny-dflash}
trap 'stop_service "${VERIFIER_PID:-}"; stop_service "${DRAFTER_PID:-}"' EXIT

for tree_mode in tree chain; do
  start_service DRAFTER "$out/drafter_$tree_mode.log" \
    $run $bin/treespec-drafter --port=0 --device="$device" --draft_model=models/tiny-draft \
    --dflash="$dflash" --dflash_target=models/tiny-target --tree_mode=$tree_mode \
    --max_depth="${DFLASH_DEPTH:-15}"
  start_service VERIFIER "$out/verifier_$tree_mode.log" \
    $run $bin/treespec-verifier --port=0 --model=models/tiny-target --drafter="$DRAFTER_ADDR" \
    --device="$device" --max_batch=1 --draft_timeout_ms=10000
  for mode in dflash draft_model; do
    depth=${DFLASH_DEPTH:-15}
    [ $mode = draft_model ] && depth=${DRAFT_DEPTH:-8}
    sizes=$budgets
    [ $tree_mode = chain ] && sizes=$depth
    # One warm-up request (the verifier learns the pool, the drafter loads), then the sweep.
    $run $bin/treespec-cli generate --target="$VERIFIER_ADDR" --mode=$mode --quiet \
      --prompts_file=tests/data/heldout_prompts.jsonl --limit=1 --max_new_tokens=8 \
      --ignore_eos >/dev/null
    for budget in $sizes; do
      name="${mode}_${tree_mode}_${budget}"
      before=$(wc -l <"$out/drafter_$tree_mode.log")
      $run $bin/treespec-cli generate --target="$VERIFIER_ADDR" --mode=$mode --quiet \
        --prompts_file=tests/data/heldout_prompts.jsonl --limit="$prompts" \
        --max_new_tokens="$max_new" --ignore_eos --tree_budget="$budget" --max_depth="$depth" \
        --json_out="$out/$name.json"
      # The drafter's own time per step, from its per-session summary lines.
      sleep 0.5
      tail -n +$((before + 1)) "$out/drafter_$tree_mode.log" | grep "draft session .* done" \
        >"$out/$name.sessions" || true
      echo "$name done"
    done
  done
  stop_service "$VERIFIER_PID"; VERIFIER_PID=
  stop_service "$DRAFTER_PID"; DRAFTER_PID=
done

python3 - "$out" "$device" "$prompts" "$max_new" <<'PY'
import glob, json, os, re, sys
out, device, prompts, max_new = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rows = []
for path in sorted(glob.glob(os.path.join(out, "*_*_*.json"))):
    name = os.path.basename(path)[:-5]
    mode, tree_mode, budget = name.rsplit("_", 2)
    r = json.load(open(path))
    steps = ms = 0.0
    for line in open(os.path.join(out, name + ".sessions")):
        s = re.search(r" steps=(\d+) .*mean_draft_ms=([0-9.]+)", line)
        if s:
            steps += int(s.group(1))
            ms += int(s.group(1)) * float(s.group(2))
    rows.append({"mode": mode, "tree_mode": tree_mode, "budget": int(budget),
                 "tau": r["mean_acceptance_length"], "tokens_per_s": r["tokens_per_s"],
                 "draft_ms_per_step": ms / steps if steps else None, "failed": r["failed"]})
rows.sort(key=lambda x: (x["mode"], x["tree_mode"] != "tree", x["budget"]))
print(f"\n{'drafter':12s} {'tree':6s} {'budget':>6s} {'tau':>6s} {'draft ms':>9s} {'tok/s':>8s}")
for x in rows:
    d = "" if x["draft_ms_per_step"] is None else f"{x['draft_ms_per_step']:9.2f}"
    print(f"{x['mode']:12s} {x['tree_mode']:6s} {x['budget']:6d} {x['tau']:6.2f} {d:>9s} "
          f"{x['tokens_per_s']:8.1f}")
json.dump({"bench": "tau_sweep", "device": device, "prompts": prompts, "max_new_tokens": max_new,
           "command": "bench/tau_sweep.sh", "rows": rows},
          open(os.path.join(out, "tau_sweep.json"), "w"), indent=1)
PY
