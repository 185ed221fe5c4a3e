# Shell helpers to run treespec services on one host (sourced by demo.sh and friends).
# start_service NAME LOGFILE CMD... : starts CMD in the background, waits for its
# "listening on HOST:PORT" line, and sets ${NAME}_PID and ${NAME}_ADDR.
start_service() {
  local name=$1 log=$2; shift 2
  "$@" >"$log.out" 2>"$log" &
  local pid=$!
  local addr=""
  for _ in $(seq 1 600); do
    addr=$(sed -n 's/.* listening on \(.*\)$/\1/p' "$log.out" | head -n1)
    [ -n "$addr" ] && break
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "$name failed to start; its log:" >&2; cat "$log" >&2; return 1
    fi
    sleep 0.1
  done
  [ -n "$addr" ] || { echo "$name did not start within 60 s; see $log" >&2; return 1; }
  printf -v "${name}_PID" '%s' "$pid"
  printf -v "${name}_ADDR" '%s' "$addr"
}

# stop_service PID : SIGTERM, then SIGKILL after 10 s.
stop_service() {
  local pid=$1
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}
