#!/usr/bin/env bash
# The demo: installs what is missing, builds, starts a drafter and a verifier as separate
# processes on loopback with the shipped tiny model pair (tools/launch.sh), sends held-out code
# prompts through the public gRPC API with treespec-cli — with speculation and without — prints
# the text and the speculation figures, checks both runs produced the same tokens, and shuts
# down.
#
#   ./tools/demo.sh                 # all held-out prompts
#   DEMO_PROMPTS=4 ./tools/demo.sh  # fewer prompts
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
trap 'tools/launch.sh down --run_dir "$logs"' EXIT
tools/launch.sh up --detach --quiet --run_dir "$logs" --bin "$bin" "${gpus[@]}" \
  --drafters 1 --verifiers 1
# shellcheck source=/dev/null
source "$logs/launch.env"
echo "drafter at $DRAFTER_ADDRS, verifier at $VERIFIER_ADDRS (logs in $logs)"

run() {  # run MODE JSON [EXTRA FLAG]
  $bin/treespec-cli generate --target="$VERIFIER_ADDRS" --mode="$1" \
    --prompts_file=tests/data/heldout_prompts.jsonl --limit="$prompts" \
    --max_new_tokens="$max_new" --json_out="$2" ${3:+"$3"}
}
echo; echo "=== speculation on (draft model, tree) ==="
run auto "$logs/spec.json"
echo; echo "=== speculation off (target only) ==="
run off "$logs/plain.json" --quiet

python3 - "$logs/spec.json" "$logs/plain.json" <<'PY'
import json, sys
spec, plain = (json.load(open(p)) for p in sys.argv[1:3])
same = [a["token_ids"] for a in spec["requests"]] == [b["token_ids"] for b in plain["requests"]]
print()
print(f"speculation on : {spec['tokens_per_s']:.1f} tok/s, mean acceptance length "
      f"{spec['mean_acceptance_length']:.2f}, acceptance per depth "
      + " ".join(f"{x:.2f}" for x in spec["acceptance_per_depth"]))
print(f"speculation off: {plain['tokens_per_s']:.1f} tok/s")
print(f"speedup {spec['tokens_per_s'] / plain['tokens_per_s']:.2f}x; "
      f"outputs identical: {'yes' if same else 'NO'}")
sys.exit(0 if same else 1)
PY
