#!/usr/bin/env bash
# End-to-end benchmark (issues 3, 33): the tiny pair through the real services on GPUs — drafter
# and verifier as separate processes, requests over gRPC from treespec-cli — at batch 1 and
# batch B, with the DFlash drafter (models/tiny-dflash, DDTree), the draft model (models/
# tiny-draft) and speculation off; then Hugging Face Transformers on the same prompts (plain
# greedy and assisted generation with the same draft model, bench/hf_baseline.py); a table of
# ratios.
#
#   bench/e2e.sh [OUT_DIR]
# Environment: BIN (default build/bin), RUN (a command prefix for the binaries, e.g. ".gpu/run"
# for a gpu-bundle), VERIFIER_DEVICE (cuda:0), DRAFTER_DEVICE (cuda:1 when there are two GPUs,
# else cuda:0), PROMPTS (12), MAX_NEW (128), BATCH (16), HF (1: also run Transformers),
# MODES ("dflash draft_model off"), DFLASH_SPEC (treespec-cli flags of the DFlash runs,
# "--tree_budget=64 --max_depth=15"), DRAFT_SPEC (of the draft-model runs, ""), DRAFTER_FLAGS
# (extra treespec-drafter flags, e.g. --expand_per_depth=4), VERIFIER_FLAGS (extra
# treespec-verifier flags, e.g. --step_cost_profile_s=5).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/services.sh
out=${1:-$(mktemp -d /tmp/treespec-e2e.XXXXXX)}
mkdir -p "$out"
bin=${BIN:-build/bin}
run=${RUN:-}
gpus=$( (nvidia-smi -L 2>/dev/null || true) | wc -l)
verifier_device=${VERIFIER_DEVICE:-cuda:0}
drafter_device=${DRAFTER_DEVICE:-$([ "$gpus" -ge 2 ] && echo cuda:1 || echo cuda:0)}
export PROMPTS=${PROMPTS:-12}
prompts=$PROMPTS
max_new=${MAX_NEW:-128}
batch=${BATCH:-16}
trap 'stop_service "${VERIFIER_PID:-}"; stop_service "${DRAFTER_PID:-}"' EXIT

start_service DRAFTER "$out/drafter.log" \
  $run $bin/treespec-drafter --port=0 --draft_model=models/tiny-draft --device="$drafter_device" \
  --dflash=models/tiny-dflash --dflash_target=models/tiny-target --max_depth=15 \
  ${DRAFTER_FLAGS:-}
start_service VERIFIER "$out/verifier.log" \
  $run $bin/treespec-verifier --port=0 --model=models/tiny-target --drafter="$DRAFTER_ADDR" \
  --device="$verifier_device" --max_batch="$batch" ${VERIFIER_FLAGS:-}
echo "drafter ($drafter_device) at $DRAFTER_ADDR, verifier ($verifier_device) at $VERIFIER_ADDR"

modes=${MODES:-dflash draft_model off}
export DFLASH_SPEC=${DFLASH_SPEC:---tree_budget=64 --max_depth=15} DRAFT_SPEC=${DRAFT_SPEC:-}
for concurrency in 1 "$batch"; do
  for mode in $modes; do
    spec=""
    [ "$mode" = dflash ] && spec=$DFLASH_SPEC
    [ "$mode" = draft_model ] && spec=$DRAFT_SPEC
    # One warm-up request, then the timed run.
    $run $bin/treespec-cli generate --target="$VERIFIER_ADDR" --mode=$mode --quiet \
      --prompts_file=tests/data/heldout_prompts.jsonl --limit=1 --max_new_tokens=16 \
      --ignore_eos $spec >/dev/null
    $run $bin/treespec-cli generate --target="$VERIFIER_ADDR" --mode=$mode --quiet \
      --prompts_file=tests/data/heldout_prompts.jsonl --limit="$prompts" \
      --max_new_tokens="$max_new" --ignore_eos --concurrency="$concurrency" $spec \
      --json_out="$out/treespec_${mode}_c${concurrency}.json"
  done
done

if [ "${HF:-1}" = 1 ]; then
  python3 bench/hf_baseline.py --prompts tests/data/heldout_prompts.jsonl --limit "$prompts" \
    --max_new_tokens "$max_new" --batch "$batch" --json_out "$out/hf.json"
fi

python3 - "$out" "$batch" "$modes" <<'PY'
import json, os, sys
out, batch, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
def load(name):
    path = os.path.join(out, name)
    return json.load(open(path)) if os.path.exists(path) else None
rows = {}
for c in (1, batch):
    for mode in modes:
        rows[(mode, c)] = load(f"treespec_{mode}_c{c}.json")
hf = load("hf.json") or {}
summary = {"batch": batch, "prompts": int(os.environ["PROMPTS"]),
           "dflash_spec": os.environ["DFLASH_SPEC"], "draft_spec": os.environ["DRAFT_SPEC"]}
print()
print(f"{'system':44s} {'batch':>5s} {'tok/s':>9s} {'MAL':>5s}")
for (mode, c), r in rows.items():
    name = "treespec, speculation " + {"dflash": "on (DFlash + DDTree)",
                                       "draft_model": "on (draft model tree)"}.get(mode, "off")
    mal = r["mean_acceptance_length"] if mode != "off" else 1.0
    print(f"{name:44s} {c:5d} {r['tokens_per_s']:9.1f} {mal:5.2f}")
    summary[f"treespec_{mode}_c{c}_tokens_per_s"] = r["tokens_per_s"]
    summary[f"treespec_{mode}_c{c}_mean_acceptance_length"] = mal
    summary[f"treespec_{mode}_c{c}_failed"] = r["failed"]
for key, name, c in (("plain_batch1_tokens_per_s", "Transformers greedy", 1),
                     ("assisted_batch1_tokens_per_s", "Transformers assisted (assistant_model)", 1),
                     (f"plain_batch{batch}_tokens_per_s", "Transformers greedy", batch)):
    if key in hf:
        print(f"{name:44s} {c:5d} {hf[key]:9.1f}")
        summary["hf_" + key] = hf[key]
for c in (1, batch):
    if ("dflash", c) in rows and ("draft_model", c) in rows:
        ratio = rows[("dflash", c)]["tokens_per_s"] / rows[("draft_model", c)]["tokens_per_s"]
        summary[f"dflash_over_draft_model_c{c}"] = ratio
        print(f"batch {c}: DFlash + DDTree {ratio:.2f}x the draft model's tokens/s")
for (mode, c), r in rows.items():  # speculation must not change a token
    if mode != "off" and ("off", c) in rows:
        same = sum(a["token_ids"] == b["token_ids"]
                   for a, b in zip(r["requests"], rows[("off", c)]["requests"]))
        summary[f"treespec_{mode}_c{c}_identical_to_off"] = same
        print(f"{mode}, batch {c}: output identical to speculation off for {same} of "
              f"{len(r['requests'])} prompts")
if hf and ("draft_model", 1) in rows:
    spec1 = rows[("draft_model", 1)]["tokens_per_s"]
    summary["speedup_vs_hf_assisted_batch1"] = spec1 / hf["assisted_batch1_tokens_per_s"]
    summary["speedup_vs_hf_plain_batch1"] = spec1 / hf["plain_batch1_tokens_per_s"]
    specb = rows[("draft_model", batch)]["tokens_per_s"]
    summary[f"speedup_vs_hf_plain_batch{batch}"] = specb / hf[f"plain_batch{batch}_tokens_per_s"]
    print(f"\nbatch 1, speculation on: {summary['speedup_vs_hf_assisted_batch1']:.1f}x "
          f"Transformers assisted, {summary['speedup_vs_hf_plain_batch1']:.1f}x its greedy; "
          f"batch {batch}: {summary[f'speedup_vs_hf_plain_batch{batch}']:.1f}x its greedy")
    same = sum(a["token_ids"] == b for a, b in
               zip(rows[("off", 1)]["requests"], hf.get("plain_batch1_token_ids", [])))
    print(f"greedy outputs identical to Transformers' for {same} of {len(rows[('off', 1)]['requests'])} "
          f"prompts (bf16 kernels differ; near-ties may split)")
    summary["greedy_identical_to_hf"] = same
json.dump(summary, open(os.path.join(out, "e2e_summary.json"), "w"), indent=1)
PY
