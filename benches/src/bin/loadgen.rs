//! A load generator for any JSON-RPC 2.0 server, over newline-delimited TCP, a Unix
//! socket, HTTP/1.1 or WebSocket. The user's guide is docs/LOADGEN.md.
//!
//! ```text
//! cargo run --release -p benches --bin loadgen -- (--tcp ADDR | --unix PATH | --http URL
//!         | --ws URL | --compare [NAME=]URL... [--rounds 3])
//!     [--connections 16] [--depth 1] [--batch 0] [--mix subtract:1 | --workload FILE]
//!     [--duration SECS | --count N] [--warmup SECS] [--threads 1] [--no-verify]
//!     [--rate N] [--json FILE] [--plot FILE.svg] [--header 'NAME: VALUE'] [--hello JSON]
//! ```
//!
//! Each connection keeps `--depth` messages in flight (written back to back: pipelining,
//! for HTTP too). Over WebSocket (`ws://host:port/path`) each message is one masked text
//! frame, with an all-zero masking key so the ids are patched in place as on the other
//! transports (the server unmasks all the same); answers are read as the server's frames. A message is one request, or with `--batch B` a batch of B calls. The
//! calls cycle through `--mix` (`subtract:3,ping:1,echo:1,add:1`; a weight defaults to
//! one) over the demo methods: `subtract` `[42,23]` → 19, `add` `[a,b]` → a+b, `sum`
//! `[1,2,3,4]` → 10, `ping` → `"pong"`, `echo` (a small object) → the params,
//! `get_data` → `["hello",5]`, `sleep` `{"ms":--sleep-ms}` → null, `delay` `[--sleep-ms]` → null,
//! `incr` `[1]` → any integer (a server-wide counter, de-duplicated by the demo server).
//!
//! A protected server: `--header 'NAME: VALUE'` (repeatable) adds a header line to every
//! HTTP request and to the WebSocket handshake (`Authorization: Bearer TOKEN`);
//! `--hello JSON` (TCP, Unix, WebSocket) sends one request on each connection right
//! after connecting, before any load, and needs a result back (`rpc.auth`), else the
//! connection fails (exit 2). Call ids are unique across the connections, threads and
//! `--compare` rounds of a run (a de-duplicating server keys calls by identity and id),
//! and a process starts its ids from the clock, so runs one after another do not reuse
//! them either.
//!
//! Every response is verified (unless `--no-verify`, for a server with a fixed answer):
//! a JSON-RPC 2.0 response whose id is one this connection has outstanding, answered
//! exactly once (batch answers in any order), with the right result. JSON-RPC error
//! responses, malformed responses, closed connections and stalls (nothing received for
//! `--timeout` seconds while requests are outstanding) are counted as errors; unknown or
//! repeated ids, wrong results and missing batch answers as mismatches. The exit code is
//! 1 when any occurred (with `--no-verify`: any transport error), 2 on a usage or connect
//! failure.
//!
//! Closed loop (the default): each connection sends as soon as it has room. Open loop
//! (`--rate N`): messages are due on a fixed schedule, N per second in all, connection
//! `i`'s at `(i + k * connections) / N` s; one due while its connection has `--depth` in
//! flight waits, and its latency counts from its due time, not its write, so a server
//! that stalls is charged for every call it delayed (coordinated omission corrected, as
//! wrk2 does). A timer fd in the poll wakes the thread at each due time. The summary then
//! adds `rate` and `service_us` (the same run measured from the writes, as a closed-loop
//! tool would report it). In duration mode every message due in the window is sent,
//! however late: a server slower than the rate makes the run last longer.
//!
//! Latency is measured per message, from its write (open loop: its due time) to its
//! complete answer, into HdrHistograms per thread, overall and per method (nanoseconds,
//! merged at the end; reported in µs). Messages written during `--warmup` are answered
//! and verified but not counted. On a terminal a progress line (rate, errors, p99 so
//! far) is rewritten on stderr every second; the JSON summary goes to stdout at the end
//! (with `--compare`, a table instead; `--json` and `--plot` write the rest).
//!
//! Each thread (`--threads`) drives its share of the connections with its own `mio`
//! poll, edge-triggered. Requests are serialized once at start-up (each distinct message,
//! with its HTTP head); sending one copies it into the connection's write buffer and
//! patches its fixed-width ids in place. An answer spelled as compact encoders write it
//! (`{"jsonrpc":"2.0","id":ID,"result":R}`, or a batch of those) with exactly the
//! expected `R` is checked by comparing bytes; any other is parsed in place with
//! serde_json (borrowed structs, batches walked element by element). Either way the
//! steady-state loop does not allocate.

#[path = "../loadgen/mod.rs"]
mod loadgen;

fn main() -> std::process::ExitCode {
    loadgen::main()
}
