#!/usr/bin/env bash
# Sums the long runs in fuzz/logs/: per target, seconds, executions, the last run's
# final cov/ft, and the corpus now committed (files, bytes).
cd "$(dirname "$0")"
printf '| target | time | executions | cov (edges) | ft (features) | corpus files | corpus bytes | crashes |\n|---|---|---|---|---|---|---|---|\n'
for t in engine differential structured lines http client; do
  secs=0; runs=0; last=""
  for f in logs/$t-*.log; do
    [ -e "$f" ] || continue
    d=$(grep -E '^Done [0-9]+ runs in [0-9]+ second' "$f" | tail -1)
    [ -n "$d" ] || continue
    runs=$((runs + $(echo "$d" | awk '{print $2}')))
    secs=$((secs + $(echo "$d" | awk '{print $5}')))
    last=$(grep -E '^#[0-9]+.*DONE' "$f" | tail -1)
  done
  cov=$(echo "$last" | sed -n 's/.*cov: \([0-9]*\).*/\1/p'); ft=$(echo "$last" | sed -n 's/.*ft: \([0-9]*\).*/\1/p')
  crashes=$(ls artifacts/$t 2>/dev/null | wc -l)
  files=$(ls corpus/$t | wc -l); bytes=$(cat corpus/$t/* | wc -c)
  printf '| %s | %d min %02d s | %s | %s | %s | %s | %s | %s |\n' "$t" $((secs/60)) $((secs%60)) "$runs" "$cov" "$ft" "$files" "$bytes" "$crashes"
done
