#!/usr/bin/env bash
# User-space instructions per request of two server builds side by side (say, before and
# after a change), counted by callgrind: deterministic, unaffected by other load.
#
#   bash benches/scripts/callgrind_compare.sh SERVER_A SERVER_B LOADGEN [COUNT] [tcp16x64|http16x1|http16x16] [SERVER ARGS...]
#
# SERVER_A/B are `server` example binaries (cargo build --release --example server, e.g.
# from two git worktrees with their own CARGO_TARGET_DIR); LOADGEN a release loadgen.
# Each server is driven with `subtract` (TCP 16 connections x 64 in flight, HTTP 16 x 1,
# or HTTP 16 x 16 pipelined) under callgrind, then stopped with SIGINT. Extra SERVER
# ARGS go to both servers (for example --idle-timeout-ms 0); A_ARGS and B_ARGS in the
# environment to one each (say, the same binary with and without B_ARGS=--no-metrics).
set -euo pipefail
a=$1 b=$2 lg=$3
count=${4:-200000}
load=${5:-tcp16x64}
shift 5 || shift $#
out=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
port=7960
for name in a b; do
  bin=${!name}
  own=A_ARGS
  [ "$name" = b ] && own=B_ARGS
  # shellcheck disable=SC2206 # word splitting wanted: several flags
  own_args=(${!own:-})
  valgrind --tool=callgrind --callgrind-out-file="$out/$name" \
    "$bin" --tcp 127.0.0.1:$port --http 127.0.0.1:$((port + 1)) "$@" "${own_args[@]}" >/dev/null 2>&1 &
  pids+=($!)
  sleep 8 # valgrind starts slowly
  case $load in
    tcp16x64) args=(--tcp 127.0.0.1:$port --depth 64) ;;
    http16x1) args=(--http http://127.0.0.1:$((port + 1))/ --depth 1) ;;
    http16x16) args=(--http http://127.0.0.1:$((port + 1))/ --depth 16) ;;
    *) echo "unknown load $load" >&2; exit 2 ;;
  esac
  "$lg" "${args[@]}" --connections 16 --count "$count" --no-verify >/dev/null 2>&1
  kill -INT "${pids[-1]}"
  wait "${pids[-1]}" || true
  total=$(callgrind_annotate "$out/$name" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
  echo "$name ($bin ${!own:-}): $total instructions, $((total / count)) per request (startup included)"
  port=$((port + 10))
done
echo "profiles: $out"
