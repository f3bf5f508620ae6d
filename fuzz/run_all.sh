#!/usr/bin/env bash
# Long fuzzing runs: each target in turn for SECONDS (default 1800), one job at a time,
# at low priority, logging to fuzz/logs/. New inputs go to fuzz/corpus/<target>;
# minimize afterwards with `cargo +nightly fuzz cmin <target>` (see docs/FUZZING.md).
#
#   fuzz/run_all.sh [SECONDS] [TARGET...]
set -uo pipefail
cd "$(dirname "$0")"
secs=${1:-1800}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(engine differential structured lines http client)
mkdir -p logs
for t in "${targets[@]}"; do
  dict=jsonrpc.dict
  [ "$t" = http ] && dict=http.dict
  [ "$t" = client ] && dict=client.dict
  log="logs/$t-$(date +%Y%m%d-%H%M%S).log"
  echo "== $t for ${secs}s -> $log"
  nice -n 10 cargo +nightly fuzz run "$t" "corpus/$t" -- \
    -max_total_time="$secs" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
    -dict="$dict" -print_final_stats=1 >"$log" 2>&1
  echo "   exit $? ($(grep -E '^#[0-9]+.*(DONE|pulse|NEW|REDUCE)' "$log" | tail -1))"
done
