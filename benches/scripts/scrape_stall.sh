#!/usr/bin/env bash
# What a Prometheus scrape costs the calls of other connections: server builds side by
# side, each with one reactor (so a scrape and the calls share it) holding IDLE idle TCP
# connections (a scrape lists /proc/self/fd, one entry per connection), while a loop
# scrapes every server's `GET /metrics` every SCRAPE_MS and an open-loop load
# (`--rate`: latency from each call's due time, so a stalled reactor is charged for
# every call it delayed) measures the calls (docs/PERFORMANCE.md, "Scrapes off the
# reactor").
#
#   bash benches/scripts/scrape_stall.sh NAME=SERVER NAME=SERVER ...
#   # say: old=/tmp/server-old new=target/release/examples/server
#
# Environment (defaults in brackets): LOADGEN [target/release/loadgen], IDLE [5000]
# connections per server, SCRAPE_MS [50] (0: no scrapes, the control), RATE [20000]
# calls/s, CONNECTIONS [16], ROUNDS [4], DURATION [5] s per server and round.
set -euo pipefail
cd "$(dirname "$0")/../.."
. benches/scripts/lib.sh scrape_stall
loadgen=${LOADGEN:-target/release/loadgen}
need "$loadgen"
[ $# -ge 1 ] || { echo "usage: $0 NAME=SERVER ..." >&2; exit 2; }
idle=${IDLE:-5000}
ulimit -n $((idle * 2 + 1000))
srv=() lg=()
if [ "$(nproc)" -ge 2 ]; then srv=(taskset -c 1); lg=(taskset -c 0); fi
urls=() tcp_ports=() http_ports=()
for spec in "$@"; do
  name=${spec%%=*} bin=${spec#*=}
  need "$bin"
  "${srv[@]}" "$bin" --reactors 1 --tcp 127.0.0.1:0 --http 127.0.0.1:0 --idle-timeout-ms 0 \
    >"$tmp/$name.out" 2>&1 &
  pids+=($!)
  tcp=$(listening "$tmp/$name.out" tcp)
  http=$(listening "$tmp/$name.out" http)
  urls+=("$name=tcp://$tcp")
  tcp_ports+=("${tcp##*:}")
  http_ports+=("${http##*:}")
done
# The idle connections and the scrape loop, until killed; says "ready" once connected.
python3 - "$idle" "${SCRAPE_MS:-50}" "${tcp_ports[*]}" "${http_ports[*]}" >"$tmp/py.out" 2>&1 <<'EOF' &
import resource, socket, sys, time
idle, every = int(sys.argv[1]), int(sys.argv[2]) / 1000
tcp, http = sys.argv[3].split(), sys.argv[4].split()
resource.setrlimit(resource.RLIMIT_NOFILE, (idle * len(tcp) + 1000,) * 2)
held = [socket.create_connection(("127.0.0.1", int(p))) for p in tcp for _ in range(idle)]
scrapers = [socket.create_connection(("127.0.0.1", int(p))) for p in http]
print("ready", flush=True)
def scrape(s):
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    n = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")][0].split(b":")[1])
    while len(body) < n:
        body += s.recv(65536)
while True:
    if every > 0:
        for s in scrapers:
            scrape(s)
        time.sleep(every)
    else:
        time.sleep(1)
EOF
pids+=($!)
for _ in $(seq 600); do grep -q ready "$tmp/py.out" && break; sleep 0.1; done
grep -q ready "$tmp/py.out" || { cat "$tmp/py.out" >&2; exit 1; }
"${lg[@]}" "$loadgen" --compare "${urls[@]}" --rounds "${ROUNDS:-4}" --duration "${DURATION:-5}" \
  --warmup 1 --connections "${CONNECTIONS:-16}" --depth 1 --rate "${RATE:-20000}" --mix ping
