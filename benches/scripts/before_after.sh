#!/usr/bin/env bash
# Throughput of two server builds side by side (say, before and after a change), with
# loadgen: server pinned to CPU 1, loadgen to CPU 0, the builds alternating in each round
# so both see the same machine. The machine is shared and noisy: read the ratios.
#
#   bash benches/scripts/before_after.sh SERVER_A SERVER_B LOADGEN [SECONDS] [ROUNDS]
#
# A_ARGS and B_ARGS in the environment go to one server each (say, the same binary with
# and without B_ARGS=--no-metrics).
#
# Prints one line per run: round, load, build, requests/s (loadgen's summary field).
set -euo pipefail
a=$1 b=$2 lg=$3
secs=${4:-5}
rounds=${5:-3}
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
rate() { sed -E 's/.*"(rps|requests_per_sec|throughput)"[^0-9]*([0-9.]+).*/\2/' ; }
for round in $(seq "$rounds"); do
  for load in "tcp16x64|--tcp 127.0.0.1:PORT --connections 16 --depth 64" \
              "http16x1|--http http://127.0.0.1:HPORT/ --connections 16 --depth 1" \
              "http16x16|--http http://127.0.0.1:HPORT/ --connections 16 --depth 16"; do
    IFS='|' read -r name args <<<"$load"
    for build in a b; do
      bin=${!build}
      own=A_ARGS
      [ "$build" = b ] && own=B_ARGS
      # shellcheck disable=SC2206 # word splitting wanted: several flags
      own_args=(${!own:-})
      port=$((7980 + RANDOM % 400 * 2))
      taskset -c 1 "$bin" --tcp 127.0.0.1:$port --http 127.0.0.1:$((port + 1)) "${own_args[@]}" >/dev/null 2>&1 &
      pids+=($!)
      sleep 0.5
      a2=${args//HPORT/$((port + 1))}
      a2=${a2//PORT/$port}
      # shellcheck disable=SC2086
      out=$(taskset -c 0 "$lg" $a2 --duration "$secs" --warmup 1 --no-verify 2>/dev/null || echo '{}')
      echo "round $round $name $build $out"
      kill -INT "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true
    done
  done
done
