#!/usr/bin/env python3
"""ringrpc's demo methods served by Python's `jsonrpcserver` (PyPI) over HTTP/1.1.

The third implementation of docs/CONFORMANCE.md's table: a JSON-RPC library in another
language, installed from a package registry (`python3 -m pip install jsonrpcserver`), behind
the small HTTP wrapper its documentation shows, made HTTP/1.1 (keep-alive, pipelining) so
that only the library's own answers are judged:

    python3 benches/scripts/jsonrpcserver_http.py [--port 0]

Prints `listening http 127.0.0.1:PORT` once it accepts connections, then serves until
killed. Each POST body goes to `jsonrpcserver.dispatch` as the bytes that came (its default
deserializer, `json.loads`, takes bytes, so invalid UTF-8 is the library's parse error, not
the wrapper's). An empty answer (a notification, or a batch of them) is `204 No Content`.

The methods answer as `ringrpc::demo` does: `subtract` (`[a, b]` or `{"minuend",
"subtrahend"}`, integers), `sum` (an array of integers), `get_data` (`["hello", 5]`),
`ping` (`"pong"`), and `update` / `notify_hello` / `notify_sum` (notifications; called
with an id they answer `null`). Params of the wrong type are `-32602` (the library's
`InvalidParams`).
"""

import argparse
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from jsonrpcserver import InvalidParams, Result, Success, dispatch, method


def _int(v):
    # bool is an int in Python; JSON's true is not a number.
    return isinstance(v, int) and not isinstance(v, bool)


@method
def subtract(*args, **kwargs) -> Result:
    if args and kwargs:
        return InvalidParams("positional or named, not both")
    if kwargs:
        if set(kwargs) != {"minuend", "subtrahend"}:
            return InvalidParams("expected {minuend, subtrahend}")
        a, b = kwargs["minuend"], kwargs["subtrahend"]
    elif len(args) == 2:
        a, b = args
    else:
        return InvalidParams("expected [minuend, subtrahend]")
    if not (_int(a) and _int(b)):
        return InvalidParams("expected two integers")
    return Success(a - b)


@method
def sum(*args) -> Result:  # noqa: A001 (the spec's method name)
    if not all(_int(v) for v in args):
        return InvalidParams("expected an array of integers")
    total = 0
    for v in args:
        total += v
    return Success(total)


@method
def get_data() -> Result:
    return Success(["hello", 5])


@method
def ping() -> Result:
    return Success("pong")


def _notification(*args, **kwargs) -> Result:
    return Success(None)


for _name in ("update", "notify_hello", "notify_sum"):
    method(_notification, name=_name)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self.send_error(411)
            return
        answer = dispatch(self.rfile.read(int(length)))
        if answer == "":
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = answer.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args) -> None:  # noqa: A002
        pass


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=7911)
    a = p.parse_args()
    server = ThreadingHTTPServer((a.host, a.port), Handler)
    server.daemon_threads = True
    host, port = server.server_address[:2]
    print(f"listening http {host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
