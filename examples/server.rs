//! The demo server: newline-delimited JSON-RPC over TCP (and Unix sockets) and
//! JSON-RPC over HTTP/1.1, serving the demo methods.
//!
//! ```text
//! cargo run --release --example server              # tcp 127.0.0.1:7700, http 127.0.0.1:7701
//! cargo run --release --example server -- --help    # every flag
//! ```
//!
//! Prints one `listening KIND ADDR` line per listener once it accepts connections.
//! SIGINT / SIGTERM: stop accepting, answer every request already received, exit 0.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use ringrpc::access_log::{AccessLog, Format};
use ringrpc::dedup::Dedup;
use ringrpc::guard::{Guard, GuardError};
use ringrpc::{defaults, demo, server::Server, Config, ServerConfig};

/// Serve the ringrpc demo methods (subtract, sum, update, notify_hello, notify_sum,
/// get_data, ping, echo, add, sleep, delay, whoami).
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Newline-delimited JSON-RPC over TCP on ADDR ("off" to disable).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7700")]
    tcp: String,
    /// JSON-RPC over HTTP/1.1 on ADDR, and over WebSocket on the same path ("off" to
    /// disable).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7701")]
    http: String,
    /// Newline-delimited JSON-RPC on a Unix domain socket at PATH.
    #[arg(long, value_name = "PATH")]
    unix: Option<PathBuf>,
    /// Serve stdin/stdout instead (newline-delimited, MCP style); no sockets.
    #[arg(long)]
    stdio: bool,
    /// Event-loop threads (SO_REUSEPORT listeners; default 1).
    #[arg(long, value_name = "N", default_value_t = 1)]
    reactors: usize,
    /// Worker threads for blocking methods (default: number of cores).
    #[arg(long, value_name = "N")]
    workers: Option<usize>,
    /// Largest request, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = defaults::DEFAULT_MAX_REQUEST_BYTES)]
    max_request_bytes: usize,
    /// Largest response, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = defaults::DEFAULT_MAX_RESPONSE_BYTES)]
    max_response_bytes: usize,
    /// Most elements in a batch.
    #[arg(long, value_name = "N", default_value_t = defaults::DEFAULT_MAX_BATCH_LEN)]
    max_batch_len: usize,
    /// Deepest nesting of arrays/objects.
    #[arg(long, value_name = "N", default_value_t = defaults::DEFAULT_MAX_DEPTH)]
    max_depth: usize,
    /// Most open connections.
    #[arg(long, value_name = "N", default_value_t = defaults::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// Close connections idle this long, and peers that took none of the answers owed
    /// them this long (they stopped reading), in ms (0: never).
    #[arg(long, value_name = "MS", default_value_t = defaults::DEFAULT_IDLE_TIMEOUT.as_millis() as u64)]
    idle_timeout_ms: u64,
    /// Check subscribers' connections for a live peer after this long without traffic,
    /// in ms (WebSocket ping, TCP keepalive; 0: never).
    #[arg(long, value_name = "MS", default_value_t = defaults::DEFAULT_SUBSCRIBER_PING_INTERVAL.as_millis() as u64)]
    subscriber_ping_ms: u64,
    /// Deadline of a call run on the worker pool, in ms (0: none).
    #[arg(long, value_name = "MS", default_value_t = defaults::DEFAULT_REQUEST_TIMEOUT.as_millis() as u64)]
    request_timeout_ms: u64,
    /// Longest a request may take to arrive once it has started, in ms (0: no limit).
    #[arg(long, value_name = "MS", default_value_t = defaults::DEFAULT_REQUEST_READ_TIMEOUT.as_millis() as u64)]
    request_read_timeout_ms: u64,
    /// Calls that may wait for a worker before "server busy".
    #[arg(long, value_name = "N", default_value_t = defaults::DEFAULT_QUEUE_CAPACITY)]
    queue_capacity: usize,
    /// Most elements of one batch on the worker pool at once (default: number of cores).
    #[arg(long, value_name = "N")]
    batch_concurrency: Option<usize>,
    /// Unsent output per connection before the server stops reading from it, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = defaults::DEFAULT_WRITE_HIGH_WATER)]
    write_high_water: usize,
    /// HTTP path served.
    #[arg(long, value_name = "PATH", default_value = "/")]
    http_path: String,
    /// Let browser pages from ORIGIN call the HTTP transport (CORS): answer preflights,
    /// add Access-Control-Allow-Origin. Repeatable; "*" allows any origin.
    #[arg(long, value_name = "ORIGIN")]
    cors_origin: Vec<String>,
    /// Require callers to authenticate with the keys of this TOML file (HTTP:
    /// `Authorization: Bearer TOKEN`; TCP/Unix/stdio: `rpc.auth` first); reloaded on
    /// SIGHUP. See docs/OPERATIONS.md.
    #[arg(long, value_name = "PATH")]
    auth_file: Option<PathBuf>,
    /// Also accept HS256 JSON Web Tokens signed with the 32-byte hex secret in FILE.
    #[arg(long, value_name = "FILE")]
    jwt_secret: Option<PathBuf>,
    /// Limit anonymous callers per peer address to RATE calls/s (burst BURST), each
    /// batch element counted.
    #[arg(long, value_name = "RATE[:BURST]")]
    rate_limit: Option<String>,
    /// Limit failed authentications per peer address to RATE a second with BURST at
    /// once (say 1:10); past it, tokens from that address are refused unread (-32005,
    /// HTTP 429) until the bucket refills. Only where clients connect directly: behind
    /// a load balancer every client shares its address. See docs/OPERATIONS.md.
    #[arg(long, value_name = "RATE[:BURST]|off", default_value = "off")]
    auth_fail_limit: String,
    /// De-duplicate retried calls of methods marked for it (the demo's `incr`):
    /// "memory", or "redis://HOST:PORT[/DB]" shared by several instances.
    #[arg(long, value_name = "STORE")]
    dedup: Option<String>,
    /// How long a de-duplicated call's answer is kept, in ms.
    #[arg(long, value_name = "MS", default_value_t = ringrpc::dedup::DEFAULT_TTL.as_millis() as u64)]
    dedup_ttl_ms: u64,
    /// The memory store's size in bytes: 96 an entry, plus a buffer for an answer
    /// longer than 30 bytes (oldest evicted first).
    #[arg(long, value_name = "BYTES", default_value_t = ringrpc::dedup::DEFAULT_MAX_BYTES)]
    dedup_max_bytes: usize,
    /// When Redis cannot be reached: "closed" answers -32000, "open" runs the call
    /// without de-duplication.
    #[arg(long, value_name = "open|closed", default_value = "closed", value_parser = ["open", "closed"])]
    dedup_fail: String,
    /// Count nothing: no metrics (they are on by default, served at GET /metrics on the
    /// HTTP listener).
    #[arg(long, conflicts_with = "metrics")]
    no_metrics: bool,
    /// Also serve GET /metrics (and /health) on ADDR, an HTTP listener of its own
    /// without JSON-RPC (say, when --http is off or faces elsewhere).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// One line per call (each batch element) on stderr: time, transport, peer,
    /// identity, method, id, code, duration, bytes in/out, trace id. Written by a thread
    /// of its own; lines that do not fit its queue are dropped and counted.
    #[arg(long, value_name = "json|text|off", default_value = "off", value_parser = ["json", "text", "off"])]
    access_log: String,
    /// Trace this fraction (0 to 1) of the calls that come without a W3C `traceparent`
    /// (those with one follow the caller's sampling decision).
    #[arg(long, value_name = "RATE", default_value_t = 0.0)]
    trace_sample: f64,
}

fn millis(ms: u64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// The engine's limits.
fn config(a: &Args) -> Config {
    Config::default()
        .max_request_bytes(a.max_request_bytes)
        .max_response_bytes(a.max_response_bytes)
        .max_batch_len(a.max_batch_len)
        .max_depth(a.max_depth)
        .request_timeout(millis(a.request_timeout_ms))
}

/// The server's settings.
fn settings(a: &Args) -> ServerConfig {
    let mut s = ServerConfig::default()
        .max_connections(a.max_connections)
        .idle_timeout(millis(a.idle_timeout_ms))
        .subscriber_ping_interval(millis(a.subscriber_ping_ms))
        .request_read_timeout(millis(a.request_read_timeout_ms))
        .queue_capacity(a.queue_capacity)
        .write_high_water(a.write_high_water)
        .reactors(a.reactors)
        .http_path(a.http_path.clone());
    if let Some(n) = a.workers {
        s = s.workers(n);
    }
    if let Some(n) = a.batch_concurrency {
        s = s.batch_concurrency(n);
    }
    for origin in &a.cors_origin {
        s = s.cors_origin(origin.clone());
    }
    s
}

/// Authentication and rate limits, if any flag asks for them.
fn guard(a: &Args) -> Result<Option<Guard>, GuardError> {
    // Built first, so that a bad value is an error even when nothing else asks for a
    // guard.
    let mut g = Guard::new().with_auth_failure_limit(&a.auth_fail_limit)?;
    if a.auth_file.is_none() && a.jwt_secret.is_none() && a.rate_limit.is_none() {
        return Ok(None);
    }
    if let Some(path) = &a.auth_file {
        g = g.with_key_file(path)?;
    }
    if let Some(path) = &a.jwt_secret {
        g = g.with_jwt_secret_file(path)?;
    }
    if let Some(spec) = &a.rate_limit {
        g = g.with_peer_rate_limit(spec)?;
    }
    Ok(Some(g))
}

/// The de-duplication store, if `--dedup` asks for one.
fn dedup(a: &Args) -> Result<Option<Dedup>, String> {
    let ttl = Duration::from_millis(a.dedup_ttl_ms.max(1));
    match a.dedup.as_deref() {
        None => Ok(None),
        Some("memory") => Ok(Some(Dedup::memory(a.dedup_max_bytes, ttl))),
        Some(url) if url.starts_with("redis://") => Dedup::redis(url, ttl, a.dedup_fail == "open")
            .map(Some)
            .map_err(|e| e.to_string()),
        Some(other) => Err(format!(
            "--dedup {other:?}: give memory or redis://HOST:PORT"
        )),
    }
}

fn serve(a: Args) -> std::io::Result<()> {
    let mut engine = demo::engine(config(&a));
    if a.no_metrics {
        engine = engine.without_metrics();
    }
    match a.access_log.as_str() {
        "json" => engine = engine.with_access_log(AccessLog::stderr(Format::Json)),
        "text" => engine = engine.with_access_log(AccessLog::stderr(Format::Text)),
        _ => {}
    }
    if !(0.0..=1.0).contains(&a.trace_sample) {
        return Err(std::io::Error::other(format!(
            "--trace-sample {}: give a fraction from 0 to 1",
            a.trace_sample
        )));
    }
    engine = engine.with_trace_sampling(a.trace_sample);
    if let Some(d) = dedup(&a).map_err(std::io::Error::other)? {
        engine = engine.with_dedup(d);
    }
    let guarded = match guard(&a).map_err(std::io::Error::other)? {
        Some(g) => {
            engine = engine.with_guard(g);
            true
        }
        None => false,
    };
    let engine = std::sync::Arc::new(engine);
    if a.stdio {
        if let Some(addr) = &a.metrics {
            // Metrics of a stdio server: a listener of their own, on a thread beside.
            let mut metrics = Server::with_config(std::sync::Arc::clone(&engine), settings(&a))?;
            let bound = metrics.listen_metrics(addr.as_str())?;
            eprintln!("listening metrics {bound}");
            std::thread::spawn(move || metrics.run());
        }
        return ringrpc::server::serve_stdio(&engine);
    }
    let mut server = Server::with_config(engine, settings(&a))?;
    let mut lines = Vec::new();
    if a.tcp != "off" {
        lines.push(format!(
            "listening tcp {}",
            server.listen_tcp(a.tcp.as_str())?
        ));
    }
    if a.http != "off" {
        lines.push(format!(
            "listening http {}",
            server.listen_http(a.http.as_str())?
        ));
    }
    if let Some(path) = &a.unix {
        server.listen_unix(path)?;
        lines.push(format!("listening unix {}", path.display()));
    }
    if let Some(addr) = &a.metrics {
        lines.push(format!(
            "listening metrics {}",
            server.listen_metrics(addr.as_str())?
        ));
    }
    server.shutdown_on_signals()?;
    if guarded && a.auth_file.is_some() {
        server.reload_on_sighup()?;
    }
    // Bound and registered: connections are accepted from here on (the kernel queues
    // them until the loop runs).
    // Best effort: whoever started the server may stop reading its output (a script
    // that waited for the first line); that must not stop the server.
    let mut out = std::io::stdout().lock();
    for l in lines {
        let _ = writeln!(out, "{l}");
    }
    let _ = out.flush();
    drop(out);
    server.run()
}

fn main() -> ExitCode {
    match serve(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("server: {e}");
            ExitCode::FAILURE
        }
    }
}
