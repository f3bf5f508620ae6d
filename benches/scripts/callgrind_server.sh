#!/usr/bin/env bash
# User-space instructions per request, ringrpc's server vs the echo floor, counted by
# callgrind (deterministic: unaffected by other load on the machine). Kernel work
# (the socket syscalls) is not counted; it is about the same for both servers.
#
#   bash benches/scripts/callgrind_server.sh [COUNT] [tcp16x64|http16x1]
#
# Drives each server with loadgen, `subtract`: TCP with 16 connections x 64 in flight
# (default), or HTTP with 16 connections x 1.
set -euo pipefail
cd "$(dirname "$0")/../.."
count=${1:-200000}
load=${2:-tcp16x64}
cargo build --release -q --example server -p examples
cargo build --release -q -p benches --bin loadgen --bin floor
bin=${CARGO_TARGET_DIR:-target}/release
out=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT

valgrind --tool=callgrind --callgrind-out-file="$out/ringrpc" \
  $bin/examples/server --tcp 127.0.0.1:7760 --http 127.0.0.1:7761 --idle-timeout-ms 0 >/dev/null 2>&1 &
pids+=($!)
valgrind --tool=callgrind --callgrind-out-file="$out/floor" \
  $bin/floor --tcp 127.0.0.1:7860 --http 127.0.0.1:7861 >/dev/null 2>&1 &
pids+=($!)
sleep 8 # valgrind starts slowly
for port in 7760 7860; do
  case $load in
    tcp16x64) args=(--tcp 127.0.0.1:$port --depth 64) ;;
    http16x1) args=(--http http://127.0.0.1:$((port + 1))/ --depth 1) ;;
    *) echo "unknown load $load" >&2; exit 2 ;;
  esac
  $bin/loadgen "${args[@]}" --connections 16 --count "$count" --no-verify >/dev/null 2>&1
done
# ringrpc shuts down gracefully on SIGINT; the floor just ends on SIGTERM.
kill -INT "${pids[0]}"
kill -TERM "${pids[1]}"
wait || true
for name in ringrpc floor; do
  total=$(callgrind_annotate "$out/$name" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
  echo "$name: $total instructions, $((total / count)) per request (startup included)"
done
echo "profiles: $out (callgrind_annotate --inclusive=yes $out/ringrpc)"
