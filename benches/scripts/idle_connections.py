#!/usr/bin/env python3
"""Resident memory of a server holding 10,000 idle TCP connections.

usage: idle_connections.py PID PORT [N]
Opens N (default 10,000) connections to 127.0.0.1:PORT, checks the last one is served,
and prints the server's VmRSS before and after. Needs `ulimit -n` above N on both sides.
"""
import resource, socket, sys, time

pid, port = int(sys.argv[1]), int(sys.argv[2])
n = int(sys.argv[3]) if len(sys.argv) > 3 else 10000
resource.setrlimit(resource.RLIMIT_NOFILE, (n + 1000, n + 1000))

def rss_kib():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1])

before = rss_kib()
socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
time.sleep(1.0)
socks[-1].sendall(b'{"jsonrpc":"2.0","method":"ping","id":1}\n')
socks[-1].settimeout(5)
assert b"pong" in socks[-1].recv(100)
time.sleep(0.5)
after = rss_kib()
print(f"{n} idle connections: server VmRSS {before} KiB -> {after} KiB, +{(after - before) / 1024:.1f} MiB")
