#!/usr/bin/env bash
# What a Prometheus scrape costs the calls of other connections: server builds in turn,
# round after round, each with one reactor (so a scrape and the calls share it) holding
# IDLE idle TCP connections (a scrape lists /proc/self/fd, one entry per connection),
# while a loop scrapes its `GET /metrics` every SCRAPE_MS and an open-loop load
# (`--rate`: latency from each call's due time, so a stalled reactor is charged for
# every call it delayed) measures the calls (docs/PERFORMANCE.md, "Scrapes off the
# reactor"). One server runs at a time: on a machine of 2 CPUs every server shares the
# one CPU the servers are pinned to, so a server's scrapes would slow the others' calls.
#
#   bash benches/scripts/scrape_stall.sh NAME=SERVER NAME=SERVER ...
#   # say: old=/tmp/server-old new=target/release/examples/server
#
# Environment (defaults in brackets): LOADGEN [target/release/loadgen], IDLE [5000]
# connections, SCRAPE_MS [50] (0: no scrapes, the control), RATE [20000] calls/s,
# CONNECTIONS [16], ROUNDS [5], DURATION [5] s per server and round. Prints, per
# server, the median over the rounds of each latency percentile (ms).
set -euo pipefail
cd "$(dirname "$0")/../.."
. benches/scripts/lib.sh scrape_stall
loadgen=${LOADGEN:-target/release/loadgen}
need "$loadgen"
[ $# -ge 1 ] || { echo "usage: $0 NAME=SERVER ..." >&2; exit 2; }
idle=${IDLE:-5000}
ulimit -n $((idle + 1000))
srv=() lg=()
if [ "$(nproc)" -ge 2 ]; then srv=(taskset -c 1); lg=(taskset -c 0); fi
for spec in "$@"; do need "${spec#*=}"; done
for round in $(seq "${ROUNDS:-5}"); do
  for spec in "$@"; do
    name=${spec%%=*} bin=${spec#*=}
    "${srv[@]}" "$bin" --reactors 1 --tcp 127.0.0.1:0 --http 127.0.0.1:0 --idle-timeout-ms 0 \
      >"$tmp/server.out" 2>&1 &
    server=$!
    tcp=$(listening "$tmp/server.out" tcp)
    http=$(listening "$tmp/server.out" http)
    # The idle connections and the scrape loop, until killed; "ready" once connected.
    python3 - "$idle" "${SCRAPE_MS:-50}" "${tcp##*:}" "${http##*:}" >"$tmp/py.out" 2>&1 <<'EOF' &
import os, resource, socket, sys, time
os.nice(19)  # the scraper stands for another machine: it must not slow the load or the server
idle, every, tcp, http = int(sys.argv[1]), int(sys.argv[2]) / 1000, int(sys.argv[3]), int(sys.argv[4])
resource.setrlimit(resource.RLIMIT_NOFILE, (idle + 1000,) * 2)
held = [socket.create_connection(("127.0.0.1", tcp)) for _ in range(idle)]
s = socket.create_connection(("127.0.0.1", http))
print("ready", flush=True)
while every > 0:
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    n = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")][0].split(b":")[1])
    while len(body) < n:
        body += s.recv(65536)
    time.sleep(every)
time.sleep(1e9)
EOF
    scraper=$!
    pids+=("$server" "$scraper")
    for _ in $(seq 600); do grep -q ready "$tmp/py.out" && break; sleep 0.1; done
    grep -q ready "$tmp/py.out" || { cat "$tmp/py.out" >&2; exit 1; }
    "${lg[@]}" "$loadgen" --tcp "$tcp" --duration "${DURATION:-5}" --warmup 1 \
      --connections "${CONNECTIONS:-16}" --depth 1 --rate "${RATE:-20000}" --mix ping 2>/dev/null |
      sed "s/^/$name /" >>"$tmp/results"
    kill "$server" "$scraper" 2>/dev/null || true
    wait "$server" "$scraper" 2>/dev/null || true
  done
done
python3 - "$tmp/results" "$@" <<'EOF'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    name, js = line.split(" ", 1)
    runs.setdefault(name, []).append(json.loads(js))
keys = ["p50", "p90", "p99", "p999", "max"]
print(f"{'server':<10}{'rounds':>7}{'calls/s':>10}" + "".join(f"{k + ' ms':>10}" for k in keys))
for spec in sys.argv[2:]:
    name = spec.split("=", 1)[0]
    rs = runs.get(name, [])
    if not rs:
        continue
    med = lambda f: statistics.median(f(r) for r in rs)
    print(f"{name:<10}{len(rs):>7}{med(lambda r: r['rps']):>10.0f}"
          + "".join(f"{med(lambda r: r['latency_us'][k]) / 1000:>10.3f}" for k in keys))
EOF
