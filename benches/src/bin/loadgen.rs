//! A load generator for any JSON-RPC 2.0 server, over newline-delimited TCP, HTTP/1.1 or
//! WebSocket.
//!
//! ```text
//! cargo run --release -p benches --bin loadgen -- (--tcp ADDR | --http URL | --ws URL)
//!     [--connections 16] [--depth 1] [--batch 0] [--mix subtract:1]
//!     [--duration SECS | --count N] [--warmup SECS] [--threads 1] [--no-verify]
//! ```
//!
//! Each connection keeps `--depth` messages in flight (written back to back: pipelining,
//! for HTTP too). Over WebSocket (`ws://host:port/path`) each message is one masked text
//! frame, with an all-zero masking key so the ids are patched in place as on the other
//! transports (the server unmasks all the same); answers are read as the server's frames. A message is one request, or with `--batch B` a batch of B calls. The
//! calls cycle through `--mix` (`subtract:3,ping:1,echo:1,add:1`; a weight defaults to
//! one) over the demo methods: `subtract` `[42,23]` → 19, `add` `[a,b]` → a+b, `sum`
//! `[1,2,3,4]` → 10, `ping` → `"pong"`, `echo` (a small object) → the params,
//! `get_data` → `["hello",5]`, `sleep` `{"ms":--sleep-ms}` → null.
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
//! Latency is measured per message, from its write to its complete answer, into an
//! HdrHistogram per thread (nanoseconds, merged at the end; reported in µs). Messages
//! written during `--warmup` are answered and verified but not counted. A progress line
//! goes to stderr every second; the JSON summary to stdout at the end.
//!
//! Each thread (`--threads`) drives its share of the connections with its own `mio`
//! poll, edge-triggered. Requests are serialized once at start-up (each distinct message,
//! with its HTTP head); sending one copies it into the connection's write buffer and
//! patches its fixed-width ids in place. An answer spelled as compact encoders write it
//! (`{"jsonrpc":"2.0","id":ID,"result":R}`, or a batch of those) with exactly the
//! expected `R` is checked by comparing bytes; any other is parsed in place with
//! serde_json (borrowed structs, batches walked element by element). Either way the
//! steady-state loop does not allocate.

use std::collections::VecDeque;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, OnceLock};
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use serde::de::{SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

#[derive(Parser, Clone)]
#[command(about = "Load generator and verifier for JSON-RPC 2.0 servers (TCP, HTTP or WebSocket)")]
struct Args {
    /// Newline-delimited JSON over TCP to ADDR (host:port).
    #[arg(
        long,
        value_name = "ADDR",
        conflicts_with_all = ["http", "ws"],
        required_unless_present_any = ["http", "ws"]
    )]
    tcp: Option<String>,
    /// HTTP/1.1 keep-alive POSTs to URL (http://host:port/path).
    #[arg(long, value_name = "URL", conflicts_with = "ws")]
    http: Option<String>,
    /// WebSocket messages to URL (ws://host:port/path).
    #[arg(long, value_name = "URL")]
    ws: Option<String>,
    /// Connections.
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// Messages in flight per connection (pipelining).
    #[arg(long, default_value_t = 1)]
    depth: usize,
    /// 0: single requests; B ≥ 1: each message is a batch of B calls.
    #[arg(long, default_value_t = 0)]
    batch: usize,
    /// Request mix, `method[:weight],...` (subtract, add, sum, ping, echo, get_data, sleep).
    #[arg(long, default_value = "subtract:1")]
    mix: String,
    /// Seconds to measure (after the warm-up); the default when --count is not given is 10.
    #[arg(long, conflicts_with = "count")]
    duration: Option<f64>,
    /// Messages to measure in total (after the warm-up), spread over the connections.
    #[arg(long)]
    count: Option<u64>,
    /// Seconds of load before measuring.
    #[arg(long, default_value_t = 0.0)]
    warmup: f64,
    /// Threads, each with its own poll and its share of the connections.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Do not check the responses (for a server with a fixed answer): only frame them.
    #[arg(long)]
    no_verify: bool,
    /// The `ms` of `sleep` calls.
    #[arg(long, default_value_t = 1)]
    sleep_ms: u64,
    /// Seconds without any byte received, while requests are outstanding, after which a
    /// connection is given up as stalled.
    #[arg(long, default_value_t = 10.0)]
    timeout: f64,
    /// Subscriber mode (TCP or WebSocket): each connection calls `subscribe_ticks [MS]`
    /// once and then only reads, counting the `tick` notifications delivered (and any
    /// `lagged` counts of dropped ones); the summary gives notifications per second.
    #[arg(long, value_name = "MS")]
    ticks: Option<f64>,
    /// With --ticks: each connection's subscribe call differs (its interval written
    /// `MS.000000000NNN`, NNN its number: the same interval to a microsecond's
    /// billionth, but another call to a proxy that shares identical subscriptions).
    #[arg(long, requires = "ticks")]
    ticks_distinct: bool,
}

// ---------------------------------------------------------------------------------------
// The plan: pre-serialized messages and what their answers must be.

/// Ids are 10-digit decimal numbers, so they are patched in place.
const ID_BASE: u64 = 1_000_000_000;
const ID_END: u64 = 10_000_000_000;
const ID_DIGITS: usize = 10;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Method {
    Subtract,
    Add,
    Sum,
    Ping,
    Echo,
    GetData,
    Sleep,
}

impl Method {
    fn parse(s: &str) -> Option<Method> {
        Some(match s {
            "subtract" => Method::Subtract,
            "add" => Method::Add,
            "sum" => Method::Sum,
            "ping" => Method::Ping,
            "echo" => Method::Echo,
            "get_data" => Method::GetData,
            "sleep" => Method::Sleep,
            _ => return None,
        })
    }
}

/// What a call's result must be.
#[derive(Clone, Copy, Debug)]
enum Expect {
    Int(i64),
    Pong,
    GetData,
    Null,
    Echo,
}

/// The `echo` params: keys sorted and no whitespace, so a server that re-encodes them
/// through a map still answers the same bytes (other answers are compared as values);
/// flat, because serde_json allocates to skip over nested containers.
const ECHO_PARAMS: &str = r#"{"a":1,"b":"two","c":true,"d":null,"e":-5}"#;

/// One distinct message: its bytes (HTTP head included) and its calls.
struct Template {
    bytes: Vec<u8>,
    calls: Vec<Call>,
}

/// One call of a message.
struct Call {
    /// Offset of the id's digits in the message.
    at: usize,
    expect: Expect,
    /// The result as a compact encoder writes it (`19`, `"pong"`, the echo params...),
    /// for the fast path.
    canon: Box<[u8]>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Transport {
    Tcp,
    Http,
    Ws,
}

struct Plan {
    transport: Transport,
    addr: SocketAddr,
    /// The HTTP or WebSocket path.
    path: String,
    target: String,
    templates: Vec<Template>,
    /// Calls per message (1 for single requests).
    per: usize,
    depth: usize,
    verify: bool,
    echo_value: serde_json::Value,
    timeout: Duration,
    /// Measured messages per connection (count mode).
    quota: Option<Vec<u64>>,
    warmup: Duration,
    duration: Option<Duration>,
    max_message: usize,
}

/// `method[:weight],...` → a cycle in which each method appears `weight` times, spread
/// evenly (smooth weighted round robin).
fn parse_mix(mix: &str) -> Result<Vec<Method>, String> {
    let mut entries = Vec::new();
    for part in mix.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, weight) = match part.split_once(':') {
            Some((n, w)) => (
                n.trim(),
                w.trim()
                    .parse::<u32>()
                    .map_err(|_| format!("bad weight in {part:?}"))?,
            ),
            None => (part, 1),
        };
        let m = Method::parse(name).ok_or_else(|| {
            format!("unknown method {name:?} (subtract, add, sum, ping, echo, get_data, sleep)")
        })?;
        if weight > 0 {
            entries.push((m, weight as i64));
        }
    }
    let total: i64 = entries.iter().map(|e| e.1).sum();
    if total == 0 {
        return Err("the mix is empty".into());
    }
    if total > 10_000 {
        return Err("the mix's weights add up to more than 10000".into());
    }
    let mut current = vec![0i64; entries.len()];
    let mut cycle = Vec::with_capacity(total as usize);
    for _ in 0..total {
        for (c, e) in current.iter_mut().zip(&entries) {
            *c += e.1;
        }
        let best = (0..entries.len())
            .max_by_key(|&i| (current[i], std::cmp::Reverse(i)))
            .unwrap_or(0);
        current[best] -= total;
        cycle.push(entries[best].0);
    }
    Ok(cycle)
}

/// One call's JSON text, with `ID_DIGITS` zeros for the id; returns the id's offset.
fn call_json(m: Method, position: usize, sleep_ms: u64, out: &mut Vec<u8>) -> Call {
    let (method, params, expect) = match m {
        Method::Subtract => ("subtract", Some("[42,23]".to_string()), Expect::Int(19)),
        Method::Add => {
            let a = position as i64 + 1;
            ("add", Some(format!("[{a},{}]", 2 * a)), Expect::Int(3 * a))
        }
        Method::Sum => ("sum", Some("[1,2,3,4]".into()), Expect::Int(10)),
        Method::Ping => ("ping", None, Expect::Pong),
        Method::Echo => ("echo", Some(ECHO_PARAMS.into()), Expect::Echo),
        Method::GetData => ("get_data", None, Expect::GetData),
        Method::Sleep => (
            "sleep",
            Some(format!("{{\"ms\":{sleep_ms}}}")),
            Expect::Null,
        ),
    };
    out.extend_from_slice(br#"{"jsonrpc":"2.0","method":""#);
    out.extend_from_slice(method.as_bytes());
    out.push(b'"');
    if let Some(p) = params {
        out.extend_from_slice(br#","params":"#);
        out.extend_from_slice(p.as_bytes());
    }
    out.extend_from_slice(br#","id":"#);
    let at = out.len();
    out.extend_from_slice(&[b'0'; ID_DIGITS]);
    out.push(b'}');
    let canon = match expect {
        Expect::Int(v) => v.to_string(),
        Expect::Pong => r#""pong""#.into(),
        Expect::GetData => r#"["hello",5]"#.into(),
        Expect::Null => "null".into(),
        Expect::Echo => ECHO_PARAMS.into(),
    };
    Call {
        at,
        expect,
        canon: canon.into_bytes().into_boxed_slice(),
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// `SCHEME://host:port/path` → (host:port, path).
fn parse_url(url: &str, scheme: &str) -> Result<(String, String), String> {
    let rest = url
        .strip_prefix(scheme)
        .ok_or_else(|| format!("{url:?}: only {scheme} URLs are supported"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() {
        return Err(format!("{url:?}: no host"));
    }
    let authority = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    Ok((authority, path.to_string()))
}

fn build_plan(args: &Args) -> Result<Plan, String> {
    if args.connections == 0 || args.depth == 0 || args.threads == 0 {
        return Err("--connections, --depth and --threads must be at least 1".into());
    }
    if args.batch > 100_000 {
        return Err("--batch is at most 100000".into());
    }
    let cycle = parse_mix(&args.mix)?;
    let (transport, authority, path) = match (&args.tcp, &args.http, &args.ws) {
        (Some(a), None, None) => (Transport::Tcp, a.clone(), String::new()),
        (None, Some(u), None) => {
            let (a, p) = parse_url(u, "http://")?;
            (Transport::Http, a, p)
        }
        (None, None, Some(u)) => {
            let (a, p) = parse_url(u, "ws://")?;
            (Transport::Ws, a, p)
        }
        _ => return Err("give exactly one of --tcp ADDR, --http URL and --ws URL".into()),
    };
    let addr = authority
        .to_socket_addrs()
        .map_err(|e| format!("{authority}: {e}"))?
        .next()
        .ok_or_else(|| format!("{authority}: no address"))?;

    let per = args.batch.max(1);
    let w = cycle.len();
    let messages = if args.batch == 0 { w } else { w / gcd(w, per) };
    let mut templates = Vec::with_capacity(messages);
    for k in 0..messages {
        let mut body = Vec::new();
        let mut calls = Vec::with_capacity(per);
        if args.batch > 0 {
            body.push(b'[');
        }
        for j in 0..per {
            if j > 0 {
                body.push(b',');
            }
            let pos = (k * per + j) % w;
            calls.push(call_json(cycle[pos], pos, args.sleep_ms, &mut body));
        }
        if args.batch > 0 {
            body.push(b']');
        }
        let mut bytes = match transport {
            Transport::Tcp => Vec::new(),
            Transport::Http => format!(
                "POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )
            .into_bytes(),
            Transport::Ws => ws_header(body.len()),
        };
        let head = bytes.len();
        bytes.extend_from_slice(&body);
        if transport == Transport::Tcp {
            bytes.push(b'\n');
        }
        for c in &mut calls {
            c.at += head;
        }
        templates.push(Template { bytes, calls });
    }
    let max_message = templates.iter().map(|t| t.bytes.len()).max().unwrap_or(0);

    let secs = |s: f64, what: &str| {
        Duration::try_from_secs_f64(s).map_err(|_| format!("{what}: {s} is not a duration"))
    };
    let quota = args.count.map(|n| {
        let c = args.connections as u64;
        (0..c).map(|i| n / c + u64::from(i < n % c)).collect()
    });
    let duration = match (args.duration, args.count) {
        (Some(d), _) => Some(secs(d, "--duration")?),
        (None, None) => Some(Duration::from_secs(10)),
        (None, Some(_)) => None,
    };
    Ok(Plan {
        transport,
        addr,
        path,
        target: args
            .tcp
            .clone()
            .or_else(|| args.http.clone())
            .or_else(|| args.ws.clone())
            .unwrap_or_default(),
        templates,
        per,
        depth: args.depth,
        verify: !args.no_verify,
        echo_value: serde_json::from_str(ECHO_PARAMS).map_err(|e| e.to_string())?,
        timeout: secs(args.timeout, "--timeout")?,
        quota,
        warmup: secs(args.warmup, "--warmup")?,
        duration,
        max_message,
    })
}

// ---------------------------------------------------------------------------------------
// Responses.

/// One JSON-RPC response, borrowed from the frame. A member that is present (even as
/// `null`) is `Some`.
#[derive(Deserialize)]
struct Resp<'a> {
    #[serde(borrow, default)]
    jsonrpc: Option<&'a str>,
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    result: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    error: Option<&'a RawValue>,
}

fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// Walks a batch answer element by element, without collecting it.
struct Elements<'f, F>(&'f mut F);

impl<'de, F: FnMut(Resp<'de>)> Visitor<'de> for Elements<'_, F> {
    type Value = usize;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of JSON-RPC responses")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<usize, A::Error> {
        let mut n = 0;
        while let Some(r) = seq.next_element::<Resp<'de>>()? {
            (self.0)(r);
            n += 1;
        }
        Ok(n)
    }
}

/// Calls `f` on each response in `frame` (one object or a batch array); returns how many,
/// or the parse error.
fn each_response<'de>(frame: &'de [u8], mut f: impl FnMut(Resp<'de>)) -> Result<usize, String> {
    let first = frame
        .iter()
        .copied()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
    let mut de = serde_json::Deserializer::from_slice(frame);
    let r = match first {
        Some(b'[') => de.deserialize_seq(Elements(&mut f)),
        Some(b'{') => Resp::deserialize(&mut de).map(|r| {
            f(r);
            1
        }),
        _ => return Err("not a JSON object or array".into()),
    };
    r.and_then(|n| de.end().map(|()| n))
        .map_err(|e| e.to_string())
}

/// Whether `result` is what the call should have answered.
fn result_ok(expect: Expect, result: &RawValue, plan: &Plan) -> bool {
    let text = result.get();
    match expect {
        Expect::Int(v) => serde_json::from_str::<i64>(text).is_ok_and(|r| r == v),
        Expect::Pong => str_is(text, "pong"),
        Expect::GetData => serde_json::from_str::<(&RawValue, i64)>(text)
            .is_ok_and(|(s, n)| n == 5 && str_is(s.get(), "hello")),
        Expect::Null => text == "null",
        Expect::Echo => {
            text.as_bytes() == ECHO_PARAMS.as_bytes()
                || serde_json::from_str::<serde_json::Value>(text)
                    .is_ok_and(|v| v == plan.echo_value)
        }
    }
}

/// Whether the JSON text `text` is the string `want`; borrowed (no allocation) unless it
/// has escapes.
fn str_is(text: &str, want: &str) -> bool {
    match serde_json::from_str::<&str>(text) {
        Ok(s) => s == want,
        Err(_) => serde_json::from_str::<String>(text).is_ok_and(|s| s == want),
    }
}

/// An id as loadgen writes them: exactly `ID_DIGITS` digits.
fn parse_id(raw: &RawValue) -> Option<u64> {
    let b = raw.get().as_bytes();
    if b.len() != ID_DIGITS || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(b.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
}

fn put_id(dst: &mut [u8], mut v: u64) {
    for d in dst[..ID_DIGITS].iter_mut().rev() {
        *d = b'0' + (v % 10) as u8;
        v /= 10;
    }
}

/// The start of an answer, on one line, for a diagnostic.
fn snippet(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(&b[..b.len().min(160)])
        .escape_debug()
        .to_string();
    if b.len() > 160 {
        s + "…"
    } else {
        s
    }
}

// ---------------------------------------------------------------------------------------
// Counters.

#[derive(Clone, Copy)]
enum Problem {
    // Errors.
    Closed,
    Io,
    Stalled,
    Unanswered,
    BadFrame,
    BadResponse,
    RpcError,
    HttpStatus,
    // Mismatches.
    UnknownId,
    WrongResult,
    Missing,
}

const PROBLEMS: [(&str, bool); 11] = [
    ("closed_by_server", false),
    ("io", false),
    ("stalled", false),
    ("unanswered", false),
    ("bad_frame", false),
    ("bad_response", false),
    ("rpc_error", false),
    ("http_status", false),
    ("unknown_id", true),
    ("wrong_result", true),
    ("missing_answer", true),
];

/// Diagnostics printed per thread before going quiet.
const MAX_REPORTS: u32 = 8;

struct Stats {
    /// Measured messages written / completely answered, and their calls answered.
    requests: u64,
    responses: u64,
    elements: u64,
    /// All messages answered, warm-up included (for the progress line).
    all_responses: u64,
    problems: [u64; PROBLEMS.len()],
    hist: Histogram<u64>,
    last_done: Option<Instant>,
    reports: u32,
    thread: usize,
}

impl Stats {
    fn new(thread: usize) -> Stats {
        Stats {
            requests: 0,
            responses: 0,
            elements: 0,
            all_responses: 0,
            problems: [0; PROBLEMS.len()],
            // 1 ns to 100 s, 3 significant digits; allocated once.
            hist: Histogram::new_with_bounds(1, 100_000_000_000, 3)
                .unwrap_or_else(|_| Histogram::new(3).expect("a 3-digit histogram")),
            last_done: None,
            reports: 0,
            thread,
        }
    }

    fn problem(&mut self, p: Problem, n: u64, conn: usize, what: fmt::Arguments<'_>) {
        if n == 0 {
            return;
        }
        self.problems[p as usize] += n;
        if self.reports < MAX_REPORTS {
            eprintln!(
                "loadgen: connection {conn}: {}: {what}",
                PROBLEMS[p as usize].0
            );
        } else if self.reports == MAX_REPORTS {
            eprintln!(
                "loadgen: thread {}: further problems are counted, not printed",
                self.thread
            );
        }
        self.reports = self.reports.saturating_add(1);
    }

    fn errors(&self) -> u64 {
        PROBLEMS
            .iter()
            .zip(&self.problems)
            .filter(|(p, _)| !p.1)
            .map(|(_, n)| n)
            .sum()
    }

    fn mismatches(&self) -> u64 {
        PROBLEMS
            .iter()
            .zip(&self.problems)
            .filter(|(p, _)| p.1)
            .map(|(_, n)| n)
            .sum()
    }

    fn merge(&mut self, o: &Stats) {
        self.requests += o.requests;
        self.responses += o.responses;
        self.elements += o.elements;
        self.all_responses += o.all_responses;
        for (a, b) in self.problems.iter_mut().zip(&o.problems) {
            *a += b;
        }
        let _ = self.hist.add(&o.hist);
        self.last_done = self.last_done.max(o.last_done);
    }
}

// ---------------------------------------------------------------------------------------
// Connections.

#[derive(Clone, Copy)]
struct MsgSlot {
    template: u32,
    gen: u64,
    sent: Instant,
    remaining: u32,
    measured: bool,
}

/// Messages and calls in flight on one connection. Message slot `m` owns call slots
/// `m * per .. (m + 1) * per`; a call's id is `ID_BASE + gen * calls + slot`, so an id
/// leads straight to its slot and a slot's reuse gets new ids.
struct Track {
    msgs: Vec<MsgSlot>,
    /// The id of each call slot in flight; 0 when free.
    calls: Vec<u64>,
    free: Vec<u32>,
    /// Messages in the order written (HTTP, and TCP without verification: answers come
    /// in order).
    fifo: VecDeque<u32>,
    in_flight: usize,
    /// The fast path's (id, offset of its digits) per answer of one frame.
    seen: Vec<(u64, usize)>,
}

impl Track {
    fn new(depth: usize, per: usize, now: Instant) -> Track {
        Track {
            msgs: vec![
                MsgSlot {
                    template: 0,
                    gen: 0,
                    sent: now,
                    remaining: 0,
                    measured: false,
                };
                depth
            ],
            calls: vec![0; depth * per],
            free: (0..depth as u32).rev().collect(),
            fifo: VecDeque::with_capacity(depth),
            in_flight: 0,
            seen: Vec::with_capacity(per),
        }
    }

    /// The call slot of `id` if it is in flight.
    fn slot_of(&self, id: u64) -> Option<usize> {
        let n = id.checked_sub(ID_BASE)?;
        let slot = (n % self.calls.len() as u64) as usize;
        (self.calls[slot] == id).then_some(slot)
    }

    /// Frees message `m`, counting it if it was measured.
    fn complete(&mut self, m: usize, now: Instant, plan: &Plan, stats: &mut Stats) {
        let s = self.msgs[m];
        stats.all_responses += 1;
        if s.measured {
            stats.responses += 1;
            stats.elements += plan.templates[s.template as usize].calls.len() as u64;
            let ns = now.saturating_duration_since(s.sent).as_nanos();
            stats
                .hist
                .saturating_record(u64::try_from(ns).unwrap_or(u64::MAX).max(1));
            stats.last_done = Some(now);
        }
        self.free.push(m as u32);
        self.in_flight -= 1;
    }

    /// Marks every call of message `m` answered; returns how many were still open.
    fn close_calls(&mut self, m: usize, per: usize) -> u64 {
        let mut open = 0;
        for c in &mut self.calls[m * per..(m + 1) * per] {
            if *c != 0 {
                open += 1;
                *c = 0;
            }
        }
        self.msgs[m].remaining = 0;
        open
    }
}

struct Conn {
    index: usize,
    stream: TcpStream,
    out: Vec<u8>,
    wpos: usize,
    inbuf: Vec<u8>,
    /// Unconsumed input is `inbuf[rstart..rlen]`; `scan` is where the newline search
    /// resumes (TCP).
    rstart: usize,
    rlen: usize,
    scan: usize,
    track: Track,
    next_template: usize,
    quota: u64,
    last_rx: Instant,
    dead: bool,
}

/// What the steady state needs from the run, per thread.
struct Clock {
    measure_from: Instant,
    end: Option<Instant>,
}

impl Conn {
    fn may_send(&self, now: Instant, clock: &Clock) -> bool {
        !self.dead
            && match clock.end {
                Some(end) => now < end,
                None => now < clock.measure_from || self.quota > 0,
            }
    }

    fn finished(&self, now: Instant, clock: &Clock) -> bool {
        self.dead || (self.track.in_flight == 0 && !self.may_send(now, clock))
    }

    /// Tops the connection up to `depth` messages in flight and writes.
    fn fill(&mut self, plan: &Plan, clock: &Clock, stats: &mut Stats) {
        if self.dead || self.track.in_flight == plan.depth {
            return;
        }
        let now = Instant::now();
        if self.wpos > 0 && self.wpos < self.out.len() {
            self.out.drain(..self.wpos);
            self.wpos = 0;
        }
        let per = plan.per;
        let calls = self.track.calls.len() as u64;
        while self.track.in_flight < plan.depth && self.may_send(now, clock) {
            let Some(m) = self.track.free.pop() else {
                break;
            };
            let m = m as usize;
            let t = self.next_template;
            self.next_template = (t + 1) % plan.templates.len();
            let template = &plan.templates[t];
            let measured = now >= clock.measure_from;
            if measured {
                if clock.end.is_none() {
                    self.quota -= 1;
                }
                stats.requests += 1;
            }
            let slot = &mut self.track.msgs[m];
            slot.gen += 1;
            if ID_BASE + (slot.gen + 1) * calls >= ID_END {
                slot.gen = 0;
            }
            let start = self.out.len();
            self.out.extend_from_slice(&template.bytes);
            for (j, call) in template.calls.iter().enumerate() {
                let id = ID_BASE + slot.gen * calls + (m * per + j) as u64;
                put_id(&mut self.out[start + call.at..], id);
                self.track.calls[m * per + j] = id;
            }
            *slot = MsgSlot {
                template: t as u32,
                gen: slot.gen,
                sent: now,
                remaining: template.calls.len() as u32,
                measured,
            };
            if self.track.in_flight == 0 {
                self.last_rx = now;
            }
            self.track.in_flight += 1;
            if plan.transport == Transport::Http || !plan.verify {
                self.track.fifo.push_back(m as u32);
            }
        }
        self.flush(stats);
    }

    fn flush(&mut self, stats: &mut Stats) {
        while self.wpos < self.out.len() {
            match self.stream.write(&self.out[self.wpos..]) {
                Ok(0) => {
                    self.fail(Problem::Io, stats, format_args!("write returned 0"));
                    return;
                }
                Ok(n) => self.wpos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.fail(Problem::Io, stats, format_args!("write: {e}"));
                    return;
                }
            }
        }
        self.out.clear();
        self.wpos = 0;
    }

    /// Gives the connection up: one `p`, plus every call still in flight as unanswered.
    fn fail(&mut self, p: Problem, stats: &mut Stats, what: fmt::Arguments<'_>) {
        if self.dead {
            return;
        }
        self.dead = true;
        stats.problem(p, 1, self.index, what);
        let open = self.track.calls.iter().filter(|&&c| c != 0).count() as u64;
        stats.problem(
            Problem::Unanswered,
            open,
            self.index,
            format_args!("{open} calls in flight when the connection was given up"),
        );
        self.track.calls.iter_mut().for_each(|c| *c = 0);
        self.track.in_flight = 0;
        self.track.fifo.clear();
    }

    /// Reads until `WouldBlock`, handling every complete answer.
    fn read(&mut self, plan: &Plan, clock: &Clock, stats: &mut Stats) {
        while !self.dead {
            if self.rlen == self.inbuf.len() {
                if self.rstart > 0 {
                    self.inbuf.copy_within(self.rstart..self.rlen, 0);
                    self.rlen -= self.rstart;
                    self.scan -= self.rstart;
                    self.rstart = 0;
                } else {
                    // One answer larger than the buffer.
                    self.inbuf.resize(self.inbuf.len() * 2, 0);
                }
            }
            match self.stream.read(&mut self.inbuf[self.rlen..]) {
                Ok(0) => {
                    let now = Instant::now();
                    if self.track.in_flight > 0 || self.may_send(now, clock) {
                        self.fail(
                            Problem::Closed,
                            stats,
                            format_args!("the server closed the connection"),
                        );
                    }
                    self.dead = true;
                    return;
                }
                Ok(n) => {
                    let now = Instant::now();
                    self.rlen += n;
                    self.last_rx = now;
                    match plan.transport {
                        Transport::Tcp => self.tcp_frames(now, plan, stats),
                        Transport::Http => self.http_frames(now, plan, stats),
                        Transport::Ws => self.ws_frames(now, plan, stats),
                    }
                    if self.rstart == self.rlen {
                        self.rstart = 0;
                        self.rlen = 0;
                        self.scan = 0;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.fail(Problem::Io, stats, format_args!("read: {e}"));
                    return;
                }
            }
        }
    }

    fn tcp_frames(&mut self, now: Instant, plan: &Plan, stats: &mut Stats) {
        while let Some(p) = memchr::memchr(b'\n', &self.inbuf[self.scan..self.rlen]) {
            let end = self.scan + p;
            let line = &self.inbuf[self.rstart..end];
            self.rstart = end + 1;
            self.scan = end + 1;
            if line.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r')) {
                continue;
            }
            if plan.verify {
                verify_frame(&mut self.track, self.index, line, None, now, plan, stats);
            } else {
                match self.track.fifo.pop_front() {
                    Some(m) => {
                        let m = m as usize;
                        self.track.close_calls(m, plan.per);
                        self.track.complete(m, now, plan, stats);
                    }
                    None => {
                        self.fail(
                            Problem::BadFrame,
                            stats,
                            format_args!("an answer with nothing in flight"),
                        );
                        return;
                    }
                }
            }
            if self.dead {
                return;
            }
        }
        self.scan = self.rlen;
    }

    fn ws_frames(&mut self, now: Instant, plan: &Plan, stats: &mut Stats) {
        while self.rstart < self.rlen && !self.dead {
            let data = &self.inbuf[self.rstart..self.rlen];
            let Some((opcode, at, len)) = ws_frame(data) else {
                return;
            };
            if at + len > data.len() {
                if at + len > self.inbuf.len() {
                    self.inbuf.resize((at + len).next_power_of_two(), 0);
                }
                return;
            }
            if opcode != 1 && opcode != 2 {
                let s = snippet(&data[at..at + len]);
                self.fail(
                    Problem::BadFrame,
                    stats,
                    format_args!("a WebSocket frame of opcode {opcode} (not a message): {s}"),
                );
                return;
            }
            let payload = &self.inbuf[self.rstart + at..self.rstart + at + len];
            self.rstart += at + len;
            if plan.verify {
                verify_frame(&mut self.track, self.index, payload, None, now, plan, stats);
            } else if let Some(m) = self.track.fifo.pop_front() {
                let m = m as usize;
                self.track.close_calls(m, plan.per);
                self.track.complete(m, now, plan, stats);
            } else {
                self.fail(
                    Problem::BadFrame,
                    stats,
                    format_args!("an answer with nothing in flight"),
                );
                return;
            }
        }
    }

    fn http_frames(&mut self, now: Instant, plan: &Plan, stats: &mut Stats) {
        while self.rstart < self.rlen && !self.dead {
            let data = &self.inbuf[self.rstart..self.rlen];
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut resp = httparse::Response::new(&mut headers);
            let head = match resp.parse(data) {
                Ok(httparse::Status::Complete(n)) => n,
                Ok(httparse::Status::Partial) => return,
                Err(e) => {
                    let s = snippet(data);
                    self.fail(
                        Problem::BadFrame,
                        stats,
                        format_args!("bad HTTP response ({e}): {s}"),
                    );
                    return;
                }
            };
            let status = resp.code.unwrap_or(0);
            let mut length = None;
            let mut chunked = false;
            for h in resp.headers.iter() {
                if h.name.eq_ignore_ascii_case("content-length") {
                    length = std::str::from_utf8(h.value)
                        .ok()
                        .and_then(|v| v.trim().parse::<usize>().ok());
                    if length.is_none() {
                        chunked = true;
                    }
                } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                    chunked = true;
                }
            }
            if (100..200).contains(&status) {
                // An interim response (100 Continue): no body, the real one follows.
                self.rstart += head;
                continue;
            }
            let length = match (length, chunked) {
                (Some(n), false) => n,
                (None, false) if status == 204 || status == 304 => 0,
                _ => {
                    self.fail(
                        Problem::BadFrame,
                        stats,
                        format_args!(
                            "HTTP {status} without a usable Content-Length (chunked bodies are not supported)"
                        ),
                    );
                    return;
                }
            };
            if data.len() < head + length {
                if head + length > self.inbuf.len() {
                    self.inbuf.resize((head + length).next_power_of_two(), 0);
                }
                return;
            }
            let body = &data[head..head + length];
            let Some(m) = self.track.fifo.pop_front() else {
                let s = snippet(data);
                self.fail(
                    Problem::BadFrame,
                    stats,
                    format_args!("an HTTP response with nothing in flight: {s}"),
                );
                return;
            };
            let m = m as usize;
            if status != 200 {
                // 204 would be right only for a message of notifications, never sent here.
                let s = snippet(body);
                stats.problem(
                    Problem::HttpStatus,
                    1,
                    self.index,
                    format_args!("HTTP {status}: {s}"),
                );
            } else if plan.verify {
                verify_frame(&mut self.track, self.index, body, Some(m), now, plan, stats);
                let missing = self.track.close_calls(m, plan.per);
                stats.problem(
                    Problem::Missing,
                    missing,
                    self.index,
                    format_args!("{missing} calls of the message were not answered"),
                );
            }
            self.track.close_calls(m, plan.per);
            self.track.complete(m, now, plan, stats);
            self.rstart += head + length;
        }
    }
}

/// How one answer was found to be.
enum Answer<'a> {
    /// The fast path matched the expected result.
    Checked,
    Result(&'a RawValue),
    Error(&'a RawValue),
}

/// The fast path's shape of an answer: `{"jsonrpc":"2.0","id":ID,"result":RESULT}`, as
/// compact encoders write it (jsonrpsee, ringrpc, serde_json).
const FAST_HEAD: &[u8] = br#"{"jsonrpc":"2.0","id":"#;
const FAST_MID: &[u8] = br#","result":"#;

/// The fast path: when `frame` is exactly one answer, or a batch of them, of the shape
/// above, each with an id in flight and the expected result in its compact spelling,
/// records the ids (and where their digits are) in `seen` and returns `true`. Anything
/// else (whitespace, another member order, an error, a wrong result) returns `false` and
/// leaves the frame to serde_json. Reads the state only.
fn fast_answers(frame: &[u8], track: &Track, plan: &Plan, seen: &mut Vec<(u64, usize)>) -> bool {
    seen.clear();
    let batch = frame.first() == Some(&b'[');
    let mut p = usize::from(batch);
    loop {
        let Some(rest) = frame.get(p..) else {
            return false;
        };
        if !rest.starts_with(FAST_HEAD) {
            return false;
        }
        let at = p + FAST_HEAD.len();
        let Some(digits) = frame.get(at..at + ID_DIGITS) else {
            return false;
        };
        if !digits.iter().all(u8::is_ascii_digit) {
            return false;
        }
        let id = digits
            .iter()
            .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
        let Some(slot) = track.slot_of(id) else {
            return false;
        };
        let template = track.msgs[slot / plan.per].template as usize;
        let canon = &plan.templates[template].calls[slot % plan.per].canon;
        let q = at + ID_DIGITS;
        let Some(rest) = frame.get(q..) else {
            return false;
        };
        if !(rest.starts_with(FAST_MID)
            && rest[FAST_MID.len()..].starts_with(canon)
            && rest.get(FAST_MID.len() + canon.len()) == Some(&b'}'))
        {
            return false;
        }
        if seen.len() == seen.capacity() {
            return false;
        }
        seen.push((id, at));
        p = q + FAST_MID.len() + canon.len() + 1;
        match (batch, frame.get(p)) {
            (false, None) => return true,
            (true, Some(b',')) => p += 1,
            (true, Some(b']')) => return p + 1 == frame.len(),
            _ => return false,
        }
    }
}

/// Checks one answer frame (a response or a batch of them). With `only` (HTTP), every
/// id must belong to that message, which the caller completes; otherwise (TCP) a message
/// is completed here when its last call is answered.
fn verify_frame(
    track: &mut Track,
    conn: usize,
    frame: &[u8],
    only: Option<usize>,
    now: Instant,
    plan: &Plan,
    stats: &mut Stats,
) {
    let mut seen = std::mem::take(&mut track.seen);
    let fast = fast_answers(frame, track, plan, &mut seen);
    if fast {
        for &(id, at) in &seen {
            let text = std::str::from_utf8(&frame[at..at + ID_DIGITS]).unwrap_or("?");
            answer(
                track,
                conn,
                Some(id),
                text,
                Answer::Checked,
                only,
                now,
                plan,
                stats,
            );
        }
    }
    track.seen = seen;
    if fast {
        return;
    }
    let parsed = each_response(frame, |r| {
        if r.jsonrpc != Some("2.0") || r.id.is_none() || r.result.is_some() == r.error.is_some() {
            let s = snippet(frame);
            stats.problem(
                Problem::BadResponse,
                1,
                conn,
                format_args!("not a JSON-RPC 2.0 response: {s}"),
            );
            return;
        }
        let ans = match (r.result, r.error) {
            (Some(result), _) => Answer::Result(result),
            (None, Some(e)) => Answer::Error(e),
            (None, None) => return,
        };
        let id = r.id.and_then(parse_id);
        let text = r.id.map(RawValue::get).unwrap_or("");
        answer(track, conn, id, text, ans, only, now, plan, stats);
    });
    match parsed {
        Ok(0) => {
            let s = snippet(frame);
            stats.problem(
                Problem::BadResponse,
                1,
                conn,
                format_args!("an empty batch answer: {s}"),
            );
        }
        Ok(_) => {}
        Err(e) => {
            let s = snippet(frame);
            stats.problem(
                Problem::BadFrame,
                1,
                conn,
                format_args!("unparsable answer ({e}): {s}"),
            );
        }
    }
}

/// Takes one answer (id `id`, spelled `text`) off the calls in flight and checks it.
#[allow(clippy::too_many_arguments)]
fn answer(
    track: &mut Track,
    conn: usize,
    id: Option<u64>,
    text: &str,
    ans: Answer<'_>,
    only: Option<usize>,
    now: Instant,
    plan: &Plan,
    stats: &mut Stats,
) {
    let per = plan.per;
    let Some(slot) = id.and_then(|id| track.slot_of(id)) else {
        let hint = if text == "1" {
            " (a server with a fixed answer needs --no-verify)"
        } else {
            ""
        };
        stats.problem(
            Problem::UnknownId,
            1,
            conn,
            format_args!("id {text} is not in flight (unknown or answered twice){hint}"),
        );
        if let Answer::Error(e) = ans {
            stats.problem(Problem::RpcError, 1, conn, format_args!("{}", e.get()));
        }
        return;
    };
    let m = slot / per;
    if only.is_some_and(|o| o != m) {
        stats.problem(
            Problem::UnknownId,
            1,
            conn,
            format_args!("id {text} belongs to another message in flight"),
        );
        return;
    }
    track.calls[slot] = 0;
    let template = track.msgs[m].template as usize;
    match ans {
        Answer::Checked => {}
        Answer::Error(e) => stats.problem(
            Problem::RpcError,
            1,
            conn,
            format_args!("id {text}: {}", e.get()),
        ),
        Answer::Result(result) => {
            let expect = plan.templates[template].calls[slot % per].expect;
            if !result_ok(expect, result, plan) {
                stats.problem(
                    Problem::WrongResult,
                    1,
                    conn,
                    format_args!("id {text}: result {} (expected {expect:?})", result.get()),
                );
            }
        }
    }
    track.msgs[m].remaining -= 1;
    if only.is_none() && track.msgs[m].remaining == 0 {
        track.complete(m, now, plan, stats);
    }
}

// ---------------------------------------------------------------------------------------
// Threads.

/// What a worker publishes for the progress line.
#[derive(Default)]
struct Progress {
    responses: AtomicU64,
    problems: AtomicU64,
    done: AtomicBool,
}

static START: OnceLock<Instant> = OnceLock::new();

/// The JSON summary, in this order.
#[derive(Serialize)]
struct Summary<'a> {
    transport: &'static str,
    connections: usize,
    depth: usize,
    batch: usize,
    threads: usize,
    duration_s: f64,
    /// Measured messages written and completely answered (a batch is one).
    requests: u64,
    responses: u64,
    errors: u64,
    mismatches: u64,
    /// Answered messages per second.
    rps: f64,
    /// Answered calls per second (= rps without batches).
    elements_per_s: f64,
    latency_us: Latency,
    target: &'a str,
    mix: &'a str,
    verify: bool,
    warmup_s: f64,
    elements: u64,
    /// Errors and mismatches by kind.
    problems: std::collections::BTreeMap<&'static str, u64>,
}

#[derive(Serialize)]
struct Latency {
    p50: f64,
    p90: f64,
    p99: f64,
    p999: f64,
    max: f64,
    mean: f64,
}

fn connect(plan: &Plan) -> io::Result<TcpStream> {
    let mut s = std::net::TcpStream::connect_timeout(&plan.addr, Duration::from_secs(5))?;
    s.set_nodelay(true)?;
    if plan.transport == Transport::Ws {
        ws_handshake(&mut s, plan)?;
    }
    s.set_nonblocking(true)?;
    Ok(TcpStream::from_std(s))
}

/// A client text frame's header for `len` payload bytes, masked with an all-zero key
/// (the payload that follows is then its own masked form).
fn ws_header(len: usize) -> Vec<u8> {
    let mut h = vec![0x81];
    if len < 126 {
        h.push(0x80 | len as u8);
    } else if let Ok(n) = u16::try_from(len) {
        h.push(0x80 | 126);
        h.extend_from_slice(&n.to_be_bytes());
    } else {
        h.push(0x80 | 127);
        h.extend_from_slice(&(len as u64).to_be_bytes());
    }
    h.extend_from_slice(&[0; 4]);
    h
}

/// The server frame at the front of `b`: (opcode, payload offset, payload length), once
/// its header is whole.
fn ws_frame(b: &[u8]) -> Option<(u8, usize, usize)> {
    let (b0, b1) = (*b.first()?, *b.get(1)?);
    let (len, at) = match b1 & 0x7f {
        126 => (usize::from(u16::from_be_bytes([*b.get(2)?, *b.get(3)?])), 4),
        127 => (
            usize::try_from(u64::from_be_bytes(b.get(2..10)?.try_into().ok()?)).ok()?,
            10,
        ),
        n => (usize::from(n), 2),
    };
    Some((b0 & 0x0f, at, len))
}

/// The opening handshake (blocking, before the connection joins the poll).
fn ws_handshake(s: &mut std::net::TcpStream, plan: &Plan) -> io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        plan.path, plan.addr
    );
    s.write_all(request.as_bytes())?;
    // Byte by byte up to the head's end: nothing of the frames after it is taken.
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b)? == 0 || head.len() > 8192 {
            return Err(io::Error::other("no WebSocket handshake answer"));
        }
        head.push(b[0]);
    }
    if !head.starts_with(b"HTTP/1.1 101") {
        let first = String::from_utf8_lossy(&head);
        let first = first.lines().next().unwrap_or_default();
        return Err(io::Error::other(format!(
            "WebSocket handshake refused: {first}"
        )));
    }
    s.set_read_timeout(None)
}

fn worker(
    thread: usize,
    threads: usize,
    plan: Arc<Plan>,
    connections: usize,
    barrier: Arc<Barrier>,
    abort: Arc<AtomicBool>,
    progress: Arc<Progress>,
) -> Stats {
    let mut stats = Stats::new(thread);
    let setup = (|| -> io::Result<(Poll, Vec<Conn>)> {
        let poll = Poll::new()?;
        let now = Instant::now();
        let mut conns = Vec::new();
        for index in (thread..connections).step_by(threads) {
            let mut stream = connect(&plan)
                .map_err(|e| io::Error::new(e.kind(), format!("connect to {}: {e}", plan.addr)))?;
            poll.registry().register(
                &mut stream,
                Token(conns.len()),
                Interest::READABLE | Interest::WRITABLE,
            )?;
            conns.push(Conn {
                index,
                stream,
                out: Vec::with_capacity(plan.depth * plan.max_message + 4096),
                wpos: 0,
                inbuf: vec![0; 256 * 1024],
                rstart: 0,
                rlen: 0,
                scan: 0,
                track: Track::new(plan.depth, plan.per, now),
                next_template: index % plan.templates.len(),
                quota: plan.quota.as_ref().map_or(0, |q| q[index]),
                last_rx: now,
                dead: false,
            });
        }
        Ok((poll, conns))
    })();
    let (mut poll, mut conns) = match setup {
        Ok(x) => x,
        Err(e) => {
            eprintln!("loadgen: {e}");
            abort.store(true, Ordering::SeqCst);
            barrier.wait();
            progress.done.store(true, Ordering::SeqCst);
            return stats;
        }
    };
    barrier.wait();
    if abort.load(Ordering::SeqCst) {
        progress.done.store(true, Ordering::SeqCst);
        return stats;
    }
    let start = *START.get_or_init(Instant::now);
    let measure_from = start + plan.warmup;
    let clock = Clock {
        measure_from,
        end: plan.duration.map(|d| measure_from + d),
    };
    let mut events = Events::with_capacity(1024);
    for c in &mut conns {
        c.fill(&plan, &clock, &mut stats);
    }
    let mut last_check = start;
    loop {
        if let Err(e) = poll.poll(&mut events, Some(Duration::from_millis(20))) {
            if e.kind() != io::ErrorKind::Interrupted {
                eprintln!("loadgen: poll: {e}");
                stats.problem(Problem::Io, 1, usize::MAX, format_args!("poll: {e}"));
                break;
            }
        }
        for ev in events.iter() {
            let Some(c) = conns.get_mut(ev.token().0) else {
                continue;
            };
            if c.dead {
                continue;
            }
            if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                c.read(&plan, &clock, &mut stats);
            }
            if ev.is_writable() {
                c.flush(&mut stats);
            }
            c.fill(&plan, &clock, &mut stats);
        }
        let now = Instant::now();
        if now.duration_since(last_check) >= Duration::from_millis(20) {
            last_check = now;
            let mut all_done = true;
            for c in &mut conns {
                if !c.dead && c.track.in_flight > 0 && now.duration_since(c.last_rx) > plan.timeout
                {
                    let t = plan.timeout.as_secs_f64();
                    c.fail(
                        Problem::Stalled,
                        &mut stats,
                        format_args!("nothing received for {t} s with requests in flight"),
                    );
                }
                // A connection idle at the start of the measured window (after warm-up
                // in count mode) gets no event: top it up here.
                if !c.dead && c.track.in_flight == 0 {
                    c.fill(&plan, &clock, &mut stats);
                }
                all_done &= c.finished(now, &clock);
            }
            progress
                .responses
                .store(stats.all_responses, Ordering::Relaxed);
            progress
                .problems
                .store(stats.errors() + stats.mismatches(), Ordering::Relaxed);
            if all_done {
                break;
            }
        }
    }
    progress
        .responses
        .store(stats.all_responses, Ordering::Relaxed);
    progress
        .problems
        .store(stats.errors() + stats.mismatches(), Ordering::Relaxed);
    progress.done.store(true, Ordering::SeqCst);
    stats
}

/// The subscriber mode's summary.
#[derive(Serialize)]
struct Subscribed<'a> {
    transport: &'static str,
    connections: usize,
    interval_ms: f64,
    duration_s: f64,
    /// Connections whose subscribe call was answered with a result.
    subscribed: usize,
    /// `tick` notifications read during the measured time.
    notifications: u64,
    notifications_per_s: f64,
    /// Ticks a server said it dropped (`lagged` notifications), measured time.
    dropped: u64,
    /// Error answers and broken connections.
    errors: u64,
    target: &'a str,
}

/// Subscriber mode: connects, subscribes each connection to `subscribe_ticks [ms]`, and
/// counts what arrives (one thread, one poll).
fn subscribers(args: &Args, plan: &Plan, ms: f64) -> ExitCode {
    let run = || -> io::Result<Subscribed<'_>> {
        let mut poll = Poll::new()?;
        let mut conns = Vec::new();
        let message = |i: usize| {
            let interval = if args.ticks_distinct {
                // A distinct text, the same interval (1e-12 ms apart at most 1e-9).
                format!("{:.12}", ms + i as f64 * 1e-12)
            } else {
                format!("{ms}")
            };
            let request = format!(
                r#"{{"jsonrpc":"2.0","method":"subscribe_ticks","params":[{interval}],"id":1}}"#
            );
            let mut message = match plan.transport {
                Transport::Ws => ws_header(request.len()),
                _ => Vec::new(),
            };
            message.extend_from_slice(request.as_bytes());
            if plan.transport == Transport::Tcp {
                message.push(b'\n');
            }
            message
        };
        for i in 0..args.connections {
            let mut s = connect(plan)?;
            poll.registry()
                .register(&mut s, Token(i), Interest::READABLE)?;
            conns.push((s, Vec::<u8>::with_capacity(64 * 1024), false));
        }
        // Every connection made first, then all subscribe at once: no subscription
        // runs up a backlog while the others connect.
        for (i, (s, _, _)) in conns.iter_mut().enumerate() {
            // A few dozen bytes into an empty socket buffer: written at once.
            s.write_all(&message(i))?;
        }
        let start = Instant::now();
        let measure_from = start + Duration::from_secs_f64(args.warmup);
        let end = measure_from + Duration::from_secs_f64(args.duration.unwrap_or(10.0));
        let (mut notifications, mut dropped, mut errors) = (0u64, 0u64, 0u64);
        let mut events = Events::with_capacity(1024);
        let mut chunk = vec![0u8; 256 * 1024];
        loop {
            let now = Instant::now();
            if now >= end {
                break;
            }
            poll.poll(&mut events, Some(end - now))?;
            let measured = Instant::now() >= measure_from;
            for ev in &events {
                let (s, buf, subscribed) = &mut conns[ev.token().0];
                loop {
                    match s.read(&mut chunk) {
                        Ok(0) => {
                            errors += 1;
                            break;
                        }
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) => {
                            errors += 1;
                            break;
                        }
                    }
                }
                let mut at = 0;
                loop {
                    let frame = match plan.transport {
                        Transport::Ws => match ws_frame(&buf[at..]) {
                            Some((_, head, len)) if at + head + len <= buf.len() => {
                                let f = at + head..at + head + len;
                                at += head + len;
                                f
                            }
                            _ => break,
                        },
                        _ => match memchr::memchr(b'\n', &buf[at..]) {
                            Some(nl) => {
                                let f = at..at + nl;
                                at += nl + 1;
                                f
                            }
                            None => break,
                        },
                    };
                    let f = &buf[frame];
                    if memchr::memmem::find(f, br#""method":"tick""#).is_some() {
                        if let Some(i) = memchr::memmem::find(f, br#""lagged":"#) {
                            let digits = &f[i + 9..];
                            let n = digits.iter().take_while(|b| b.is_ascii_digit()).count();
                            let lost: u64 = std::str::from_utf8(&digits[..n])
                                .ok()
                                .and_then(|d| d.parse().ok())
                                .unwrap_or(0);
                            if measured {
                                dropped += lost;
                            }
                        } else if measured {
                            notifications += 1;
                        }
                    } else if memchr::memmem::find(f, br#""result""#).is_some() {
                        *subscribed = true;
                    } else {
                        errors += 1;
                    }
                }
                buf.drain(..at);
            }
        }
        let secs = end.saturating_duration_since(measure_from).as_secs_f64();
        Ok(Subscribed {
            transport: if plan.transport == Transport::Ws {
                "ws"
            } else {
                "tcp"
            },
            connections: args.connections,
            interval_ms: ms,
            duration_s: secs,
            subscribed: conns.iter().filter(|c| c.2).count(),
            notifications,
            notifications_per_s: notifications as f64 / secs.max(f64::MIN_POSITIVE),
            dropped,
            errors,
            target: &plan.target,
        })
    };
    match run() {
        Ok(summary) => {
            println!("{}", serde_json::to_string(&summary).unwrap_or_default());
            if summary.errors > 0 || summary.subscribed < args.connections {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("loadgen: {e}");
            ExitCode::from(2)
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let plan = match build_plan(&args) {
        Ok(p) => Arc::new(p),
        Err(e) => {
            eprintln!("loadgen: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(ms) = args.ticks {
        if plan.transport == Transport::Http {
            eprintln!("loadgen: --ticks needs --tcp or --ws (HTTP cannot push)");
            return ExitCode::from(2);
        }
        return subscribers(&args, &plan, ms);
    }
    let threads = args.threads.min(args.connections);
    let barrier = Arc::new(Barrier::new(threads + 1));
    let abort = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    let mut progress = Vec::new();
    for t in 0..threads {
        let p = Arc::new(Progress::default());
        progress.push(p.clone());
        let (plan, barrier, abort) = (plan.clone(), barrier.clone(), abort.clone());
        let connections = args.connections;
        let h = std::thread::Builder::new()
            .name(format!("loadgen-{t}"))
            .spawn(move || worker(t, threads, plan, connections, barrier, abort, p));
        match h {
            Ok(h) => handles.push(h),
            Err(e) => {
                eprintln!("loadgen: cannot start a thread: {e}");
                return ExitCode::from(2);
            }
        }
    }
    barrier.wait();
    if abort.load(Ordering::SeqCst) {
        for h in handles {
            let _ = h.join();
        }
        return ExitCode::from(2);
    }
    let start = *START.get_or_init(Instant::now);

    // Progress, once a second, until every worker is done.
    let mut tick = 1u64;
    let mut last = 0u64;
    while !progress.iter().all(|p| p.done.load(Ordering::SeqCst)) {
        let due = start + Duration::from_secs(tick);
        let now = Instant::now();
        if now < due {
            std::thread::sleep((due - now).min(Duration::from_millis(50)));
            continue;
        }
        let total: u64 = progress
            .iter()
            .map(|p| p.responses.load(Ordering::Relaxed))
            .sum();
        let problems: u64 = progress
            .iter()
            .map(|p| p.problems.load(Ordering::Relaxed))
            .sum();
        let phase = if due <= start + plan.warmup {
            "  (warm-up)"
        } else {
            ""
        };
        eprintln!(
            "[{:>6.1}s] {:>9} req/s  errors {problems}{phase}",
            now.duration_since(start).as_secs_f64(),
            total - last
        );
        last = total;
        tick += 1;
    }

    let mut stats = Stats::new(usize::MAX);
    for h in handles {
        match h.join() {
            Ok(s) => stats.merge(&s),
            Err(_) => {
                eprintln!("loadgen: a worker thread panicked");
                return ExitCode::from(2);
            }
        }
    }
    let measure_from = start + plan.warmup;
    let duration_s = stats.last_done.map_or(0.0, |t| {
        t.saturating_duration_since(measure_from).as_secs_f64()
    });
    let per_s = |n: u64| {
        if duration_s > 0.0 {
            (n as f64 / duration_s).round()
        } else {
            0.0
        }
    };
    let us = |ns: u64| (ns as f64 / 100.0).round() / 10.0;
    let h = &stats.hist;
    let empty = h.is_empty();
    let q = |x: f64| {
        if empty {
            0.0
        } else {
            us(h.value_at_quantile(x))
        }
    };
    let problems: std::collections::BTreeMap<&str, u64> = PROBLEMS
        .iter()
        .zip(&stats.problems)
        .filter(|(_, &n)| n > 0)
        .map(|(p, &n)| (p.0, n))
        .collect();
    let summary = Summary {
        transport: match plan.transport {
            Transport::Tcp => "tcp",
            Transport::Http => "http",
            Transport::Ws => "ws",
        },
        connections: args.connections,
        depth: args.depth,
        batch: args.batch,
        threads,
        duration_s: (duration_s * 1000.0).round() / 1000.0,
        requests: stats.requests,
        responses: stats.responses,
        errors: stats.errors(),
        mismatches: stats.mismatches(),
        rps: per_s(stats.responses),
        elements_per_s: per_s(stats.elements),
        latency_us: Latency {
            p50: q(0.5),
            p90: q(0.9),
            p99: q(0.99),
            p999: q(0.999),
            max: if empty { 0.0 } else { us(h.max()) },
            mean: if empty {
                0.0
            } else {
                (h.mean() / 100.0).round() / 10.0
            },
        },
        target: &plan.target,
        mix: &args.mix,
        verify: plan.verify,
        warmup_s: plan.warmup.as_secs_f64(),
        elements: stats.elements,
        problems,
    };
    let summary = match serde_json::to_string(&summary) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("loadgen: summary: {e}");
            return ExitCode::from(2);
        }
    };
    println!("{summary}");
    if stats.errors() > 0 || stats.mismatches() > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
