#!/usr/bin/env bash
# treespec's launcher for one host (issue 4, item 6): starts N drafters and M verifiers as
# separate processes, hands out GPUs through CUDA_VISIBLE_DEVICES (a drafter gets one, a
# verifier --tp), waits until each serves (its "listening on" line: the verifier prints it once
# the model is loaded and health is SERVING), prints the addresses, and stops them cleanly —
# verifiers first, so their running requests drain while the drafters still draft for them.
#
#   tools/launch.sh up [options]           start, print, stay until Ctrl-C (or `down`)
#   tools/launch.sh up --detach [options]  start, print, return (the services keep running)
#   tools/launch.sh down --run_dir DIR     stop what `up` started with that --run_dir
#   tools/launch.sh status --run_dir DIR   which of them still run
#
# Options of `up` (--name value or --name=value):
#   --drafters N         drafter processes (default 1; 0: verifiers without speculation)
#   --verifiers M        verifier processes (default 1)
#   --tp K               tensor-parallel ranks per verifier (default 1)
#   --gpus LIST|all|none GPUs to hand out, drafters first (one each), then verifiers (K each);
#                        all (the default) = every GPU nvidia-smi lists, none = CPU only
#   --drafter_gpus LIST, --verifier_gpus LIST
#                        one list per role instead (they may overlap: roles sharing GPUs)
#   --device D           --device for the services when they have GPUs (default auto)
#   --host H             address to listen on (default 127.0.0.1)
#   --port_base P        drafter i on P+i, verifier j on P+N+j, metrics on port+1000
#                        (default 0: free ports, read back from the services)
#   --bin DIR            the binaries (default build/bin)
#   --model DIR, --draft_model DIR   (default models/tiny-target, models/tiny-draft)
#   --drafter_arg ARG, --verifier_arg ARG   extra flag for every drafter / verifier (repeatable)
#   --run_dir DIR        logs, pids and launch.env go here (default: a new /tmp directory)
#   --stop_timeout_s S   SIGKILL a service this long after SIGTERM (default 40: the services'
#                        default 30 s drain, and margin)
#   --quiet              print nothing but errors
#
# DIR/launch.env is shell you can source: DRAFTER_ADDRS, DRAFTER_METRICS, DRAFTER_TARGET (what
# the verifiers got as --drafter), VERIFIER_ADDRS, VERIFIER_METRICS (comma-separated, ready for
# treespec-loadgen --target and --metrics_urls), RUN_DIR.
#
# A script rather than a C++ tool: it only starts processes, sets their environment, reads two
# lines of their output and sends signals — what the shell does natively — and it needs no
# build, like the demo that uses it.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/services.sh

die() { echo "launch.sh: $*" >&2; exit 2; }

# gpu_list SPEC ARRAY: "0,1,2" -> those; "none" -> empty; "all" -> every GPU nvidia-smi lists
# (none without it). Sets the array named ARRAY (a nameref, hence SC2034).
# shellcheck disable=SC2034
gpu_list() {
  local -n out=$2
  out=()
  case "$1" in
    none) ;;
    all)
      if command -v nvidia-smi >/dev/null 2>&1; then
        mapfile -t out < <(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null |
                           tr -d ' ' || true)
      fi ;;
    *)
      [[ "$1" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "GPU list '$1': expected indices like 0,1,2, all or none"
      IFS=, read -r -a out <<<"$1" ;;
  esac
}

is_ipv4() { [[ "$1" =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]]; }

# Stops every service listed in $1/pids: verifiers first (they drain), then drafters. A
# launcher still in the foreground is asked to do it (its trap stops them in that order).
stop_all() {
  local run_dir=$1 timeout_s=${2:-40}
  [ -f "$run_dir/pids" ] || return 0
  local role r pid launcher
  local -a stoppers
  launcher=$(cat "$run_dir/launcher.pid" 2>/dev/null || true)
  if [ -n "$launcher" ] && [ "$launcher" != "$$" ] && alive "$launcher"; then
    kill -TERM "$launcher"
    while alive "$launcher"; do sleep 0.2; done
    return 0
  fi
  for role in verifier drafter; do
    stoppers=()
    while read -r r _ pid; do
      if [ "$r" = "$role" ]; then
        stop_service "$pid" "$timeout_s" &
        stoppers+=($!)
      fi
    done <"$run_dir/pids"
    # Only these: a bare `wait` would also wait for the services still running (our children).
    [ ${#stoppers[@]} -eq 0 ] || wait "${stoppers[@]}"
  done
  rm -f "$run_dir/pids" "$run_dir/launcher.pid"
}

up() {
  local drafters=1 verifiers=1 tp=1 gpus=all drafter_gpus="" verifier_gpus="" device=auto
  local host=127.0.0.1 port_base=0 bin=build/bin model=models/tiny-target
  local draft_model=models/tiny-draft run_dir="" stop_timeout_s=40 detach=0 quiet=0
  local -a drafter_args=() verifier_args=()
  while [ $# -gt 0 ]; do
    local opt=$1
    if [[ "$opt" == --*=* ]]; then  # --name=value as well as --name value
      shift
      set -- "${opt%%=*}" "${opt#*=}" "$@"
      opt=$1
    fi
    case "$opt" in
      --detach) detach=1; shift; continue ;;
      --quiet) quiet=1; shift; continue ;;
    esac
    [ $# -ge 2 ] || die "$opt needs a value"
    case "$opt" in
      --drafters) drafters=$2 ;;
      --verifiers) verifiers=$2 ;;
      --tp) tp=$2 ;;
      --gpus) gpus=$2 ;;
      --drafter_gpus) drafter_gpus=$2 ;;
      --verifier_gpus) verifier_gpus=$2 ;;
      --device) device=$2 ;;
      --host) host=$2 ;;
      --port_base) port_base=$2 ;;
      --bin) bin=$2 ;;
      --model) model=$2 ;;
      --draft_model) draft_model=$2 ;;
      --drafter_arg) drafter_args+=("$2") ;;
      --verifier_arg) verifier_args+=("$2") ;;
      --run_dir) run_dir=$2 ;;
      --stop_timeout_s) stop_timeout_s=$2 ;;
      *) die "unknown option '$opt' (see the header of tools/launch.sh)" ;;
    esac
    shift 2
  done
  for n in drafters verifiers tp port_base stop_timeout_s; do
    [[ "${!n}" =~ ^[0-9]+$ ]] || die "--$n '${!n}': expected a whole number"
  done
  [ "$verifiers" -ge 1 ] || die "--verifiers must be >= 1"
  [ "$tp" -ge 1 ] || die "--tp must be >= 1"
  for b in treespec-drafter treespec-verifier; do
    [ -x "$bin/$b" ] || die "$bin/$b not found: build first (tools/build.sh) or pass --bin"
  done
  [ "$drafters" -eq 0 ] || [ -d "$draft_model" ] || die "--draft_model $draft_model: no such directory"
  [ -d "$model" ] || die "--model $model: no such directory"

  # GPU assignment: per-role lists, or one list split drafters first.
  local -a dgpus=() vgpus=()
  if [ -n "$drafter_gpus$verifier_gpus" ]; then
    if [ -z "$drafter_gpus" ] || [ -z "$verifier_gpus" ]; then
      die "--drafter_gpus and --verifier_gpus go together (use none for a CPU role)"
    fi
    gpu_list "$drafter_gpus" dgpus
    gpu_list "$verifier_gpus" vgpus
    if [ ${#dgpus[@]} -gt 0 ] && [ ${#dgpus[@]} -lt "$drafters" ]; then
      die "--drafter_gpus has ${#dgpus[@]} GPUs for $drafters drafters"
    fi
    if [ ${#vgpus[@]} -gt 0 ] && [ ${#vgpus[@]} -lt $(( verifiers * tp )) ]; then
      die "--verifier_gpus has ${#vgpus[@]} GPUs for $verifiers verifiers of --tp $tp"
    fi
  else
    local -a all=()
    gpu_list "$gpus" all
    if [ ${#all[@]} -gt 0 ]; then
      local need=$(( drafters + verifiers * tp ))
      [ ${#all[@]} -ge "$need" ] || die "$drafters drafters and $verifiers verifiers of --tp $tp" \
        "need $need GPUs; --gpus gives ${#all[@]} (${all[*]}). Share with --drafter_gpus and" \
        "--verifier_gpus, or run on the CPU with --gpus none"
      dgpus=("${all[@]:0:drafters}")
      vgpus=("${all[@]:drafters}")
    fi
  fi

  if [ -z "$run_dir" ]; then run_dir=$(mktemp -d /tmp/treespec-launch.XXXXXX); fi
  mkdir -p "$run_dir"
  [ ! -s "$run_dir/pids" ] || die "$run_dir already has running services; tools/launch.sh down --run_dir $run_dir"
  : >"$run_dir/pids"
  trap 'stop_all "$run_dir" "$stop_timeout_s"' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM

  # port_flags INDEX -> the --port and --metrics_port flags of service INDEX
  port_flags() {
    if [ "$port_base" -eq 0 ]; then echo "--port=0 --metrics_port=0"; else
      echo "--port=$(( port_base + $1 )) --metrics_port=$(( port_base + $1 + 1000 ))"; fi
  }
  local -a table=() d_addrs=() d_metrics=() v_addrs=() v_metrics=()
  local i
  for (( i = 0; i < drafters; i++ )); do
    local gpu="" dev=cpu
    if [ ${#dgpus[@]} -gt 0 ]; then gpu=${dgpus[i]}; dev=$device; fi
    # shellcheck disable=SC2046
    start_service D "$run_dir/drafter-$i.log" env CUDA_VISIBLE_DEVICES="$gpu" \
      "$bin/treespec-drafter" --host="$host" $(port_flags "$i") --device="$dev" \
      --draft_model="$draft_model" "${drafter_args[@]}" || exit 1
    echo "drafter $i $D_PID" >>"$run_dir/pids"
    d_addrs+=("$D_ADDR"); d_metrics+=("$D_METRICS")
    table+=("drafter $i $D_ADDR ${D_METRICS:--} ${gpu:-cpu} $D_PID $run_dir/drafter-$i.log")
  done
  local drafter_target=""
  if [ "$drafters" -eq 1 ]; then
    drafter_target=${d_addrs[0]}
  elif [ "$drafters" -gt 1 ]; then
    is_ipv4 "$host" || die "several drafters need an IPv4 --host (the verifiers get an ipv4: target)"
    drafter_target="ipv4:$(IFS=,; echo "${d_addrs[*]}")"
  fi
  for (( i = 0; i < verifiers; i++ )); do
    local gpu="" dev=cpu
    if [ ${#vgpus[@]} -gt 0 ]; then
      gpu=$(IFS=,; echo "${vgpus[*]:i*tp:tp}"); dev=$device
    fi
    # shellcheck disable=SC2046
    start_service V "$run_dir/verifier-$i.log" env CUDA_VISIBLE_DEVICES="$gpu" \
      "$bin/treespec-verifier" --host="$host" $(port_flags $(( drafters + i ))) \
      --device="$dev" --tp="$tp" --model="$model" --drafter="$drafter_target" \
      "${verifier_args[@]}" || exit 1
    echo "verifier $i $V_PID" >>"$run_dir/pids"
    v_addrs+=("$V_ADDR"); v_metrics+=("$V_METRICS")
    table+=("verifier $i $V_ADDR ${V_METRICS:--} ${gpu:-cpu} $V_PID $run_dir/verifier-$i.log")
  done

  {
    echo "RUN_DIR='$run_dir'"
    echo "DRAFTER_ADDRS='$(IFS=,; echo "${d_addrs[*]}")'"
    echo "DRAFTER_METRICS='$(IFS=,; echo "${d_metrics[*]}")'"
    echo "DRAFTER_TARGET='$drafter_target'"
    echo "VERIFIER_ADDRS='$(IFS=,; echo "${v_addrs[*]}")'"
    echo "VERIFIER_METRICS='$(IFS=,; echo "${v_metrics[*]}")'"
  } >"$run_dir/launch.env"
  if [ "$quiet" -eq 0 ]; then
    printf '%-9s %-5s %-21s %-21s %-8s %-8s %s\n' role index address metrics gpus pid log
    local row
    for row in "${table[@]}"; do
      # shellcheck disable=SC2086
      printf '%-9s %-5s %-21s %-21s %-8s %-8s %s\n' $row
    done
    echo "verifiers (treespec-loadgen --target): $(IFS=,; echo "${v_addrs[*]}")"
    echo "verifier metrics (--metrics_urls):     $(IFS=,; echo "${v_metrics[*]}")"
    echo "drafter target (the verifiers' --drafter): ${drafter_target:-none}"
    echo "addresses for scripts: source $run_dir/launch.env"
  fi
  if [ "$detach" -eq 1 ]; then
    trap - EXIT INT TERM
    [ "$quiet" -eq 1 ] || echo "stop with: tools/launch.sh down --run_dir $run_dir"
    return 0
  fi
  echo $$ >"$run_dir/launcher.pid"
  [ "$quiet" -eq 1 ] || echo "running; Ctrl-C (or tools/launch.sh down --run_dir $run_dir) stops them"
  # Stay while all run; a service that exits on its own stops the rest (EXIT trap).
  while true; do
    while read -r role index pid; do
      if ! alive "$pid"; then
        echo "launch.sh: $role $index (pid $pid) exited; stopping the rest. Its log:" >&2
        tail -n 20 "$run_dir/$role-$index.log" >&2 || true
        exit 1
      fi
    done <"$run_dir/pids"
    # `sleep & wait` so a signal interrupts the wait at once.
    sleep 1 & wait $! || true
  done
}

run_dir_arg() {
  if [ "${1:-}" != "--run_dir" ] || [ -z "${2:-}" ]; then die "expected --run_dir DIR"; fi
  [ -d "$2" ] || die "--run_dir $2: no such directory"
  echo "$2"
}

command=${1:-}
[ $# -gt 0 ] && shift
case "$command" in
  up) up "$@" ;;
  down)
    dir=$(run_dir_arg "$@")
    timeout_s=40
    if [ $# -gt 2 ]; then
      if [ "$3" != "--stop_timeout_s" ] || ! [[ "${4:-}" =~ ^[0-9]+$ ]]; then
        die "down: expected --run_dir DIR [--stop_timeout_s S]"
      fi
      timeout_s=$4
    fi
    stop_all "$dir" "$timeout_s" ;;
  status)
    dir=$(run_dir_arg "$@")
    [ -f "$dir/pids" ] || { echo "nothing runs from $dir"; exit 1; }
    while read -r role index pid; do
      if alive "$pid"; then state=running; else state=exited; fi
      echo "$role $index pid $pid $state"
    done <"$dir/pids" ;;
  *) die "usage: tools/launch.sh up|down|status [options] (see the header of tools/launch.sh)" ;;
esac
