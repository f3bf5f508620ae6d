#!/usr/bin/env bash
# One reactor vs two (SO_REUSEPORT), nothing pinned: the server and loadgen share the
# machine's two CPUs as a deployment would. Rounds alternate the two servers.
#
#   bash benches/scripts/reactors.sh [SECONDS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-5}
rounds=${2:-3}
cargo build --release -q --example server -p examples
cargo build --release -q -p benches --bin loadgen
bin=${CARGO_TARGET_DIR:-target}/release
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
$bin/examples/server --tcp 127.0.0.1:7710 --http 127.0.0.1:7711 --idle-timeout-ms 0 --reactors 1 >/dev/null 2>&1 &
pids+=($!)
$bin/examples/server --tcp 127.0.0.1:7720 --http 127.0.0.1:7721 --idle-timeout-ms 0 --reactors 2 >/dev/null 2>&1 &
pids+=($!)
sleep 1
for round in $(seq "$rounds"); do
  for n in 1 2; do
    for load in "tcp16x64|--tcp|127.0.0.1:77${n}0|64" "tcp16x1|--tcp|127.0.0.1:77${n}0|1" "http16x1|--http|http://127.0.0.1:77${n}1/|1"; do
      IFS='|' read -r label flag addr depth <<<"$load"
      rps=$($bin/loadgen $flag $addr --connections 16 --depth "$depth" --no-verify --duration "$secs" --warmup 1 2>/dev/null |
        python3 -c 'import json,sys; print(round(json.loads(sys.stdin.read().strip().splitlines()[-1])["rps"]))')
      echo "r$round reactors=$n $label rps=$rps"
    done
  done
done
