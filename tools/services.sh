# shellcheck shell=bash
# Shell helpers to run treespec services on one host (sourced by tools/launch.sh, bench/e2e.sh).
# start_service NAME LOGFILE CMD... : starts CMD in the background in its own session (so a
# Ctrl-C meant for the caller reaches it only through the caller's clean stop), waits for its
# "listening on HOST:PORT" line (at most $START_TIMEOUT_S, default 60, seconds), and sets
# ${NAME}_PID, ${NAME}_ADDR and ${NAME}_METRICS (the "metrics on HOST:PORT" address, or empty).
# CMD's stdout goes to LOGFILE.out, its stderr to LOGFILE.
start_service() {
  local name=$1 log=$2; shift 2
  # Without job control a background child is no process-group leader, so setsid execs CMD in
  # place and $! stays CMD's pid.
  if command -v setsid >/dev/null; then
    setsid "$@" </dev/null >"$log.out" 2>"$log" &
  else
    "$@" </dev/null >"$log.out" 2>"$log" &
  fi
  local pid=$!
  local addr=""
  local tries=$(( ${START_TIMEOUT_S:-60} * 10 ))
  for _ in $(seq 1 "$tries"); do
    addr=$(sed -n 's/.* listening on \(.*\)$/\1/p' "$log.out" | head -n1)
    [ -n "$addr" ] && break
    if ! alive "$pid"; then
      echo "$name failed to start; its log:" >&2; cat "$log" >&2; return 1
    fi
    sleep 0.1
  done
  if [ -z "$addr" ]; then
    echo "$name did not start within ${START_TIMEOUT_S:-60} s; see $log" >&2
    kill -KILL "$pid" 2>/dev/null || true
    return 1
  fi
  printf -v "${name}_PID" '%s' "$pid"
  printf -v "${name}_ADDR" '%s' "$addr"
  printf -v "${name}_METRICS" '%s' "$(sed -n 's/.* metrics on \(.*\)$/\1/p' "$log.out" | head -n1)"
}

# alive PID : whether PID still runs; a zombie (exited, not yet reaped by its parent) does not.
alive() {
  kill -0 "$1" 2>/dev/null || return 1
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0  # no /proc: kill -0 is all we know
  stat=${stat##*) }  # the state letter follows "PID (COMM) "
  [ "${stat:0:1}" != Z ]
}

# stop_service PID [TIMEOUT_S] : SIGTERM (the services drain), then SIGKILL after TIMEOUT_S
# (default 10) seconds.
stop_service() {
  local pid=$1 timeout_s=${2:-10}
  [ -n "$pid" ] || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 $(( timeout_s * 10 ))); do alive "$pid" || return 0; sleep 0.1; done
  echo "pid $pid still running ${timeout_s} s after SIGTERM: killing it" >&2
  kill -KILL "$pid" 2>/dev/null || true
}
