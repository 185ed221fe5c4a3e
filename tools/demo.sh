#!/usr/bin/env bash
# The demo: installs what is missing, builds, starts a drafter and a verifier as separate
# processes on loopback with the shipped tiny models (tools/launch.sh; the drafter serves the
# draft model and the DFlash drafter, models/tiny-dflash), sends held-out code prompts through the
# public gRPC API with treespec-cli — drafted by the draft model, by DFlash, and without
# speculation — prints the text and the speculation figures, checks every run produced the same
# tokens, and shuts down.
#
#   ./tools/demo.sh                 # all held-out prompts
#   DEMO_PROMPTS=4 ./tools/demo.sh  # fewer prompts
#   DEMO_TARGET=models/tiny-mla-moe ./tools/demo.sh
#       # another target of the tiny vocabulary (e.g. the MLA + MoE one): drafted by the draft
#       # model and by n-grams (DFlash is trained on tiny-target's features), and without
#       # speculation
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/install_deps.sh
./tools/build.sh

bin=build/bin
logs=$(mktemp -d /tmp/treespec-demo.XXXXXX)
prompts=${DEMO_PROMPTS:-0}
max_new=${DEMO_MAX_NEW_TOKENS:-128}
# Both services on the first GPU when there is one (the binaries pick CUDA there if built with
# it), else on the CPU.
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; then
  gpus=(--drafter_gpus 0 --verifier_gpus 0)
else
  gpus=(--gpus none)
fi
target=${DEMO_TARGET:-models/tiny-target}
if [ "$target" = models/tiny-target ]; then
  second=dflash  # the second drafter kind shown: DFlash + DDTree, trained for this target
  drafter_args=(--drafter_arg=--dflash=models/tiny-dflash
                --drafter_arg=--dflash_target=models/tiny-target)
else
  second=ngram
  drafter_args=()
fi
trap 'tools/launch.sh down --run_dir "$logs"' EXIT
tools/launch.sh up --detach --quiet --run_dir "$logs" --bin "$bin" "${gpus[@]}" \
  --drafters 1 --verifiers 1 --model "$target" ${drafter_args[@]+"${drafter_args[@]}"}
# shellcheck source=/dev/null
source "$logs/launch.env"
echo "drafter at $DRAFTER_ADDRS, verifier at $VERIFIER_ADDRS (logs in $logs)"

run() {  # run MODE JSON [EXTRA FLAG]
  $bin/treespec-cli generate --target="$VERIFIER_ADDRS" --mode="$1" \
    --prompts_file=tests/data/heldout_prompts.jsonl --limit="$prompts" \
    --max_new_tokens="$max_new" --json_out="$2" ${3:+"$3"}
}
echo; echo "=== speculation on: the draft model's tree ==="
run draft_model "$logs/draft_model.json"
if [ "$second" = dflash ]; then
  echo; echo "=== speculation on: DFlash + DDTree (one drafter forward per step) ==="
else
  echo; echo "=== speculation on: n-gram drafts from the context ==="
fi
run "$second" "$logs/second.json" --quiet
echo; echo "=== speculation off (target only) ==="
run off "$logs/plain.json" --quiet

python3 - "$second" "$logs/draft_model.json" "$logs/second.json" "$logs/plain.json" <<'PY'
import json, sys
second = {"dflash": "DFlash", "ngram": "n-gram"}[sys.argv[1]]
runs = {name: json.load(open(p)) for name, p in zip(("draft model", second, "off"), sys.argv[2:5])}
plain = [r["token_ids"] for r in runs["off"]["requests"]]
ok = True
print()
for name, r in runs.items():
    same = [x["token_ids"] for x in r["requests"]] == plain
    ok = ok and same
    line = f"{name:12s}: {r['tokens_per_s']:7.1f} tok/s"
    if name != "off":
        line += (f" ({r['tokens_per_s'] / runs['off']['tokens_per_s']:.2f}x off), mean acceptance "
                 f"length {r['mean_acceptance_length']:.2f}, acceptance per depth "
                 + " ".join(f"{x:.2f}" for x in r["acceptance_per_depth"][:8])
                 + f"; same tokens as off: {'yes' if same else 'NO'}")
    print(line)
sys.exit(0 if ok else 1)
PY
