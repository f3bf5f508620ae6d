#!/usr/bin/env bash
# Server push through the proxy (issue 15, item 6): notifications delivered per second to
# N subscribers of `subscribe_ticks [MS]`, directly from the demo server and through the
# ringrpc proxy (`--subscription subscribe_ticks:tick:unsubscribe_ticks`: the N identical
# subscriptions share one upstream subscription, fanned out by the proxy), side by side,
# rounds alternating.
#
#   bash benches/scripts/proxy_push.sh [SECONDS] [ROUNDS]
#
# Builds nothing: the binaries come from $CARGO_TARGET_DIR/release (else target/release),
# built with
#   cargo build --release -p examples --example server --example proxy -p benches --bin loadgen
# The server and the proxy on CPU 1 (one reactor each), loadgen on CPU 0. Loads (PUSH,
# default "100x1 100x0.01 1000x1 100x1d 100x0.01d"): N connections x MS, over WebSocket
# and TCP (MODES, default "ws tcp"). Directly, the server runs N subscriptions of its
# own; through the proxy it runs one, at the same interval, and the proxy copies each
# tick to the N clients: the same notifications are offered either way (100x1: 100k/s;
# 100x0.01: 10M/s, i.e. as many as can be delivered). A `d` suffix: every connection's
# subscribe call distinct (loadgen --ticks-distinct), so nothing is shared and the
# proxy forwards N upstream subscriptions one for one — its cost on top of the server's.
# Prints each run (notifications/s, dropped, CPU) and, per load, the medians: `cpu us`
# is the CPU per notification delivered of the server (direct) or of the proxy and the
# server together (proxy; `proxy us` the proxy's alone), from /proc.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-5}
rounds=${2:-3}
PUSH=${PUSH:-100x1 100x0.01 1000x1 100x1d 100x0.01d}
MODES=${MODES:-ws tcp}
bin=${CARGO_TARGET_DIR:-target}/release
. benches/scripts/lib.sh proxy_push
need "$bin/examples/server" "$bin/examples/proxy" "$bin/loadgen"
tck=$(getconf CLK_TCK)

taskset -c 1 "$bin/examples/server" --tcp 127.0.0.1:0 --http 127.0.0.1:0 \
  --idle-timeout-ms 0 >"$tmp/s.out" 2>&1 &
pids+=($!); spid=$!
stcp=$(listening "$tmp/s.out" tcp); shttp=$(listening "$tmp/s.out" http)
taskset -c 1 "$bin/examples/proxy" --upstream "default=tcp://$stcp" --connections 1 \
  --subscription subscribe_ticks:tick:unsubscribe_ticks \
  --tcp 127.0.0.1:0 --http 127.0.0.1:0 >"$tmp/p.out" 2>&1 &
pids+=($!); ppid=$!
ptcp=$(listening "$tmp/p.out" tcp); phttp=$(listening "$tmp/p.out" http)

for round in $(seq "$rounds"); do
  for push in $PUSH; do
    n=${push%%x*}; ms=${push#*x}; distinct=()
    [[ $ms == *d ]] && { ms=${ms%d}; distinct=(--ticks-distinct); }
    for mode in $MODES; do
      for who in direct proxy; do
        case "$who-$mode" in
          direct-ws) target=(--ws "ws://$shttp/") ;;
          direct-tcp) target=(--tcp "$stcp") ;;
          proxy-ws) target=(--ws "ws://$phttp/") ;;
          proxy-tcp) target=(--tcp "$ptcp") ;;
        esac
        s0=$(ticks "$spid"); p0=$(ticks "$ppid")
        out=$(taskset -c 0 "$bin/loadgen" "${target[@]}" --connections "$n" --ticks "$ms" \
          "${distinct[@]}" --warmup 1 --duration "$secs" 2>/dev/null || echo '{"failed":true}')
        s1=$(ticks "$spid"); p1=$(ticks "$ppid")
        echo "$round $mode-${push} $who $((s1 - s0)) $((p1 - p0)) $out" | tee -a "$tmp/runs"
        # The subscriptions end with their connections; let them go before the next.
        sleep 0.5
      done
    done
  done
done

python3 - "$tmp/runs" "$tck" <<'PY'
import json, statistics, sys
runs, tck = sys.argv[1], int(sys.argv[2])
rows = {}
for line in open(runs):
    rnd, load, who, sticks, pticks, js = line.split(" ", 5)
    d = json.loads(js)
    if d.get("failed"):
        print("FAILED", load, who); continue
    n = max(d["notifications"], 1)
    # The CPU of the whole run (warm-up included) per notification counted: an
    # overestimate by the warm-up's share, the same for both.
    server = int(sticks) / tck * 1e6 / n
    proxy = int(pticks) / tck * 1e6 / n
    total = server + (proxy if who == "proxy" else 0.0)
    row = (d["notifications_per_s"], float(d["dropped"]), total, proxy if who == "proxy" else 0.0,
           d["errors"] + (d["connections"] - d["subscribed"]))
    rows.setdefault(load, {}).setdefault(who, []).append(row)
print("notifications/s delivered, notifications dropped (lagged), CPU µs per notification")
print(f"{'load':14} {'path':7} {'per s':>10} {'dropped':>10} {'cpu us':>8} {'proxy us':>9} {'bad':>4} runs")
for load, by in rows.items():
    med = {}
    for who, v in by.items():
        m = tuple(statistics.median(x[i] for x in v) for i in range(4))
        med[who] = m
        print(f"{load:14} {who:7} {m[0]:10.0f} {m[1]:10.0f} {m[2]:8.2f} {m[3]:9.2f} "
              f"{sum(x[4] for x in v):4} {len(v)}")
    if "direct" in med and "proxy" in med:
        dct, prx = med["direct"], med["proxy"]
        print(f"{load:14} {'ratio':7} {prx[0]/dct[0]:9.2f}x {'':10} {prx[2]/dct[2]:7.2f}x")
PY
