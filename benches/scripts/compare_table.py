#!/usr/bin/env python3
"""Turns compare.sh output into the docs/PERFORMANCE.md table: medians over rounds of
requests (elements) per second, p50 latency, server CPU per request, and the ratios of
each round's measurements taken side by side.

usage: compare_table.py < compare.out
"""
import json, statistics, sys
from collections import defaultdict

runs = defaultdict(list)  # (placement, test, server) -> [(rps, p50_us, cpu_us_per_req)]
for line in sys.stdin:
    head, _, js = line.partition("{")
    parts = head.split()
    if len(parts) < 5 or parts[1] == "verify":
        continue
    placement, rnd, test, server = parts[:4]
    ticks = int(parts[4].split("=")[1])
    d = json.loads("{" + js)
    if d.get("failed"):
        continue
    eps = d["elements_per_s"]
    # server CPU (clock ticks of 10 ms) over warm-up + measurement, per element.
    elems = eps * (d["duration_s"] + 1)
    runs[(placement, test, server)].append((rnd, eps, d["latency_us"]["p50"], ticks * 1e4 / elems))

def med(xs):
    return statistics.median(xs) if xs else float("nan")

def ratio(placement, test, a, b, field):
    ra = {r[0]: r[field] for r in runs[(placement, test, a)]}
    rb = {r[0]: r[field] for r in runs[(placement, test, b)]}
    return med([ra[k] / rb[k] for k in ra if k in rb and rb[k]])

print("| placement | test | server | elements/s (median) | p50 µs | server CPU µs/element |")
print("| --- | --- | --- | --- | --- | --- |")
for (placement, test, server), rs in sorted(runs.items()):
    print(f"| {placement} | {test} | {server} | {med([r[1] for r in rs]):,.0f} | {med([r[2] for r in rs]):.1f} | {med([r[3] for r in rs]):.2f} |")
print()
print("| placement | test | ringrpc / floor (rps) | ringrpc / jsonrpsee (rps) | p50 ringrpc − floor µs | CPU/element ringrpc / floor |")
print("| --- | --- | --- | --- | --- | --- |")
tests = sorted({(p, t) for (p, t, _) in runs})
for p, t in tests:
    rf = ratio(p, t, "ringrpc", "floor", 1) if runs[(p, t, "floor")] else None
    rj = ratio(p, t, "ringrpc", "jsonrpsee", 1) if runs[(p, t, "jsonrpsee")] else None
    dp = None
    if runs[(p, t, "floor")]:
        dp = med([r[2] for r in runs[(p, t, "ringrpc")]]) - med([r[2] for r in runs[(p, t, "floor")]])
    cf = ratio(p, t, "ringrpc", "floor", 3) if runs[(p, t, "floor")] else None
    fmt = lambda x, f: "—" if x is None else f.format(x)
    print(f"| {p} | {t} | {fmt(rf, '{:.2f}×')} | {fmt(rj, '{:.2f}×')} | {fmt(dp, '{:+.1f}')} | {fmt(cf, '{:.2f}×')} |")
