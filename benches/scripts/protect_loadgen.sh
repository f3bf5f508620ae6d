#!/usr/bin/env bash
# Issue 12 with the loadgen: what authentication + allow-lists, rate limits and in-memory
# de-duplication cost the demo server, side by side (`loadgen --compare`, rounds
# interleaved), over TCP (16 connections x 64 in flight) and HTTP (16 x 1).
#
#   bash benches/scripts/protect_loadgen.sh [OUT]   # keeps the --json files in OUT/
#
# Environment (defaults in brackets): DURATION [5] s per server and round, WARMUP [1] s,
# ROUNDS [3], LOADS ["tcp:16x64 http:16x1"], SERVER_ARGS [] more flags for every server
# (say --no-metrics). A smoke run: DURATION=1 WARMUP=0.2 ROUNDS=1.
#
# Builds the release server and loadgen, writes the key files to a temp dir, and starts
# five demo servers on free ports (TCP and HTTP each), all on CPU 1, loadgen on CPU 0
# (with fewer than 2 CPUs, unpinned):
#   none      no guard
#   auth      --auth-file: keys `bench-N` (allow ping, incr; one per load), no rate limit
#   keyrate   --auth-file: the same key with rate 1e9/s, burst 1e6 (never reached)
#   peerrate  --rate-limit 1000000000:1000000 per peer address, callers anonymous
#   dedup     --auth-file as `auth`, and --dedup memory
# Compared: `ping` on none, auth, keyrate and peerrate; `incr` (de-duplicated by the
# demo set; keyed by identity and id, so authenticated) on auth (no store) and dedup.
# Credentials: over HTTP `--header 'Authorization: Bearer TOKEN'` to every server (one
# without --auth-file ignores it); over TCP an `rpc.auth` --hello, which a server without
# keys refuses (-32601), so TCP runs two --compare groups for ping: anonymous (none,
# peerrate) and keyed (auth, keyrate). Ratios across the two groups come from separate
# invocations (marked *): read them with more caution than those within one.
set -euo pipefail
cd "$(dirname "$0")/../.."
keep=${1:-}
DURATION=${DURATION:-5}
WARMUP=${WARMUP:-1}
ROUNDS=${ROUNDS:-3}
LOADS=${LOADS:-tcp:16x64 http:16x1}
read -r -a server_args <<<"${SERVER_ARGS:-}"
cargo build --release -q -p examples --example server -p benches --bin loadgen
bin=${CARGO_TARGET_DIR:-target}/release
. benches/scripts/lib.sh protect_loadgen
need "$bin/examples/server" "$bin/loadgen"
srv=() lg=()
if [ "$(nproc)" -ge 2 ]; then srv=(taskset -c 1); lg=(taskset -c 0); fi
out=${keep:-$tmp}
mkdir -p "$out"

# A key per load, so that no two loadgen processes send `incr` under one identity: the
# de-dup key is (identity, id), and ids are surely unique only within one process.
: >"$tmp/keys.toml"
: >"$tmp/keys-rate.toml"
n=0
for spec in $LOADS; do
  n=$((n + 1))
  for f in keys keys-rate; do
    printf '[[key]]\nname  = "bench-%s"\ntoken = "b3nch-t0ken-%s"\nallow = ["ping", "incr"]\n' "$n" "$n" >>"$tmp/$f.toml"
  done
  printf 'rate  = 1e9\nburst = 1000000\n\n' >>"$tmp/keys-rate.toml"
  printf '\n' >>"$tmp/keys.toml"
done

declare -A tcp http
# start NAME FLAGS...: a demo server on free ports; its addresses in tcp[NAME], http[NAME].
start() {
  local name=$1
  shift
  "${srv[@]}" "$bin/examples/server" --tcp 127.0.0.1:0 --http 127.0.0.1:0 \
    ${server_args[@]+"${server_args[@]}"} "$@" >"$tmp/$name.out" 2>&1 &
  pids+=($!)
  tcp[$name]=$(listening "$tmp/$name.out" tcp)
  http[$name]=$(listening "$tmp/$name.out" http)
}
start none
start auth --auth-file "$tmp/keys.toml"
start keyrate --auth-file "$tmp/keys-rate.toml"
start peerrate --rate-limit 1000000000:1000000
start dedup --auth-file "$tmp/keys.toml" --dedup memory

# group FILE TRANSPORT LOAD MIX CREDENTIALS NAME...: one --compare of NAMEs' servers.
group() {
  local file=$1 transport=$2 load=$3 mix=$4 cred=$5
  shift 5
  local c=${load%x*} d=${load#*x} urls=() n
  for n; do
    if [ "$transport" = tcp ]; then urls+=("$n=tcp://${tcp[$n]}"); else urls+=("$n=http://${http[$n]}/"); fi
  done
  local auth=() token=b3nch-t0ken-$key
  case $cred in
  hello) auth=(--hello '{"jsonrpc":"2.0","method":"rpc.auth","params":{"token":"'"$token"'"},"id":0}') ;;
  header) auth=(--header "Authorization: Bearer $token") ;;
  esac
  echo "== $transport $load, $mix: $*"
  "${lg[@]}" "$bin/loadgen" --compare "${urls[@]}" --rounds "$ROUNDS" --duration "$DURATION" \
    --warmup "$WARMUP" --connections "$c" --depth "$d" --mix "$mix" ${auth[@]+"${auth[@]}"} \
    --json "$out/$file.json"
}

files=()
key=0
for spec in $LOADS; do
  key=$((key + 1))
  transport=${spec%%:*} load=${spec#*:}
  if [ "$transport" = tcp ]; then
    group "tcp-$load-ping-anon" tcp "$load" ping none none peerrate
    group "tcp-$load-ping-keyed" tcp "$load" ping hello auth keyrate
    files+=("tcp-$load-ping-anon" "tcp-$load-ping-keyed")
    group "tcp-$load-incr" tcp "$load" incr hello auth dedup
    files+=("tcp-$load-incr")
  else
    group "$transport-$load-ping" "$transport" "$load" ping header none auth keyrate peerrate
    group "$transport-$load-incr" "$transport" "$load" incr header auth dedup
    files+=("$transport-$load-ping" "$transport-$load-incr")
  fi
done

echo
python3 - "$out" "${files[@]}" <<'PY'
import json, sys
out, files = sys.argv[1], sys.argv[2:]
what = {
    "none": "no guard",
    "auth": "key + allow-list",
    "keyrate": "key + allow-list + rate per key",
    "peerrate": "anonymous, rate per peer",
    "dedup": "key + allow-list + --dedup memory",
}
print(f"{'load':16} {'method':6} {'server':44} {'calls/s':>10} {'ratio':>8}  to")
for f in files:
    d = json.load(open(f"{out}/{f}.json"))
    load = " ".join(f.split("-")[:2])
    method = f.split("-")[2]
    rows = [(s["name"], s["summary"]["elements_per_s"], s["summary"]["errors"] + s["summary"]["mismatches"])
            for s in d["servers"]]
    # ping: each to `none` (from the anonymous group's file over TCP); incr: to auth.
    base_name = "none" if method == "ping" else "auth"
    base, star = None, ""
    for n, rate, _ in rows:
        if n == base_name:
            base = rate
    if base is None and f.endswith("keyed"):
        anon = json.load(open(f"{out}/{f[:-len('keyed')]}anon.json"))
        base = next(s["summary"]["elements_per_s"] for s in anon["servers"] if s["name"] == "none")
        star = "*"
    for n, rate, bad in rows:
        label = what[n] if not (method == "incr" and n == "auth") else "key + allow-list, no store"
        ratio = f"{rate / base:.3f}" if base else "-"
        note = f"  {bad} errors/mismatches" if bad else ""
        print(f"{load:16} {method:6} {n + ': ' + label:44} {rate:10.0f} {ratio:>8}  {base_name}{star if n != base_name else ''}{note}")
print("* from separate --compare runs (a server without keys refuses the TCP hello)")
PY
if [ -n "$keep" ]; then echo "the --json files are in $out/"; fi
