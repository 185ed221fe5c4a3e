#!/usr/bin/env bash
# Multi-turn conversations with the verifier's prefix cache on and off (issue 37): per
# speculation mode, treespec-loadgen --workload=conversation against a fresh verifier each time;
# TTFT per turn, the share of the earlier turns' tokens reused, output tokens/s. Writes
# OUT_DIR/conversation.json.
#
#   bench/conversation.sh [OUT_DIR]
#
# Environment: BIN (build/bin), RUN (a command prefix, e.g. a gpu-bundle's run), DEVICE (cpu),
# TARGET (models/tiny-target), MODES ("off draft_model dflash"), CACHE ("on off"),
# CONVERSATIONS (4), TURNS (8), HISTORY (512 tokens in turn 1), TURN_INPUT (128 new tokens per
# later turn), OUTPUT (64 tokens per answer), VERIFIER_FLAGS (extra verifier flags).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/services.sh
out=${1:-$(mktemp -d /tmp/treespec-conversation.XXXXXX)}
mkdir -p "$out"
bin=${BIN:-build/bin}
run=${RUN:-}
device=${DEVICE:-cpu}
target=${TARGET:-models/tiny-target}
read -r -a verifier_extra <<<"${VERIFIER_FLAGS:-}"
trap 'stop_service "${VERIFIER_PID:-}"; stop_service "${DRAFTER_PID:-}"' EXIT

for cache in ${CACHE:-on off}; do
  for mode in ${MODES:-off draft_model dflash}; do
    point="$out/${mode}_cache_${cache}"
    # A fresh drafter and verifier per point: nothing cached from the one before; the cache
    # setting applies to both (the draft model's prefix cache with the verifier's).
    start_service DRAFTER "$point.drafter.log" \
      $run $bin/treespec-drafter --port=0 --draft_model=models/tiny-draft --device="$device" \
      --dflash=models/tiny-dflash --dflash_target=models/tiny-target --prefix_cache="$cache" \
      --metrics_port=0
    start_service VERIFIER "$point.verifier.log" \
      $run $bin/treespec-verifier --port=0 --model="$target" --drafter="$DRAFTER_ADDR" \
      --device="$device" --prefix_cache="$cache" --metrics_port=-1 "${verifier_extra[@]}"
    $run $bin/treespec-loadgen --target="$VERIFIER_ADDR" --workload=conversation \
      --conversations="${CONVERSATIONS:-4}" --turns="${TURNS:-8}" --history_len="${HISTORY:-512}" \
      --turn_input_len="${TURN_INPUT:-128}" --random_output_len="${OUTPUT:-64}" --mode="$mode" \
      --num_warmups=2 --seed=3 --progress=false --result_json="$point.json" >/dev/null
    drafter_hits=$(curl -s "http://$DRAFTER_METRICS/metrics" | awk '/^treespec_drafter_prefix_cache_hit_tokens_total/ {s += $2} END {print s + 0}')
    echo "$drafter_hits" > "$point.drafter_hits"
    stop_service "$VERIFIER_PID"; VERIFIER_PID=
    stop_service "$DRAFTER_PID"; DRAFTER_PID=
    python3 - "$point.json" "$mode" "$cache" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
later = [t for t in d["turns"] if t["turn"] > 1]
ttft = sum(t["mean_ttft_ms"] for t in later) / max(1, len(later))
print(f"{sys.argv[2]:>11} cache {sys.argv[3]:>3}: turn 1 TTFT {d['turns'][0]['mean_ttft_ms']:.1f} ms, "
      f"turns >= 2 {ttft:.1f} ms, reused {d['total_cached_tokens']}/{sum(t['reusable_tokens'] for t in later)}, "
      f"{d['output_throughput']:.0f} tok/s, acceptance {d.get('spec_decode_acceptance_length') or 1:.2f}")
PY
  done
done
python3 - "$out" "$device" "$target" "${MODES:-off draft_model dflash}" "${CACHE:-on off}" <<'PY'
import json, os, sys
out, device, target, modes, caches = sys.argv[1:]
result = {"device": device, "target": target, "points": {}}
for cache in caches.split():
    for mode in modes.split():
        d = json.load(open(os.path.join(out, f"{mode}_cache_{cache}.json")))
        result.setdefault("config", {k: d["config"][k] for k in
                          ("conversations", "turns", "history_len", "turn_input_len",
                           "random_output_len")})
        later = [t for t in d["turns"] if t["turn"] > 1]
        reusable = sum(t["reusable_tokens"] for t in later)
        result["points"][f"{mode}_cache_{cache}"] = {
            "mode": mode, "prefix_cache": cache,
            "ttft_ms_by_turn": [t["mean_ttft_ms"] for t in d["turns"]],
            "mean_ttft_ms_turns_2_on": sum(t["mean_ttft_ms"] for t in later) / max(1, len(later)),
            "cached_tokens": d["total_cached_tokens"], "reusable_tokens": reusable,
            "reused_share": d["total_cached_tokens"] / reusable if reusable else None,
            "drafter_cached_tokens": int(float(open(os.path.join(out, f"{mode}_cache_{cache}.drafter_hits")).read())),
            "output_tokens_per_s": d["output_throughput"],
            "acceptance_length": d.get("spec_decode_acceptance_length"),
            "completed": d["completed"], "failed": d["failed"]}
json.dump(result, open(os.path.join(out, "conversation.json"), "w"), indent=1)
PY
echo "wrote $out/conversation.json"
