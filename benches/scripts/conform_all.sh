#!/usr/bin/env bash
# docs/CONFORMANCE.md's tables, reproduced: `conform` against ringrpc's demo server (TCP,
# Unix, stdio, HTTP, WebSocket), jsonrpsee 0.26 (HTTP, WebSocket) and Python's
# jsonrpcserver 5.0.9 (HTTP, behind benches/scripts/jsonrpcserver_http.py), each run's
# summary, then the per-case table (benches/scripts/conform_table.py).
#
#   bash benches/scripts/conform_all.sh [OUTDIR]     # the --json files go to OUTDIR
#
# Builds the release binaries; needs python3 with jsonrpcserver==5.0.9 (pip). The
# jsonrpsee WebSocket run takes about a minute (13 cases wait out the 5 s timeout).
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -q -p examples --example server -p benches --bin conform --bin jsonrpsee_server
bin=${CARGO_TARGET_DIR:-target}/release
. benches/scripts/lib.sh conform_all
out=${1:-$tmp}
mkdir -p "$out"
"$bin/examples/server" --tcp 127.0.0.1:0 --http 127.0.0.1:0 --unix "$tmp/r.sock" >"$tmp/r.out" 2>&1 &
pids+=($!)
"$bin/jsonrpsee_server" --http 127.0.0.1:0 --ws >"$tmp/j.out" 2>&1 &
pids+=($!)
python3 benches/scripts/jsonrpcserver_http.py --port 0 >"$tmp/p.out" 2>&1 &
pids+=($!)
rtcp=$(listening "$tmp/r.out" tcp); rhttp=$(listening "$tmp/r.out" http)
jhttp=$(listening "$tmp/j.out" http); phttp=$(listening "$tmp/p.out" http)
runs=()
run() { # NAME URL [ARGS...]
  local name=$1; shift
  echo "$name: $("$bin/conform" --json "$out/$name.json" "$@" | tail -1 || true)"
  runs+=("$name=$out/$name.json")
}
run ringrpc-tcp "tcp://$rtcp"
run ringrpc-unix "unix://$tmp/r.sock"
run ringrpc-stdio "stdio:$bin/examples/server" --stdio
run ringrpc-http "http://$rhttp/"
run ringrpc-ws "ws://$rhttp/"
run jsonrpsee-http "http://$jhttp/"
run jsonrpsee-ws "ws://$jhttp/"
run jsonrpcserver-http "http://$phttp/"
echo
python3 benches/scripts/conform_table.py "${runs[@]}"
