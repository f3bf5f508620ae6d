#!/usr/bin/env bash
# ringrpc against jsonrpsee 0.26 with `loadgen --compare`: the demo methods over HTTP,
# the same open-loop load (a fixed rate, latency from each call's due time), rounds
# interleaved; prints the table and writes the JSON and the SVG chart.
#
#   bash benches/scripts/vs_jsonrpsee.sh [OUT]      # OUT.json, OUT.svg (default: docs/loadgen-vs-jsonrpsee)
#
# Environment (defaults in brackets): RATE [10000] messages/s, DURATION [5] s per round and
# server, ROUNDS [3], CONNECTIONS [16], MIX [subtract:3,ping:1,echo:1,add:1,get_data:1,sum:1],
# TRANSPORT [http] (or ws).
# Builds the release binaries, then: both servers on CPU 1 (ringrpc: one reactor;
# jsonrpsee: one tokio worker), loadgen on CPU 0 (with fewer than 2 CPUs, unpinned).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-docs/loadgen-vs-jsonrpsee}
RATE=${RATE:-10000}
DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
CONNECTIONS=${CONNECTIONS:-16}
MIX=${MIX:-subtract:3,ping:1,echo:1,add:1,get_data:1,sum:1}
TRANSPORT=${TRANSPORT:-http}
cargo build --release -q -p examples --example server -p benches --bin loadgen --bin jsonrpsee_server
bin=${CARGO_TARGET_DIR:-target}/release
srv=() lg=()
if [ "$(nproc)" -ge 2 ]; then srv=(taskset -c 1); lg=(taskset -c 0); fi
. benches/scripts/lib.sh vs_jsonrpsee

"${srv[@]}" "$bin/examples/server" --tcp off --http 127.0.0.1:0 --idle-timeout-ms 0 >"$tmp/r.out" 2>&1 &
pids+=($!)
ws=(); [ "$TRANSPORT" = ws ] && ws=(--ws)
"${srv[@]}" "$bin/jsonrpsee_server" --http 127.0.0.1:0 "${ws[@]}" >"$tmp/j.out" 2>&1 &
pids+=($!)
raddr=$(listening "$tmp/r.out" http); jaddr=$(listening "$tmp/j.out" http)

"${lg[@]}" "$bin/loadgen" --compare "ringrpc=$TRANSPORT://$raddr/" "jsonrpsee=$TRANSPORT://$jaddr/" \
  --rate "$RATE" --connections "$CONNECTIONS" --duration "$DURATION" --warmup 1 --rounds "$ROUNDS" \
  --mix "$MIX" --json "$out.json" --plot "$out.svg"
echo "wrote $out.json and $out.svg"
