#!/usr/bin/env bash
# Concurrency sweep (issue 34): output tokens/s and TPOT through the services at each
# closed-loop concurrency, for speculation off, fixed tree budgets and the step-cost model's
# `auto` (an unset budget on a verifier started with --step_cost_profile_s), driven by
# treespec-loadgen; writes sweep.json and plots it (tools/plot_sweep.py -> sweep.svg).
#
#   bench/concurrency_sweep.sh [OUT_DIR]
#
# Two kinds of sweep:
# - MODE=draft_model | dflash | ngram (default draft_model): the tiny pair on the held-out
#   prompts; writes OUT_DIR/sweep.json.
# - MODE=replay: a target (TARGET; RANDOM_WEIGHTS=1 makes its weights on the GPU from its
#   config.json alone, e.g. models/llama3-8b-shape) on random token prompts. A plain run first
#   records the target's greedy outputs (treespec-loadgen --record_tokens); then, per replace
#   rate in REPLAY_RATES, a replay drafter proposes them with that share of tokens replaced
#   (drafter_service/replay_drafter.h: chains of depth D accept τ = (1 - q^(D+1)) / (1 - q),
#   q = 1 - rate) and a fresh verifier is swept; writes OUT_DIR/replay_<rate>/sweep.json.
#
# Environment: BIN (default build/bin), RUN (a command prefix, e.g. a gpu-bundle's run),
# DEVICE (verifier and drafter device, default cpu), CONCURRENCY ("1 2 4 8 16 32 64"),
# SETTINGS ("off 4 16 64 auto"), PROMPTS_PER_CLIENT (3: requests per point = concurrency × this,
# at least MIN_PROMPTS, 8), MAX_NEW (64), STEP_COST_S (5), VERIFIER_FLAGS (extra verifier
# flags), TARGET, RANDOM_WEIGHTS (0), PROMPT_LEN (random prompts' tokens, 128),
# REPLAY_RATES ("0.5 0.25 0.15"),
# REPLAY_WIDTH (1 = chains), MAX_DEPTH (the verifier's default depth; 16 for replay, else 8),
# ROUNDS (1): each point is run this many times, all settings of a concurrency in turn per
# round, and reported as its median round (its other rounds' tokens/s beside it) — a short
# point on the tiny pair moves by ±10–15 % between runs, and auto's later rounds run on what the
# gate learnt in the earlier ones, as a server that has run at that load before.
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
min_prompts=${MIN_PROMPTS:-8}
max_new=${MAX_NEW:-64}
rounds=${ROUNDS:-1}
target=${TARGET:-models/tiny-target}
largest=$(tr ' ' '\n' <<<"$concurrency" | sort -n | tail -1)
if [ "$mode" = replay ]; then max_depth=${MAX_DEPTH:-16}; else max_depth=${MAX_DEPTH:-8}; fi
read -r -a verifier_extra <<<"${VERIFIER_FLAGS:-}"
[ "${RANDOM_WEIGHTS:-0}" = 1 ] && verifier_extra+=(--random_weights)
trap 'stop_service "${VERIFIER_PID:-}"; stop_service "${DRAFTER_PID:-}"' EXIT

# The prompts: the tiny pair's held-out text, or (replay) seeded random token ids, so that the
# recorded outputs belong to exactly the prompts every later run sends.
if [ "$mode" = replay ]; then
  dataset=(--dataset_name=random --random_input_len="${PROMPT_LEN:-128}"
           --random_output_len="$max_new" --random_range_ratio=0 --seed=7)
else
  dataset=(--dataset_path=tests/data/heldout_prompts.jsonl --jsonl_output_len="$max_new")
fi

start_verifier() {  # [DRAFTER_ADDR]
  local drafter=()
  [ -n "${1:-}" ] && drafter=(--drafter="$1")
  start_service VERIFIER "$2/verifier.log" \
    $run $bin/treespec-verifier --port=0 --model="$target" "${drafter[@]}" \
    --device="$device" --max_batch="$largest" --max_depth="$max_depth" \
    --step_cost_profile_s="${STEP_COST_S:-5}" --step_cost_cache="$out/step_cost_cache.json" \
    --metrics_port=0 "${verifier_extra[@]}"
}

stop_all() {
  stop_service "${VERIFIER_PID:-}"; VERIFIER_PID=
  stop_service "${DRAFTER_PID:-}"; DRAFTER_PID=
}

# sweep DIR: every setting at every concurrency against the running services -> DIR/sweep.json
# (the settings one after another at each concurrency, so that what drifts over a run — a
# machine's other load, its clocks — moves all of a concurrency's figures alike).
sweep() {
  local dir=$1
  for c in $concurrency; do
    for round in $(seq "$rounds"); do
      for setting in $settings; do
        n=$((c * per_client)); [ "$n" -ge "$min_prompts" ] || n=$min_prompts
        flags=(--mode="$mode")
        case $setting in
          off) flags=(--mode=off) ;;
          auto) ;;  # no tree budget: the verifier's step-cost model chooses
          *) flags+=(--tree_budget="$setting") ;;
        esac
        point="$dir/${setting}_c${c}_r${round}"
        python3 tools/step_cost_ratio.py snapshot "$VERIFIER_METRICS" "$dir/ratio_before.json"
        $run $bin/treespec-loadgen --target="$VERIFIER_ADDR" "${dataset[@]}" \
          --num_prompts="$n" --num_warmups=2 --max_concurrency="$c" --progress=false \
          "${flags[@]}" --result_json="$point.json" >/dev/null
        # The step-cost model's median measured / predicted step time over this point's steps.
        python3 tools/step_cost_ratio.py median "$VERIFIER_METRICS" "$dir/ratio_before.json" \
          >"$point.ratio"
        echo "$setting, $c concurrent, round $round: $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(f\"{d['output_throughput']:.0f} tok/s, acceptance {d.get('spec_decode_acceptance_length') or 1:.2f}\")" "$point.json")"
      done
    done
  done
  python3 - "$dir" "$mode" "$device" "$settings" "$concurrency" "$rounds" "$target" "${2:-}" <<'PY'
import json, os, sys
out, mode, device, settings, concurrency, rounds, target, replace_rate = sys.argv[1:]
sweep = {"mode": mode, "device": device, "target": target, "settings": settings.split(),
         "concurrency": [int(c) for c in concurrency.split()], "rounds": int(rounds),
         "points": {}}
if replace_rate:
    sweep["replay_replace_rate"] = float(replace_rate)
for s in sweep["settings"]:
    for c in sweep["concurrency"]:
        runs = []
        for r in range(1, int(rounds) + 1):
            base = os.path.join(out, f"{s}_c{c}_r{r}")
            runs.append((json.load(open(base + ".json")), json.loads(open(base + ".ratio").read())))
        order = sorted(range(len(runs)), key=lambda k: runs[k][0]["output_throughput"])
        d, ratio = runs[order[(len(order) - 1) // 2]]  # the median round (the lower of two)
        sweep["points"][f"{s}_c{c}"] = {"tokens_per_s": d["output_throughput"],
                                        "mean_tpot_ms": d.get("mean_tpot_ms"),
                                        "acceptance_length": d.get("spec_decode_acceptance_length"),
                                        "step_cost_ratio_median": ratio,
                                        "rounds_tokens_per_s": [r[0]["output_throughput"]
                                                                for r in runs]}
json.dump(sweep, open(os.path.join(out, "sweep.json"), "w"), indent=1)
PY
  python3 tools/plot_sweep.py "$dir/sweep.json" "$dir/sweep.svg"
  echo "wrote $dir/sweep.json and $dir/sweep.svg"
}

if [ "$mode" != replay ]; then
  start_service DRAFTER "$out/drafter.log" \
    $run $bin/treespec-drafter --port=0 --draft_model=models/tiny-draft --device="$device" \
    --dflash=models/tiny-dflash --dflash_target=models/tiny-target --max_tree_budget=64
  start_verifier "$DRAFTER_ADDR" "$out"
  echo "drafter at $DRAFTER_ADDR, verifier at $VERIFIER_ADDR ($device)"
  sweep "$out"
  exit 0
fi

# Replay: record the target's greedy outputs for every prompt any point sends (the random
# dataset is a seeded stream, so each point's prompts are a prefix of these).
record="$out/record.jsonl"
n_max=$((largest * per_client)); [ "$n_max" -ge "$min_prompts" ] || n_max=$min_prompts
start_verifier "" "$out"
echo "recording $((n_max + 2)) outputs of $target on $VERIFIER_ADDR ($device)"
$run $bin/treespec-loadgen --target="$VERIFIER_ADDR" "${dataset[@]}" --mode=off \
  --num_prompts=$((n_max + 2)) --max_concurrency="$largest" --progress=false \
  --record_tokens="$record" >/dev/null
stop_all
for rate in ${REPLAY_RATES:-0.5 0.25 0.15}; do
  dir="$out/replay_$rate"
  mkdir -p "$dir"
  start_service DRAFTER "$dir/drafter.log" \
    $run $bin/treespec-drafter --port=0 --replay="$record" --replay_replace_rate="$rate" \
    --replay_width="${REPLAY_WIDTH:-1}" --max_tree_budget=64
  start_verifier "$DRAFTER_ADDR" "$dir"
  echo "replace rate $rate: drafter at $DRAFTER_ADDR, verifier at $VERIFIER_ADDR ($device)"
  sweep "$dir" "$rate"
  stop_all
done
