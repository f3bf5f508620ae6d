#!/usr/bin/env bash
# Side-by-side server comparison with loadgen: ringrpc's server example, the echo floor
# (fixed answers, no parsing) and a jsonrpsee 0.26 HTTP server with the same methods.
#
#   bash benches/scripts/compare.sh [SECONDS] [ROUNDS]
#
# Placements: "split" = server on CPU 1, loadgen on CPU 0; "shared" = both on CPU 0.
# Throughput runs use --no-verify for every server alike, so the client's cost per
# answer is the same whichever server answers; a short verified run per server checks
# correctness first. Each round measures all servers back to back; prints one JSON summary per run,
# prefixed by its label, and the server's CPU seconds during the run.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-5}
rounds=${2:-3}
cargo build --release -q --example server -p examples
cargo build --release -q -p benches --bins
bin=${CARGO_TARGET_DIR:-target}/release
LG=$bin/loadgen

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

started=
start() { # cpu, command... (sets $started to the pid)
  local cpu=$1; shift
  taskset -c "$cpu" "$@" >/dev/null 2>&1 &
  started=$!
  pids+=("$started")
  sleep 1
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

run() { # label, server pid, loadgen cpu, loadgen args...
  local label=$1 pid=$2 cpu=$3; shift 3
  local before after out
  before=$(cpu_ticks "$pid")
  out=$(taskset -c "$cpu" $LG "$@" 2>/tmp/compare.loadgen.err || echo "{\"failed\": true}")
  after=$(cpu_ticks "$pid")
  echo "$label server_cpu_ticks=$((after - before)) $out"
}

for placement in split shared; do
  if [ "$placement" = split ]; then scpu=1; else scpu=0; fi
  start $scpu $bin/examples/server --tcp 127.0.0.1:7700 --http 127.0.0.1:7701 --idle-timeout-ms 0
  r=$started
  start $scpu $bin/floor --tcp 127.0.0.1:7800 --http 127.0.0.1:7801
  f=$started
  start $scpu $bin/jsonrpsee_server --http 127.0.0.1:7901
  j=$started
  # Correctness first, verified.
  for s in "ringrpc|$r|--tcp|127.0.0.1:7700" "ringrpc|$r|--http|http://127.0.0.1:7701/" "jsonrpsee|$j|--http|http://127.0.0.1:7901/"; do
    IFS='|' read -r name pid a1 a2 <<<"$s"
    run "$placement verify $name $a1" "$pid" 0 $a1 $a2 --connections 4 --depth 4 --count 20000 --mix subtract:3,add:1,ping:1,echo:1
  done
  for round in $(seq "$rounds"); do
    common=(--no-verify --duration "$secs" --warmup 1)
    run "$placement r$round tcp16x64 ringrpc" "$r" 0 --tcp 127.0.0.1:7700 --connections 16 --depth 64 "${common[@]}"
    run "$placement r$round tcp16x64 floor" "$f" 0 --tcp 127.0.0.1:7800 --connections 16 --depth 64 "${common[@]}"
    run "$placement r$round tcp16x1 ringrpc" "$r" 0 --tcp 127.0.0.1:7700 --connections 16 --depth 1 "${common[@]}"
    run "$placement r$round tcp16x1 floor" "$f" 0 --tcp 127.0.0.1:7800 --connections 16 --depth 1 "${common[@]}"
    run "$placement r$round http16x1 ringrpc" "$r" 0 --http http://127.0.0.1:7701/ --connections 16 --depth 1 "${common[@]}"
    run "$placement r$round http16x1 floor" "$f" 0 --http http://127.0.0.1:7801/ --connections 16 --depth 1 "${common[@]}"
    run "$placement r$round http16x1 jsonrpsee" "$j" 0 --http http://127.0.0.1:7901/ --connections 16 --depth 1 "${common[@]}"
    run "$placement r$round http16x16 ringrpc" "$r" 0 --http http://127.0.0.1:7701/ --connections 16 --depth 16 "${common[@]}"
    run "$placement r$round http16x16 floor" "$f" 0 --http http://127.0.0.1:7801/ --connections 16 --depth 16 "${common[@]}"
    run "$placement r$round http16x16 jsonrpsee" "$j" 0 --http http://127.0.0.1:7901/ --connections 16 --depth 16 "${common[@]}"
    run "$placement r$round httpbatch16 ringrpc" "$r" 0 --http http://127.0.0.1:7701/ --connections 16 --depth 1 --batch 16 --mix add "${common[@]}"
    run "$placement r$round httpbatch16 jsonrpsee" "$j" 0 --http http://127.0.0.1:7901/ --connections 16 --depth 1 --batch 16 --mix add "${common[@]}"
    run "$placement r$round tcp1x1 ringrpc" "$r" 0 --tcp 127.0.0.1:7700 --connections 1 --depth 1 "${common[@]}"
    run "$placement r$round tcp1x1 floor" "$f" 0 --tcp 127.0.0.1:7800 --connections 1 --depth 1 "${common[@]}"
  done
  cleanup
  pids=()
  sleep 0.5
done
