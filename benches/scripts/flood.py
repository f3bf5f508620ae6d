#!/usr/bin/env python3
"""A client that writes 1 KB `echo` requests for 10 s and never reads, while another
client pings every 200 ms; prints the server's resident memory growth and the pings.

usage: flood.py PID PORT [SECONDS]
"""
import json, socket, sys, time

pid, port = int(sys.argv[1]), int(sys.argv[2])
seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 10.0

def rss_kib():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1])

req = (json.dumps({"jsonrpc": "2.0", "method": "echo", "params": {"blob": "x" * 1000}, "id": 1}) + "\n").encode()
chunk = req * 64
before = peak = rss_kib()
flood = socket.create_connection(("127.0.0.1", port))
flood.setblocking(False)
ping = socket.create_connection(("127.0.0.1", port))
ping.settimeout(5)
sent, pings, answered, last = 0, [], 0, 0.0
stop = time.time() + seconds
while time.time() < stop:
    try:
        sent += flood.send(chunk)
    except BlockingIOError:
        time.sleep(0.001)
    if time.time() - last > 0.2:
        last = t = time.time()
        ping.sendall(b'{"jsonrpc":"2.0","method":"ping","id":7}\n')
        answered += b"pong" in ping.recv(200)
        pings.append((time.time() - t) * 1000)
        peak = max(peak, rss_kib())
peak = max(peak, rss_kib())
pings.sort()
print(f"flood: {sent / 1e6:.1f} MB written by a client that never reads; server VmRSS {before} KiB, "
      f"peak {peak} KiB (+{(peak - before) / 1024:.1f} MiB); pings answered {answered}/{len(pings)}, "
      f"median {pings[len(pings) // 2]:.2f} ms, max {pings[-1]:.1f} ms")
