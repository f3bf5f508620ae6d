#!/usr/bin/env bash
# Server builds (or flags) side by side under an authenticated TCP load: each server on
# CPU 1, one `loadgen --compare` on CPU 0 running them in turn, round after round. What
# the de-duplication store's changes were measured with (docs/PERFORMANCE.md, stops
# 28-31): the servers get a key file (`bench-1`, allow "*") and the load authenticates
# with an `rpc.auth` hello, so `incr` is de-duplicated by identity and id.
#
#   bash benches/scripts/servers_ab.sh NAME=SERVER[:FLAGS] ...
#   # say: old=/tmp/server-old:"--dedup memory" new=target/release/examples/server:"--dedup memory"
#
# Environment (defaults in brackets): LOADGEN [target/release/loadgen], MIX [incr],
# CONNECTIONS [16], DEPTH [64], DURATION [3] s per server and round, WARMUP [1] s,
# ROUNDS [4], LOADGEN_FLAGS [] more loadgen flags (`--busy-poll`: see
# docs/PERFORMANCE.md, stop 36). Later servers in the list tend to come out a few percent faster on this
# VM: list the builds interleaved (a b a b), and run both orders.
set -euo pipefail
cd "$(dirname "$0")/../.."
. benches/scripts/lib.sh servers_ab
loadgen=${LOADGEN:-target/release/loadgen}
need "$loadgen"
[ $# -ge 2 ] || { echo "usage: $0 NAME=SERVER[:FLAGS] NAME=SERVER[:FLAGS] ..." >&2; exit 2; }
printf '[[key]]\nname  = "bench-1"\ntoken = "b3nch-t0ken-1"\nallow = ["*"]\n' >"$tmp/keys.toml"
srv=() lg=()
if [ "$(nproc)" -ge 2 ]; then srv=(taskset -c 1); lg=(taskset -c 0); fi
urls=()
for spec in "$@"; do
  name=${spec%%=*} rest=${spec#*=}
  bin=${rest%%:*} flags=""
  [[ "$rest" == *:* ]] && flags=${rest#*:}
  need "$bin"
  # shellcheck disable=SC2086 # word splitting wanted: several flags
  "${srv[@]}" "$bin" --tcp 127.0.0.1:0 --http off --auth-file "$tmp/keys.toml" $flags >"$tmp/$name.out" 2>&1 &
  pids+=($!)
  urls+=("$name=tcp://$(listening "$tmp/$name.out" tcp)")
done
# shellcheck disable=SC2086 # LOADGEN_FLAGS: several flags
"${lg[@]}" "$loadgen" --compare "${urls[@]}" --rounds "${ROUNDS:-4}" --duration "${DURATION:-3}" \
  --warmup "${WARMUP:-1}" --connections "${CONNECTIONS:-16}" --depth "${DEPTH:-64}" --mix "${MIX:-incr}" \
  --hello '{"jsonrpc":"2.0","method":"rpc.auth","params":{"token":"b3nch-t0ken-1"},"id":0}' \
  ${LOADGEN_FLAGS:-}
