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
# instructions a call and the hint's runs (`Engine::prefetch_keyed`); KEEP=FILE keeps
# the counts for `callgrind_annotate FILE` (where the instructions go, by function).
set -euo pipefail
cd "$(dirname "$0")/../.."
. benches/scripts/lib.sh callgrind_dedup
[ $# -ge 1 ] || { echo "usage: $0 SERVER [FLAGS] [FILL] [COUNT]" >&2; exit 2; }
server=$1 flags=${2:-} fill=${3:-1000000} count=${4:-200000}
loadgen=${LOADGEN:-${CARGO_TARGET_DIR:-target}/release/loadgen}
need "$server" "$loadgen"
for tool in valgrind callgrind_control callgrind_annotate; do
  command -v "$tool" >/dev/null || { echo "callgrind_dedup: $tool is not installed (Debian: valgrind)" >&2; exit 2; }
done
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
if [ "$fill" -gt 0 ]; then load "$fill"; fi
callgrind_control -z "$pid" >/dev/null 2>&1
load "$count"
# Graceful shutdown on SIGINT writes the counts (bounded: 120 s, then KILL).
kill -INT "$pid"
for _ in $(seq 1200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -KILL "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
[ -s "$tmp/out" ] || { echo "callgrind_dedup: no counts written" >&2; exit 1; }
if [ -n "${KEEP:-}" ]; then cp "$tmp/out" "$KEEP"; fi
# Whole outputs read (no early exit: callgrind_annotate would die of SIGPIPE), without
# source annotation.
total=$(callgrind_annotate --auto=no "$tmp/out" |
  awk '/PROGRAM TOTALS/ && t == "" { t = $1; gsub(",", "", t) } END { print t }')
# The hint's runs: the calls of `Engine::prefetch_keyed`, summed over its callers (the
# `<` lines just above its `*` line); none without a store.
hints=$(callgrind_annotate --auto=no --tree=caller --threshold=100 "$tmp/out" |
  awk '/^ *$/ { n = 0; next }
       / < / && match($0, /\([0-9,]+x\)/) { v = substr($0, RSTART + 1, RLENGTH - 3); gsub(",", "", v); n += v; next }
       /\* .*Engine::prefetch_keyed / { h += n }
       { n = 0 }
       END { print h + 0 }')
[ -n "$total" ] || { echo "callgrind_dedup: no PROGRAM TOTALS in the counts" >&2; exit 1; }
echo "instructions a call: $((total / count)) ($total over $count calls)"
echo "fetch-ahead hints: $hints in $count calls"
