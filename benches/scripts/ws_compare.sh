#!/usr/bin/env bash
# JSON-RPC calls over WebSocket, ringrpc against jsonrpsee 0.26 (issue 15's benchmark),
# side by side: the same loadgen (--ws), the same demo methods, rounds alternating.
#
#   bash benches/scripts/ws_compare.sh [SECONDS] [ROUNDS]
#
# Builds nothing: the binaries come from $CARGO_TARGET_DIR/release (else target/release),
# built with
#   cargo build --release -p examples --example server
#   cargo build --release -p benches --bin loadgen --bin jsonrpsee_server
# Servers on CPU 1 (ringrpc: one reactor; jsonrpsee: one tokio worker), loadgen on CPU 0.
# Loads (LOADS, default "16x1 16x16 16x1b16"): connections x messages in flight, `b16`
# meaning batches of 16. Prints each run (rps, p50, the server's CPU per call from
# /proc in µs) and then, per load, the medians and ringrpc / jsonrpsee ratios.
# Server push (PUSH, default "100x1 1000x1 100x0.01"): N connections each subscribed to
# `subscribe_ticks [MS]` (100x1: 100k notifications/s offered, 1000x1: 1M/s, 100x0.01:
# 10M/s, i.e. as many as the server can deliver to 100 subscribers), loadgen --ticks
# counting what is delivered; CPU per notification.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-5}
rounds=${2:-3}
LOADS=${LOADS:-16x1 16x16 16x1b16}
PUSH=${PUSH:-100x1 1000x1 100x0.01}
bin=${CARGO_TARGET_DIR:-target}/release
. benches/scripts/lib.sh ws_compare
need "$bin/examples/server" "$bin/loadgen" "$bin/jsonrpsee_server"
tck=$(getconf CLK_TCK)

taskset -c 1 "$bin/examples/server" --tcp off --http 127.0.0.1:0 --idle-timeout-ms 0 >"$tmp/r.out" 2>&1 &
pids+=($!); rpid=$!
taskset -c 1 "$bin/jsonrpsee_server" --http 127.0.0.1:0 --ws >"$tmp/j.out" 2>&1 &
pids+=($!); jpid=$!
raddr=$(listening "$tmp/r.out" http); jaddr=$(listening "$tmp/j.out" http)

for round in $(seq "$rounds"); do
  for load in $LOADS; do
    c=${load%%x*}; rest=${load#*x}; d=${rest%%b*}; b=0
    [[ $rest == *b* ]] && b=${rest#*b}
    for who in ringrpc jsonrpsee; do
      if [ "$who" = ringrpc ]; then a=$raddr; p=$rpid; else a=$jaddr; p=$jpid; fi
      before=$(ticks "$p")
      out=$(taskset -c 0 "$bin/loadgen" --ws "ws://$a/" --connections "$c" --depth "$d" \
        --batch "$b" --duration "$secs" 2>/dev/null || echo '{"failed":true}')
      after=$(ticks "$p")
      echo "$round $load $who $((after - before)) $out" | tee -a "$tmp/runs"
    done
  done
  for push in $PUSH; do
    n=${push%%x*}; ms=${push#*x}
    for who in ringrpc jsonrpsee; do
      if [ "$who" = ringrpc ]; then a=$raddr; p=$rpid; else a=$jaddr; p=$jpid; fi
      before=$(ticks "$p")
      out=$(taskset -c 0 "$bin/loadgen" --ws "ws://$a/" --connections "$n" --ticks "$ms" \
        --warmup 1 --duration "$secs" 2>/dev/null || echo '{"failed":true}')
      after=$(ticks "$p")
      echo "$round push$push $who $((after - before)) $out" | tee -a "$tmp/runs"
    done
  done
done

python3 - "$tmp/runs" "$tck" <<'PY'
import json, statistics, sys
runs, tck = sys.argv[1], int(sys.argv[2])
rows = {}
for line in open(runs):
    rnd, load, who, ticks, js = line.split(" ", 4)
    d = json.loads(js)
    if d.get("failed"):
        print("FAILED", load, who); continue
    if load.startswith("push"):
        cpu = int(ticks) / tck * 1e6 / max(d["notifications"], 1)
        row = (d["notifications_per_s"], float(d["dropped"]), cpu, d["errors"])
    else:
        cpu = int(ticks) / tck * 1e6 / max(d["elements"], 1)
        bad = d.get("errors", 0) + d.get("mismatches", 0)
        row = (d["elements_per_s"], d["latency_us"]["p50"], cpu, bad)
    rows.setdefault(load, {}).setdefault(who, []).append(row)
print("calls: calls/s, p50 µs, server CPU µs per call; pushN: notifications/s delivered,")
print("notifications the server dropped (lagged), server CPU µs per notification")
print(f"{'load':10} {'server':10} {'per s':>10} {'p50/drop':>8} {'cpu us':>11} {'bad':>4}")
for load, by in rows.items():
    med = {}
    for who, v in by.items():
        m = tuple(statistics.median(x[i] for x in v) for i in range(3))
        med[who] = m
        print(f"{load:10} {who:10} {m[0]:10.0f} {m[1]:8.1f} {m[2]:11.2f} {sum(x[3] for x in v):4}")
    if "ringrpc" in med and "jsonrpsee" in med:
        r, j = med["ringrpc"], med["jsonrpsee"]
        print(f"{load:10} ratio      {r[0]/j[0]:10.2f}x {'':8} {r[2]/j[2]:10.2f}x")
PY
