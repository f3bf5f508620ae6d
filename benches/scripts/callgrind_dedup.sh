#!/usr/bin/env bash
# User-space instructions per call of a server build under an authenticated TCP load
# (`incr`, de-duplicated by identity and id), counted by callgrind: deterministic, so
# it shows a change the VM's noise hides in calls/s (docs/PERFORMANCE.md, stop 38).
# The store is filled first (FILL calls, not counted: `callgrind_control -z` zeroes
# the counts), then COUNT calls are counted.
#
#   bash benches/scripts/callgrind_dedup.sh SERVER ["FLAGS"] [FILL] [COUNT]
#   # say: bash benches/scripts/callgrind_dedup.sh target/release/examples/server "--dedup memory" 1000000
#
# FLAGS default to none (no store, the baseline); FILL 1000000 (more than a 64 MiB
# store's ~700,000 entries, so it evicts as in steady state); COUNT 200000. Needs
# valgrind and `cargo build --release -p benches --bin loadgen`. Prints the
# instructions a call and the hint's runs (`Engine::prefetch_keyed`).
set -euo pipefail
cd "$(dirname "$0")/../.."
. benches/scripts/lib.sh callgrind_dedup
[ $# -ge 1 ] || { echo "usage: $0 SERVER [FLAGS] [FILL] [COUNT]" >&2; exit 2; }
server=$1 flags=${2:-} fill=${3:-1000000} count=${4:-200000}
loadgen=${LOADGEN:-target/release/loadgen}
need "$server" "$loadgen"
printf '[[key]]\nname  = "bench-1"\ntoken = "b3nch-t0ken-1"\nallow = ["*"]\n' >"$tmp/keys.toml"
# shellcheck disable=SC2086 # FLAGS: several flags
valgrind --tool=callgrind --callgrind-out-file="$tmp/out" "$server" --tcp 127.0.0.1:0 \
  --http off --auth-file "$tmp/keys.toml" --idle-timeout-ms 0 $flags >"$tmp/server.out" 2>&1 &
pid=$!
pids+=("$pid")
for _ in $(seq 600); do grep -q '^listening tcp' "$tmp/server.out" && break; sleep 0.05; done
addr=$(listening "$tmp/server.out" tcp)
hello='{"jsonrpc":"2.0","method":"rpc.auth","params":{"token":"b3nch-t0ken-1"},"id":0}'
load() { "$loadgen" --tcp "$addr" --connections 16 --depth 64 --mix incr --hello "$hello" --count "$1" >/dev/null; }
[ "$fill" -gt 0 ] && load "$fill"
callgrind_control -z "$pid" >/dev/null
load "$count"
# Graceful shutdown on SIGINT writes the counts.
kill -INT "$pid"
wait "$pid" || true
total=$(callgrind_annotate "$tmp/out" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1; exit }')
hints=$(callgrind_annotate --tree=caller --threshold=100 "$tmp/out" 2>/dev/null |
  grep -B1 '\* .*Engine::prefetch_keyed \[' | grep -o '([0-9,]*x)' | head -1 | tr -d '(),x')
echo "instructions a call: $((total / count)) ($total over $count calls)"
echo "fetch-ahead hints: ${hints:-0} in $count calls"
