#!/usr/bin/env bash
# Cost of the HTTP response headers added in ced80e6c (`Date` on every response,
# `Keep-Alive: timeout=N` on keep-alive responses when there is an idle timeout),
# comparing two builds of the server example, e.g. from 3f512c3f (before) and
# 1a68777f (after):
#
#   bash benches/scripts/http_headers_cost.sh BEFORE_SERVER AFTER_SERVER LOADGEN
#
# Build each with `cargo build --release --example server -p examples` in its own
# worktree/CARGO_TARGET_DIR; LOADGEN is one `cargo build --release -p benches --bin
# loadgen`, used for all load. Environment knobs (defaults in brackets):
#   COUNT [50000]   HTTP requests per callgrind run (16 connections x 1 in flight)
#   ROUNDS [3]      throughput rounds per shape (before then after in odd rounds, after then
#                   before in even ones)
#   DURATION [5]    seconds measured per throughput run (after 1 s of warm-up)
#   SKIP_CALLGRIND=1 / SKIP_THROUGHPUT=1 to run one part only
#
# 1. callgrind: user-space instructions per request (deterministic up to how many
#    requests each event-loop turn finds ready), for before and after, each with the
#    default idle timeout (as shipped; after adds Date + Keep-Alive) and with
#    `--idle-timeout-ms 0` (after adds Date only). "net" subtracts a run of the same
#    server with no load (startup + shutdown); "raw" divides the whole total by COUNT.
# 2. throughput: server pinned to CPU 1, loadgen to CPU 0, 16 connections at depth 1
#    and at depth 16, requests/s per run and after/before per round (noisy; read the
#    ratios). Both servers as shipped (default idle timeout).
#
# Servers listen on 127.0.0.1:7770 (before) and 127.0.0.1:7771 (after); TCP is off.
set -euo pipefail

if [ $# -ne 3 ]; then
  awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0" >&2
  exit 2
fi
before=$(realpath "$1")
after=$(realpath "$2")
lg=$(realpath "$3")
count=${COUNT:-50000}
rounds=${ROUNDS:-3}
duration=${DURATION:-5}
for f in "$before" "$after" "$lg"; do [ -x "$f" ] || { echo "not executable: $f" >&2; exit 2; }; done

out=$(mktemp -d /tmp/http_headers_cost.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# wait_listen PORT SECONDS: until something listens on 127.0.0.1:PORT (no connection made).
wait_listen() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    if ss -Hltn "sport = :$1" | grep -q .; then return 0; fi
    sleep 0.1
  done
  echo "nothing listening on port $1 after $2 s" >&2
  return 1
}

# stop PID SIGNAL: signal the server and wait up to 120 s for it to end (then KILL).
stop() {
  local i
  kill "-$2" "$1" 2>/dev/null || true
  for ((i = 0; i < 1200; i++)); do
    kill -0 "$1" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

port_free() {
  if ss -Hltn "sport = :$1" | grep -q .; then
    echo "port $1 is already in use" >&2
    exit 1
  fi
}

# Total Ir of a callgrind profile.
total_ir() {
  callgrind_annotate "$1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'
}

# callgrind_run NAME SERVER PORT LOAD(0|1) [SERVER ARGS...]: sets ir to the total Ir.
# (Not run in $(...), so the EXIT trap knows the server's pid.)
callgrind_run() {
  local name=$1 server=$2 port=$3 load=$4
  shift 4
  port_free "$port"
  valgrind --tool=callgrind --callgrind-out-file="$out/$name.cg" \
    "$server" --tcp off --http "127.0.0.1:$port" "$@" >"$out/$name.log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  wait_listen "$port" 60
  if [ "$load" = 1 ]; then
    timeout 600 "$lg" --http "http://127.0.0.1:$port/" --depth 1 --connections 16 \
      --count "$count" --no-verify >"$out/$name.loadgen.json" 2>"$out/$name.loadgen.err"
  fi
  stop "$pid" INT # ringrpc shuts down gracefully on SIGINT
  ir=$(total_ir "$out/$name.cg")
  [ -n "$ir" ] || { echo "no callgrind total for $name (see $out/$name.log)" >&2; exit 1; }
}

if [ "${SKIP_CALLGRIND:-0}" != 1 ]; then
  echo "== callgrind: HTTP 16 connections x 1, $count requests (instructions per request)"
  printf '%-28s %15s %10s %10s\n' config total_Ir raw/req net/req
  declare -A net
  for cfg in "before default 7770" "before idle0 7770" "after idle0 7771" "after default 7771"; do
    read -r which idle port <<<"$cfg"
    bin=$before
    [ "$which" = after ] && bin=$after
    args=()
    [ "$idle" = idle0 ] && args=(--idle-timeout-ms 0)
    callgrind_run "$which-$idle-noload" "$bin" "$port" 0 ${args[@]+"${args[@]}"}
    base=$ir
    callgrind_run "$which-$idle" "$bin" "$port" 1 ${args[@]+"${args[@]}"}
    total=$ir
    raw=$(awk -v t="$total" -v c="$count" 'BEGIN { printf "%.1f", t / c }')
    net[$which-$idle]=$(awk -v t="$total" -v b="$base" -v c="$count" 'BEGIN { printf "%.1f", (t - b) / c }')
    printf '%-28s %15s %10s %10s\n' "$which ${args[*]:-(default idle)}" "$total" "$raw" "${net[$which-$idle]}"
  done
  d() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%+.1f", a - b }'; }
  echo "Date only   (after idle0 - before idle0):     $(d "${net[after-idle0]}" "${net[before-idle0]}") instr/req"
  echo "as shipped  (after default - before default): $(d "${net[after-default]}" "${net[before-default]}") instr/req"
  ka=$(awk -v ad="${net[after-default]}" -v a0="${net[after-idle0]}" -v bd="${net[before-default]}" -v b0="${net[before-idle0]}" \
    'BEGIN { printf "%+.1f", (ad - a0) - (bd - b0) }')
  echo "Keep-Alive  ((after default - after idle0) - (before default - before idle0)): $ka instr/req"
  echo "profiles: $out/*.cg"
  echo
fi

if [ "${SKIP_THROUGHPUT:-0}" != 1 ]; then
  echo "== throughput: server on CPU 1, loadgen on CPU 0, ${duration} s after 1 s warm-up (requests/s)"
  port_free 7770
  port_free 7771
  taskset -c 1 "$before" --tcp off --http 127.0.0.1:7770 >"$out/before.log" 2>&1 &
  pb=$!
  pids+=("$pb")
  taskset -c 1 "$after" --tcp off --http 127.0.0.1:7771 >"$out/after.log" 2>&1 &
  pa=$!
  pids+=("$pa")
  wait_listen 7770 10
  wait_listen 7771 10
  rps() {
    timeout $((duration + 60)) taskset -c 0 "$lg" --http "http://127.0.0.1:$1/" --connections 16 --depth "$2" \
      --duration "$duration" --warmup 1 --no-verify 2>/dev/null | grep -o '"rps":[0-9.]*' | cut -d: -f2
  }
  printf '%-8s %-6s %12s %12s %8s\n' shape round before after ratio
  for depth in 1 16; do
    for ((r = 1; r <= rounds; r++)); do
      if ((r % 2)); then # alternate which goes first, so a drift in the machine's load favours neither
        b=$(rps 7770 "$depth")
        a=$(rps 7771 "$depth")
      else
        a=$(rps 7771 "$depth")
        b=$(rps 7770 "$depth")
      fi
      ratio=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", a / b }')
      printf '%-8s %-6s %12.0f %12.0f %8s\n' "16x$depth" "$r" "$b" "$a" "$ratio"
    done
  done
  stop "$pb" INT
  stop "$pa" INT
fi
