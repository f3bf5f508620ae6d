#!/usr/bin/env bash
# Runs the LOADGEN_RESULTS.md measurements: floor vs jsonrpsee_server over HTTP (and the
# TCP floor), the server pinned to CPU 1 and loadgen to CPU 0 ("split"), or both on CPU 0
# ("shared"). Each run starts a fresh server on an ephemeral port.
#
#   cargo build --release -p benches --bins
#   benches/scripts/loadgen_results.sh [REPEATS] > runs.jsonl
#
# BIN (default target/release) holds the binaries; ONLY (a regex) picks runs by label.
# Prints one line per run: the label, the CPU seconds used by loadgen, by the server and
# by everything else on the machine during the run (noise), then loadgen's JSON summary.
# Waits for the machine to be free of compilers before each run, and runs again (up to
# 4 tries; the noisy tries go to stderr) when other processes used more than MAX_OTHERS
# CPU seconds (default 1) during it.
set -euo pipefail
BIN=${BIN:-target/release}
REPEATS=${1:-3}
WARMUP=${WARMUP:-2}
DURATION=${DURATION:-10}
ONLY=${ONLY:-.}
MAX_OTHERS=${MAX_OTHERS:-1}

# Waits (up to 5 minutes) until no rustc/cc is running: the machine is shared.
wait_quiet() {
  for _ in $(seq 300); do
    pgrep -x rustc >/dev/null || pgrep -x cc >/dev/null || pgrep -x ld >/dev/null || return 0
    sleep 1
  done
}

# run LABEL PLACEMENT SERVER KIND -- LOADGEN_ARGS...
# SERVER is floor or jsonrpsee_server; KIND is tcp or http (which address to target).
run() {
  [[ $1 =~ $ONLY ]] || return 0
  local try line
  for try in 1 2 3 4; do
    line=$(run_once "$@")
    if [[ $try == 4 ]] || awk -v m="$MAX_OTHERS" '{
        for (i = 1; i <= NF; i++) if ($i ~ /^others_cpu=/) { split($i, a, "="); exit !(a[2] <= m) }
      }' <<<"$line"; then
      echo "$line"
      return 0
    fi
    echo "noisy, again: $line" >&2
  done
}

run_once() {
  local label=$1 placement=$2 server=$3 kind=$4
  shift 5
  local server_cpu=1
  [[ $placement == shared ]] && server_cpu=0
  local out
  out=$(mktemp)
  if [[ $server == floor ]]; then
    taskset -c "$server_cpu" "$BIN/floor" --tcp 127.0.0.1:0 --http 127.0.0.1:0 >"$out" &
  else
    taskset -c "$server_cpu" "$BIN/jsonrpsee_server" --http 127.0.0.1:0 --threads 1 >"$out" &
  fi
  local pid=$!
  for _ in $(seq 100); do grep -q "listening $kind" "$out" && break; sleep 0.05; done
  local addr
  addr=$(awk -v k="$kind" '$1 == "listening" && $2 == k {print $3}' "$out")
  local target=(--tcp "$addr")
  [[ $kind == http ]] && target=(--http "http://$addr/")
  wait_quiet
  # CPU used by everything else during the run: the machine's busy time minus the
  # server's and loadgen's own (noise to judge a figure by).
  local busy0 times json rc=0
  busy0=$(awk '/^cpu /{print $2+$3+$4+$7+$8+$9}' /proc/stat)
  times=$(mktemp)
  json=$(taskset -c 0 /usr/bin/time -f "%e %U %S" -o "$times" "$BIN/loadgen" "${target[@]}" \
    --warmup "$WARMUP" --duration "$DURATION" "$@" 2>/dev/null) || rc=$?
  local busy1 server_ticks
  busy1=$(awk '/^cpu /{print $2+$3+$4+$7+$8+$9}' /proc/stat)
  server_ticks=$(awk '{print $14+$15}' "/proc/$pid/stat")
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  local tck
  tck=$(getconf CLK_TCK)
  local cpu
  cpu=$(awk -v b0="$busy0" -v b1="$busy1" -v st="$server_ticks" -v t="$tck" \
    '{printf "wall=%.1f loadgen_cpu=%.1f server_cpu=%.1f others_cpu=%.1f", $1, $2+$3, st/t, (b1-b0-st)/t-($2+$3)}' \
    "$times")
  rm -f "$out" "$times"
  echo "$label placement=$placement rc=$rc $cpu $json"
}

for r in $(seq "$REPEATS"); do
  for s in floor jsonrpsee_server; do
    nv=()
    [[ $s == floor ]] && nv=(--no-verify)
    run "$s http 16x1 #$r" split "$s" http -- --connections 16 --depth 1 "${nv[@]}"
    run "$s http 16x16 #$r" split "$s" http -- --connections 16 --depth 16 "${nv[@]}"
    run "$s http 16x1 batch16-add #$r" split "$s" http -- --connections 16 --depth 1 --batch 16 --mix add "${nv[@]}"
    run "$s http 1x1 #$r" shared "$s" http -- --connections 1 --depth 1 "${nv[@]}"
  done
  run "floor tcp 16x64 #$r" split floor tcp -- --connections 16 --depth 64 --no-verify
  run "floor tcp 1x1 #$r" shared floor tcp -- --connections 1 --depth 1 --no-verify
  # For contrast: one request at a time across two CPUs pays a cross-CPU wake-up per hop.
  run "floor tcp 1x1 split #$r" split floor tcp -- --connections 1 --depth 1 --no-verify
done
