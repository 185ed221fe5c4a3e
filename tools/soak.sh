#!/usr/bin/env bash
# treespec's soak test (issue 5, item 6): one drafter and one verifier on the CPU with the
# embedded tiny pair (started by tools/launch.sh), open-loop Poisson load from treespec-loadgen
# for a set time with a share of the requests cancelled by the client, while the drafter is
# SIGKILLed at random intervals and restarted on the same port a few seconds later (the verifier
# must serve on without speculation meanwhile, then reconnect). Then a report and a verdict:
#   PASS when no request failed (cancelled ones are counted apart), the services' resident
#   memory grew by at most --rss_bound_mib from start (after warm-up) to end, the verifier still
#   runs, every restart came up and drafted again (the verifier reconnected), and the harness's
#   run ended normally (its check of the verifier's speculation counters included).
# Exit 0 on PASS, 1 on FAIL, 2 for bad options or a setup that could not start.
#
#   tools/soak.sh                                  # 10 minutes, as recorded in docs/reliability.md
#   tools/soak.sh --duration_s 45 --warmup_s 10    # the CI run (ctest -R soak_short)
#
# Options (--name value or --name=value):
#   --duration_s S        load for this long (default 600)
#   --warmup_s S          load before the start memory sample, same settings, no kills (default 20)
#   --request_rate R      requests per second, Poisson arrivals (default 4)
#   --max_concurrency N   requests in flight at most (default 0: no bound)
#   --output_len N        tokens per request, EOS ignored (default 64)
#   --cancel_fraction F   share of the requests the client cancels (default 0.1)
#   --kill_every_s A[-B]  SIGKILL the drafter every A..B seconds, uniform (default 30-60)
#   --down_s S            the drafter stays down this long before its restart (default 3)
#   --rss_bound_mib M     largest allowed growth of each service's VmRSS (default 32; see
#                         docs/reliability.md for the measurements behind it)
#   --seed N              seeds the load (dataset order, arrivals, cancels) and the kill times
#   --out_dir DIR         logs, the harness's files, rss.tsv, restarts.tsv and report.json
#                         (default: a new /tmp directory)
#   --bin DIR             the binaries (default build/bin)
#
# The drafter's memory is per incarnation (a restart starts a fresh process), so its growth is
# checked as the largest VmRSS any incarnation reached (sampled every 5 s and just before each
# kill) over the first one's start figure; the verifier lives through the whole soak.
#
# Everything runs from main(), read whole before it starts: editing this file during a soak
# cannot change the running one.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/services.sh

die() { echo "soak.sh: $*" >&2; exit 2; }
log() { echo "soak.sh: $(date +%H:%M:%S) $*"; }

# Sets the option variables (each option sets the variable of its name) and checks them.
parse_options() {
  duration_s=600 warmup_s=20 request_rate=4 max_concurrency=0 output_len=64 cancel_fraction=0.1
  kill_every_s=30-60 down_s=3 rss_bound_mib=32 seed=0 out_dir="" bin=build/bin
  local options=" duration_s warmup_s request_rate max_concurrency output_len cancel_fraction
    kill_every_s down_s rss_bound_mib seed out_dir bin "
  local arg name value n b
  while [ $# -gt 0 ]; do
    arg=$1
    shift
    [[ "$arg" == --* ]] ||
      die "unexpected argument '$arg' (options are --name value or --name=value)"
    name=${arg#--}
    if [[ "$name" == *=* ]]; then
      value=${name#*=} name=${name%%=*}
    else
      [ $# -ge 1 ] || die "$arg needs a value"
      value=$1
      shift
    fi
    [[ "$options" == *[[:space:]]"$name"[[:space:]]* ]] ||
      die "unknown option '--$name' (see the header of tools/soak.sh)"
    printf -v "$name" '%s' "$value"
  done
  for n in duration_s warmup_s max_concurrency output_len down_s rss_bound_mib seed; do
    [[ "${!n}" =~ ^[0-9]+$ ]] || die "--$n '${!n}': expected a whole number"
  done
  [ "$duration_s" -ge 1 ] || die "--duration_s must be >= 1"
  [[ "$request_rate" =~ ^[0-9]*\.?[0-9]+$ ]] ||
    die "--request_rate '$request_rate': expected a number"
  [[ "$cancel_fraction" =~ ^(0(\.[0-9]+)?|1(\.0*)?|\.[0-9]+)$ ]] ||
    die "--cancel_fraction '$cancel_fraction': expected a number in [0, 1]"
  [[ "$kill_every_s" =~ ^([0-9]+)(-([0-9]+))?$ ]] ||
    die "--kill_every_s '$kill_every_s': expected seconds, or a range like 30-60"
  kill_min=${BASH_REMATCH[1]} kill_max=${BASH_REMATCH[3]:-${BASH_REMATCH[1]}}
  if [ "$kill_min" -lt 1 ] || [ "$kill_max" -lt "$kill_min" ]; then
    die "--kill_every_s '$kill_every_s': expected 1 <= A <= B"
  fi
  for b in treespec-drafter treespec-verifier treespec-loadgen; do
    [ -x "$bin/$b" ] || die "$bin/$b not found: build first (tools/build.sh) or pass --bin"
  done
}

# rss_kib PID : the process's resident memory in KiB (VmRSS), or 0 when it is gone.
rss_kib() {
  awk '/^VmRSS:/ {print $2; found = 1} END {if (!found) print 0}' "/proc/$1/status" 2>/dev/null ||
    echo 0
}

# metric HOST:PORT NAME : the sum of NAME's samples on that /metrics (plain bash: no curl
# needed); three tries a second apart (a loaded machine), then -1.
metric() {
  local host=${1%:*} port=${1##*:} fd value=-1 try
  for try in 1 2 3; do
    [ "$try" -eq 1 ] || sleep 1
    # In braces, so that exec does not keep the 2>/dev/null for the whole shell.
    { exec {fd}<>"/dev/tcp/$host/$port"; } 2>/dev/null || continue
    printf 'GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n' "$1" >&"$fd"
    # shellcheck disable=SC2016  # awk's own $1, $2
    value=$(timeout 5 awk -v n="$2" '{sub(/\r$/, "")} $1 == n || index($1, n "{") == 1 {
      s += $2; f = 1} END {print f ? s : -1}' <&"$fd" || echo -1)
    exec {fd}>&-
    [ "$value" = -1 ] || break
  done
  echo "$value"
}

# loadgen SECONDS [FLAG...] : the harness with the soak's settings.
loadgen() {
  local seconds=$1
  shift
  local rate_flags=(--request_rate="$request_rate")
  [ "$max_concurrency" -eq 0 ] || rate_flags+=(--max_concurrency="$max_concurrency")
  # Enough prompts never to run out before the time does (Poisson: 3x the mean, plus slack).
  local prompts
  prompts=$(awk -v r="$request_rate" -v s="$seconds" 'BEGIN {print int(3 * r * s) + 50}')
  "$bin/treespec-loadgen" --target="$VERIFIER_ADDRS" \
    --dataset_path=tests/data/heldout_prompts.jsonl --jsonl_output_len="$output_len" \
    --num_prompts="$prompts" --duration_s="$seconds" "${rate_flags[@]}" --arrival=poisson \
    --seed="$seed" --cancel_fraction="$cancel_fraction" --percentiles=50,99 --progress=false "$@"
}

# Every 5 s, until the stop file appears: seconds, verifier KiB, drafter KiB, to rss.tsv.
sample_rss() {
  local t0=$SECONDS
  while [ ! -e "$out_dir/stop" ]; do
    printf '%s\t%s\t%s\n' $((SECONDS - t0)) "$(rss_kib "$verifier_pid")" \
      "$(rss_kib "$(cat "$out_dir/drafter.pid")")" >>"$out_dir/rss.tsv"
    sleep 5
  done
}

# restart_drafter N : the first drafter's command on its ports; retried while the port is not
# free yet. Sets drafter_pid.
restart_drafter() {
  local n=$1 attempt
  for attempt in 1 2 3 4 5; do
    if START_TIMEOUT_S=60 start_service RD "$run_dir/drafter-0.restart-$n.log" "${drafter_cmd[@]}" \
      2>>"$out_dir/kills.log"; then
      drafter_pid=$RD_PID
      return 0
    fi
    echo "restart $n attempt $attempt failed; retrying" >>"$out_dir/kills.log"
    sleep 1
  done
  return 1
}

# Sleeps A..B s, SIGKILLs the drafter, waits --down_s, restarts it; one line per kill in
# restarts.tsv: n, seconds into the run, the dying incarnation's VmRSS (KiB) and trees drafted,
# restart ok. Leaves the last --down_s + 10 s alone, so the drafter is up at the end.
kill_drafter_loop() {
  RANDOM=$seed
  local t0=$SECONDS n=0 wait_s s rss trees at ok
  while true; do
    wait_s=$((kill_min + RANDOM % (kill_max - kill_min + 1)))
    for ((s = 0; s < wait_s; s++)); do
      [ -e "$out_dir/stop" ] && return 0
      sleep 1
    done
    [ $((SECONDS - t0 + down_s + 10)) -lt "$duration_s" ] || return 0
    n=$((n + 1))
    rss=$(rss_kib "$drafter_pid")
    trees=$(metric "$DRAFTER_METRICS" treespec_drafter_trees_total)
    kill -KILL "$drafter_pid" 2>/dev/null || true
    wait "$drafter_pid" 2>/dev/null || true  # reaps our own restarts (the first is not ours)
    while alive "$drafter_pid"; do sleep 0.1; done
    at=$((SECONDS - t0))
    sleep "$down_s"
    ok=1
    restart_drafter "$n" || ok=0
    printf '%s\t%s\t%s\t%s\t%s\n' "$n" "$at" "$rss" "$trees" "$ok" >>"$out_dir/restarts.tsv"
    [ "$ok" -eq 1 ] || return 1
    echo "$drafter_pid" >"$out_dir/drafter.pid"
    sed -i "s/^drafter 0 .*/drafter 0 $drafter_pid/" "$run_dir/pids"
    echo "$(date +%H:%M:%S) killed drafter at ${at} s (VmRSS ${rss} KiB, ${trees} trees);" \
      "restarted as pid $drafter_pid" >>"$out_dir/kills.log"
  done
}

# The EXIT trap's: stops the killer and the services.
# shellcheck disable=SC2317  # reached through the trap
cleanup() {
  touch "$out_dir/stop"
  if [ -n "$kill_loop" ]; then wait "$kill_loop" 2>/dev/null || true; fi
  if [ -d "$run_dir" ]; then
    tools/launch.sh down --run_dir "$run_dir" --stop_timeout_s 20 || true
  fi
}

main() {
  parse_options "$@"
  local python=/usr/bin/python3  # Debian's (tools/install_deps.sh), for the report
  [ -x "$python" ] || python=python3
  if [ -z "$out_dir" ]; then out_dir=$(mktemp -d /tmp/treespec-soak.XXXXXX); fi
  mkdir -p "$out_dir"
  out_dir=$(cd "$out_dir" && pwd)
  run_dir=$out_dir/services
  rm -rf "$run_dir" "$out_dir/stop" "$out_dir/rss.tsv" "$out_dir/kills.log"
  : >"$out_dir/restarts.tsv"
  kill_loop=""
  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM

  log "starting one drafter and one verifier on the CPU (logs in $run_dir)"
  tools/launch.sh up --detach --quiet --gpus none --drafters 1 --verifiers 1 --bin "$bin" \
    --run_dir "$run_dir" || die "the services did not start (see $run_dir)"
  # shellcheck disable=SC1091
  source "$run_dir/launch.env"
  verifier_pid=$(awk '$1 == "verifier" {print $3}' "$run_dir/pids")
  drafter_pid=$(awk '$1 == "drafter" {print $3}' "$run_dir/pids")
  echo "$drafter_pid" >"$out_dir/drafter.pid"
  # The restart command: the launcher's own, on the ports the first drafter got.
  mapfile -d '' -t drafter_cmd <"/proc/$drafter_pid/cmdline"
  drafter_cmd=("${drafter_cmd[@]/#--port=0/--port=${DRAFTER_ADDRS##*:}}")
  drafter_cmd=("${drafter_cmd[@]/#--metrics_port=0/--metrics_port=${DRAFTER_METRICS##*:}}")

  if [ "$warmup_s" -gt 0 ]; then
    log "warm-up: ${warmup_s} s of load"
    loadgen "$warmup_s" --result_json="$out_dir/warmup.json" >"$out_dir/warmup.log" 2>&1 ||
      die "the warm-up run failed; see $out_dir/warmup.log"
  fi
  sleep 2  # let the last requests' memory settle before sampling
  local verifier_start drafter_start
  verifier_start=$(rss_kib "$verifier_pid")
  drafter_start=$(rss_kib "$drafter_pid")
  log "start VmRSS: verifier $((verifier_start / 1024)) MiB, drafter $((drafter_start / 1024)) MiB"

  sample_rss &
  local sampler=$!
  kill_drafter_loop &
  kill_loop=$!
  log "soak: ${duration_s} s at ${request_rate} req/s, ${cancel_fraction} cancelled, drafter" \
    "killed every ${kill_min}-${kill_max} s; progress in $out_dir/kills.log"
  local loadgen_rc=0 kill_loop_rc=0
  loadgen "$duration_s" --metrics_urls="$VERIFIER_METRICS" --check_metrics \
    --result_json="$out_dir/summary.json" --requests_jsonl="$out_dir/requests.jsonl" \
    >"$out_dir/loadgen.log" 2>&1 || loadgen_rc=$?
  touch "$out_dir/stop"
  wait "$kill_loop" || kill_loop_rc=$?
  kill_loop=""
  wait "$sampler" || true
  drafter_pid=$(cat "$out_dir/drafter.pid")

  sleep 2
  local verifier_alive=0 drafter_alive=0 verifier_end drafter_end final_trees
  alive "$verifier_pid" && verifier_alive=1
  alive "$drafter_pid" && drafter_alive=1
  verifier_end=$(rss_kib "$verifier_pid")
  drafter_end=$(rss_kib "$drafter_pid")
  # The last incarnation's trees, to see that the verifier reached it too.
  final_trees=$(metric "$DRAFTER_METRICS" treespec_drafter_trees_total)
  log "end VmRSS: verifier $((verifier_end / 1024)) MiB, drafter $((drafter_end / 1024)) MiB"

  "$python" tools/soak_report.py --out_dir "$out_dir" --duration_s "$duration_s" \
    --request_rate "$request_rate" --cancel_fraction "$cancel_fraction" \
    --kill_every_s "$kill_min-$kill_max" --down_s "$down_s" --rss_bound_mib "$rss_bound_mib" \
    --loadgen_rc "$loadgen_rc" --kill_loop_rc "$kill_loop_rc" \
    --verifier_rss "$verifier_start,$verifier_end" --drafter_rss "$drafter_start,$drafter_end" \
    --verifier_alive "$verifier_alive" --drafter_alive "$drafter_alive" \
    --final_trees "$final_trees"
}

main "$@"
exit
