#!/usr/bin/env bash
# The ringrpc proxy side by side with nginx and HAProxy (issue 14, "Benchmarks, side by
# side"): the same loadgen, the same upstream, in the same run; rounds interleaved
# (round 1: every contender, round 2: every contender, ...) so all see the same machine.
#
#   bash benches/scripts/proxy_compare.sh [RELEASE_DIR]
#
# Builds nothing. The binaries come from RELEASE_DIR (default: $CARGO_TARGET_DIR/release,
# else target/release), built with
#   cargo build --release -p examples --example proxy --example server
#   cargo build --release -p benches --bin loadgen --bin floor
# or from PROXY, SERVER, FLOOR, LOADGEN, NGINX, HAPROXY in the environment (nginx and
# haproxy from PATH by default; the Debian packages).
#
# Upstreams, started once and pinned to CPU 1 for the whole script:
#   floor   benches' echo floor with --reply id (each answer carries the request's id, so
#           the ringrpc proxy can match it and loadgen can verify it): pure overhead;
#   server  the ringrpc demo server: real answers.
# nginx and HAProxy are HTTP proxies, so they forward to an upstream's HTTP port; the
# ringrpc proxy forwards to its newline-delimited TCP port (it also speaks HTTP upstream;
# TCP is what it is measured with), on its own few pipelined connections whatever the
# client side is.
#
# Contenders (each started fresh for each run, stopped after it):
#   direct       loadgen straight to the upstream's HTTP port (no proxy)
#   nginx        benches/proxy/nginx.conf: 1 worker, upstream keep-alive
#   haproxy      benches/proxy/haproxy.cfg: nbthread 1, http-reuse always
#   ringrpc      examples/proxy, HTTP client side (1 reactor + its upstream thread)
#   direct-tcp   loadgen straight to the upstream's TCP port (baseline of the next row)
#   ringrpc-tcp  examples/proxy, TCP client side
# Loads: 16 connections x 1 in flight, and 16 x 16 pipelined (nginx and HAProxy answer a
# client's pipelined requests one after another and do not pipeline upstream: that is
# part of what is measured).
#
# CPU placement (MODES), the two settings the issue asks for:
#   alone  the proxy alone on CPU 0; upstream and loadgen share CPU 1. The CPU-1 side is
#          the same for every contender, direct included, so a proxy that keeps up shows
#          the throughput of CPU 1, and one that does not shows its own limit.
#   one    everything on CPU 1: proxy, upstream and loadgen compete for one CPU, so every
#          cycle the proxy spends (and every extra cycle it causes upstream, say by not
#          pipelining) is throughput lost.
# Each process is pinned with taskset from its start, so its threads inherit the CPU.
#
# Measured per run: loadgen's summary (rps, latency_us.p50/p99, errors + mismatches:
# every answer is verified, floor included, since --reply id answers subtract's 19 with
# the right id), and the CPU time (utime + stime from /proc/PID/stat, in clock ticks of
# `getconf CLK_TCK`, summed over the proxy's process and its children: nginx's master and
# worker) spent between the end of loadgen's warm-up and its exit, per answered call;
# the upstream's likewise. Ticks are 10 ms at 100 Hz: read the CPU columns of short runs
# as rough. CPU per call depends on the placement: a process alone on its CPU is woken
# for nearly every message, one that shares a CPU finds several waiting per wake-up. The machine this was written on is shared and busy: read the ratios, and
# lengthen the runs before believing a figure.
#
# Environment (defaults in brackets):
#   SECS [5]  WARMUP [1]  ROUNDS [3]          seconds measured / warm-up per run; rounds
#   MODES ["alone one"]  UPSTREAMS ["floor server"]  LOADS ["16x1 16x16"]
#   CONTENDERS ["direct nginx haproxy ringrpc direct-tcp ringrpc-tcp"]
#   PROXY_ARGS [""]   extra flags for the ringrpc proxy (say, --connections 4)
#   RESULTS [a temp file]  where the per-run JSON lines are kept (appended)
# The default set is 3 x 2 x 2 x 2 x 6 = 144 runs of ~SECS+WARMUP+1 s (~17 min).
#
# Prints one line per run as it goes, then a table (median over rounds) with ratios vs
# nginx and the p50 added vs direct (direct-tcp for the TCP row).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
rel=${1:-${CARGO_TARGET_DIR:-$root/target}/release}
PROXY=${PROXY:-$rel/examples/proxy}
SERVER=${SERVER:-$rel/examples/server}
FLOOR=${FLOOR:-$rel/floor}
LOADGEN=${LOADGEN:-$rel/loadgen}
NGINX=${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}
HAPROXY=${HAPROXY:-$(command -v haproxy || echo /usr/sbin/haproxy)}
SECS=${SECS:-5}
WARMUP=${WARMUP:-1}
ROUNDS=${ROUNDS:-3}
MODES=${MODES:-alone one}
UPSTREAMS=${UPSTREAMS:-floor server}
LOADS=${LOADS:-16x1 16x16}
CONTENDERS=${CONTENDERS:-direct nginx haproxy ringrpc direct-tcp ringrpc-tcp}
PROXY_ARGS=${PROXY_ARGS:-}

# nginx and HAProxy from Debian's packages, installed when missing (their services are
# stopped: the script runs its own instances in the foreground).
if { [[ " $CONTENDERS " == *" nginx "* ]] && [ ! -x "$NGINX" ]; } ||
   { [[ " $CONTENDERS " == *" haproxy "* ]] && [ ! -x "$HAPROXY" ]; }; then
  if command -v apt-get >/dev/null; then
    sudo=""; [ "$(id -u)" -ne 0 ] && sudo=sudo
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q nginx haproxy >&2 || true
    $sudo service nginx stop >/dev/null 2>&1 || true
    $sudo service haproxy stop >/dev/null 2>&1 || true
    NGINX=$(command -v nginx || echo /usr/sbin/nginx)
    HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)
  fi
fi
[[ " $CONTENDERS " == *" nginx "* ]] || NGINX=/bin/true
[[ " $CONTENDERS " == *" haproxy "* ]] || HAPROXY=/bin/true
for b in "$PROXY" "$SERVER" "$FLOOR" "$LOADGEN" "$NGINX" "$HAPROXY"; do
  [ -x "$b" ] || { echo "proxy_compare: missing binary $b (see the top of this script)" >&2; exit 2; }
done
command -v taskset >/dev/null || { echo "proxy_compare: taskset (util-linux) is needed" >&2; exit 2; }
[ "$(nproc --all)" -ge 2 ] || { echo "proxy_compare: needs CPUs 0 and 1" >&2; exit 2; }

. "$here/lib.sh" proxy_compare
RESULTS=${RESULTS:-$tmp/results.jsonl}
tck=$(getconf CLK_TCK)

# Waits until something accepts connections on HOST:PORT.
accepting() {
  local i
  for i in $(seq 100); do
    if (exec 3<>"/dev/tcp/${1%:*}/${1##*:}") 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  echo "proxy_compare: nothing listens on $1" >&2
  return 1
}

# A port nothing listens on now (the contender binds it a moment later).
free_port() {
  local p
  while :; do
    p=$((20000 + RANDOM % 20000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}

# CPU ticks (utime + stime) of PID and its descendants; 0 when PID is empty.
ticks() {
  local pid=$1 sum=0 stat rest c
  [ -n "$pid" ] || { echo 0; return; }
  local all=("$pid")
  while read -r c; do all+=("$c"); done < <(descendants "$pid")
  for p in "${all[@]}"; do
    stat=$(cat "/proc/$p/stat" 2>/dev/null) || continue
    rest=${stat##*) }    # past the command name, which may hold spaces
    # shellcheck disable=SC2086 # split into fields: state is field 3, utime 14, stime 15
    set -- $rest
    sum=$((sum + ${12} + ${13}))
  done
  echo "$sum"
}
descendants() {
  local c
  for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do
    echo "$c"
    descendants "$c"
  done
}

# Drops PID from the cleanup list once it is gone (a pid may be reused later).
forget() {
  local keep=() x
  for x in "${pids[@]}"; do [ "$x" = "$1" ] || keep+=("$x"); done
  pids=("${keep[@]}")
}

# Stops PID (SIGTERM: nginx exits at once, HAProxy and the ringrpc proxy after answering
# what they hold, which is nothing once loadgen is done); SIGKILL after 5 s.
stop() {
  local pid=$1 i
  kill -TERM "$pid" 2>/dev/null || return 0
  for i in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  forget "$pid"
}

# --- upstreams, once, on CPU 1 ---------------------------------------------------------
declare -A up_tcp up_http up_pid
for u in $UPSTREAMS; do
  case $u in
    floor) taskset -c 1 "$FLOOR" --reply id --tcp 127.0.0.1:0 --http 127.0.0.1:0 >"$tmp/$u.out" 2>&1 & ;;
    server) taskset -c 1 "$SERVER" --tcp 127.0.0.1:0 --http 127.0.0.1:0 >"$tmp/$u.out" 2>&1 & ;;
    *) echo "proxy_compare: unknown upstream $u (floor, server)" >&2; exit 2 ;;
  esac
  pids+=($!)
  up_pid[$u]=$!
  up_tcp[$u]=$(listening "$tmp/$u.out" tcp)
  up_http[$u]=$(listening "$tmp/$u.out" http)
done

# Starts contender C for upstream U on CPU list CPU; sets `cpid` (empty for direct) and
# `target` (loadgen's --http URL or --tcp ADDR, with the flag).
start_contender() {
  local c=$1 u=$2 cpu=$3 port dir
  cpid=
  case $c in
    direct) target="--http http://${up_http[$u]}/" ;;
    direct-tcp) target="--tcp ${up_tcp[$u]}" ;;
    nginx)
      port=$(free_port)
      dir=$tmp/nginx.$port
      mkdir -p "$dir"
      sed -e "s|@DIR@|$dir|g" -e "s|@USER@|$(id -un)|" -e "s|@GROUP@|$(id -gn)|" \
        -e "s|@LISTEN@|127.0.0.1:$port|" -e "s|@UPSTREAM@|${up_http[$u]}|" \
        "$root/benches/proxy/nginx.conf" >"$dir/nginx.conf"
      taskset -c "$cpu" "$NGINX" -p "$dir" -e stderr -c "$dir/nginx.conf" >"$dir/log" 2>&1 &
      cpid=$!
      target="--http http://127.0.0.1:$port/"
      accepting "127.0.0.1:$port"
      ;;
    haproxy)
      port=$(free_port)
      dir=$tmp/haproxy.$port
      mkdir -p "$dir"
      sed -e "s|@DIR@|$dir|g" -e "s|@LISTEN@|127.0.0.1:$port|" -e "s|@UPSTREAM@|${up_http[$u]}|" \
        "$root/benches/proxy/haproxy.cfg" >"$dir/haproxy.cfg"
      taskset -c "$cpu" "$HAPROXY" -db -f "$dir/haproxy.cfg" >"$dir/log" 2>&1 &
      cpid=$!
      target="--http http://127.0.0.1:$port/"
      accepting "127.0.0.1:$port"
      ;;
    ringrpc | ringrpc-tcp)
      dir=$tmp/ringrpc.$RANDOM
      mkdir -p "$dir"
      # shellcheck disable=SC2086 # PROXY_ARGS: several flags
      taskset -c "$cpu" "$PROXY" --upstream "default=tcp://${up_tcp[$u]}" \
        --tcp 127.0.0.1:0 --http 127.0.0.1:0 $PROXY_ARGS >"$dir/log" 2>&1 &
      cpid=$!
      if [ "$c" = ringrpc ]; then
        target="--http http://$(listening "$dir/log" http)/"
      else
        target="--tcp $(listening "$dir/log" tcp)"
      fi
      ;;
    *) echo "proxy_compare: unknown contender $c" >&2; exit 2 ;;
  esac
  if [ -n "$cpid" ]; then pids+=("$cpid"); fi
}

echo "# proxy_compare: ${SECS}s (+${WARMUP}s warm-up) x $ROUNDS rounds; modes: $MODES; upstreams: $UPSTREAMS; results: $RESULTS" >&2
for round in $(seq "$ROUNDS"); do
  for u in $UPSTREAMS; do
    for mode in $MODES; do
      case $mode in
        alone) pcpu=0 ;;
        one) pcpu=1 ;;
        *) echo "proxy_compare: unknown mode $mode (alone, one)" >&2; exit 2 ;;
      esac
      for load in $LOADS; do
        conns=${load%x*} depth=${load#*x}
        for c in $CONTENDERS; do
          start_contender "$c" "$u" "$pcpu"
          # shellcheck disable=SC2086 # target: a flag and its value
          taskset -c 1 "$LOADGEN" $target --connections "$conns" --depth "$depth" \
            --duration "$SECS" --warmup "$WARMUP" --timeout 5 >"$tmp/lg.json" 2>"$tmp/lg.err" &
          lg=$!
          pids+=("$lg")
          # CPU from the end of the warm-up (loadgen connects within milliseconds).
          sleep "$WARMUP"
          p0=$(ticks "$cpid") u0=$(ticks "${up_pid[$u]}")
          wait "$lg" || true
          forget "$lg"
          p1=$(ticks "$cpid") u1=$(ticks "${up_pid[$u]}")
          [ -n "$cpid" ] && stop "$cpid"
          summary=$(tr -d '\n' <"$tmp/lg.json")
          [ -n "$summary" ] || summary='{}'
          line="{\"round\":$round,\"upstream\":\"$u\",\"mode\":\"$mode\",\"load\":\"$load\",\"contender\":\"$c\",\"proxy_ticks\":$((p1 - p0)),\"proxied\":$([ -n "$cpid" ] && echo true || echo false),\"upstream_ticks\":$((u1 - u0)),\"clk_tck\":$tck,\"loadgen\":$summary}"
          echo "$line" >>"$RESULTS"
          python3 - "$line" <<'EOF'
import json, sys
r = json.loads(sys.argv[1]); g = r["loadgen"]; n = max(g.get("elements", 0), 1)
cpu = f'{r["proxy_ticks"] / r["clk_tck"] / n * 1e6:.2f}' if r["proxied"] else "-"
lat = g.get("latency_us", {})
print(f'round {r["round"]} {r["upstream"]:6} {r["mode"]:5} {r["load"]:5} {r["contender"]:11} '
      f'rps {g.get("rps", 0):9.0f}  p50 {lat.get("p50", 0):8.1f}  p99 {lat.get("p99", 0):8.1f} us  '
      f'proxy {cpu} us/call  upstream {r["upstream_ticks"] / r["clk_tck"] / n * 1e6:.2f} us/call  '
      f'errors {g.get("errors", "?")}+{g.get("mismatches", "?")}', flush=True)
EOF
          if ! grep -q '"rps"' "$tmp/lg.json"; then
            echo "  loadgen said: $(tail -3 "$tmp/lg.err")" >&2
          fi
        done
      done
    done
  done
done

python3 - "$RESULTS" <<'EOF'
import json, statistics, sys
from collections import defaultdict

runs = defaultdict(list)
order = []
for line in open(sys.argv[1]):
    r = json.loads(line)
    key = (r["upstream"], r["mode"], r["load"], r["contender"])
    if key not in runs:
        order.append(key)
    runs[key].append(r)

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None

row = {}
for key, rs in runs.items():
    def per_call(field):
        return med([r[field] / r["clk_tck"] / r["loadgen"]["elements"] * 1e6
                    for r in rs if r["loadgen"].get("elements")])
    g = [r["loadgen"] for r in rs]
    row[key] = dict(
        rps=med([x.get("rps") for x in g]),
        p50=med([x.get("latency_us", {}).get("p50") for x in g]),
        p99=med([x.get("latency_us", {}).get("p99") for x in g]),
        cpu=per_call("proxy_ticks") if rs[0]["proxied"] else None,
        up=per_call("upstream_ticks"),
        bad=sum(x.get("errors", 1) + x.get("mismatches", 0) for x in g),
        n=len(rs),
    )

def f(x, fmt):
    return "-" if x is None else format(x, fmt)

def ratio(a, b):
    return "-" if a is None or not b else f"{a / b:.2f}"

print()
print("Median of rounds. cpu = proxy CPU per call (utime+stime of its processes), up = the")
print("upstream's; +p50 = p50 added vs direct (the TCP row: vs direct-tcp); x nginx = ratio")
print("to nginx in the same upstream/mode/load; bad = errors + mismatches over all rounds.")
hdr = (f'{"upstream":8} {"mode":5} {"load":5} {"contender":11} {"req/s":>9} {"p50 us":>8} '
       f'{"p99 us":>8} {"+p50":>7} {"cpu us":>7} {"up us":>6} {"rps x ngx":>9} {"cpu x ngx":>9} '
       f'{"bad":>4} {"runs":>4}')
print(hdr)
print("-" * len(hdr))
last = None
for key in order:
    u, m, l, c = key
    if last and last != (u, m, l):
        print()
    last = (u, m, l)
    x = row[key]
    ngx = row.get((u, m, l, "nginx"))
    base = row.get((u, m, l, "direct-tcp" if c.endswith("-tcp") else "direct"))
    added = None if not base or x["p50"] is None or base["p50"] is None else x["p50"] - base["p50"]
    print(f'{u:8} {m:5} {l:5} {c:11} {f(x["rps"], ".0f"):>9} {f(x["p50"], ".1f"):>8} '
          f'{f(x["p99"], ".1f"):>8} {f(added, "+.1f"):>7} {f(x["cpu"], ".2f"):>7} '
          f'{f(x["up"], ".2f"):>6} {ratio(x["rps"], ngx and ngx["rps"]):>9} '
          f'{ratio(x["cpu"], ngx and ngx["cpu"]):>9} {x["bad"]:>4} {x["n"]:>4}')
EOF
