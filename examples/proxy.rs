//! A JSON-RPC proxy: serves TCP, HTTP/1.1 and Unix sockets like the demo server, and
//! forwards every call to upstream servers by method, without re-encoding it.
//!
//! ```text
//! cargo run --release --example server -- --tcp 127.0.0.1:7700 --http off &
//! cargo run --release --example proxy -- --upstream default=tcp://127.0.0.1:7700
//! # tcp 127.0.0.1:7710, http 127.0.0.1:7711
//! cargo run --release --example proxy -- --help    # every flag
//! ```
//!
//! Prints one `listening KIND ADDR` line per listener once it accepts connections.
//! SIGINT / SIGTERM: stop accepting, answer every call already received (forwarded
//! calls included, up to the request timeout), exit 0. See docs/PROXY.md.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use ringrpc::guard::{Guard, GuardError};
use ringrpc::proxy::Proxy;
use ringrpc::server::Server;
use ringrpc::{defaults, Config, Engine, Registry, ServerConfig};

/// Forward JSON-RPC calls to upstream servers, routed by method.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// An upstream, NAME=URL (tcp://HOST:PORT or unix:///PATH); repeat it. Upstreams of
    /// one NAME form a group whose calls go to the least busy one.
    #[arg(long, value_name = "NAME=URL", required_unless_present = "config")]
    upstream: Vec<String>,
    /// Settings from a TOML file (upstreams, routes, method classes, caches; see
    /// docs/PROXY.md); flags add to it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Send methods matching PATTERN (an exact name, or a prefix and `*`) to group
    /// NAME; repeat it, first match wins. Others go to `default`, or the first group.
    #[arg(long, value_name = "PATTERN=NAME")]
    route: Vec<String>,
    /// Methods matching PATTERN (an exact name, or a prefix and `*`) are idempotent:
    /// resent to another upstream of their group when their connection fails; repeat
    /// it. Other calls are written upstream at most once.
    #[arg(long, value_name = "PATTERN")]
    idempotent: Vec<String>,
    /// Hedge idempotent calls: one unanswered after MS is also sent to another upstream
    /// of its group; the first answer wins.
    #[arg(long, value_name = "MS", conflicts_with = "hedge_quantile")]
    hedge_after_ms: Option<u64>,
    /// Hedge idempotent calls after the Q quantile (e.g. 0.95) of their group's
    /// upstream answer times over the last second, instead of a fixed delay.
    #[arg(long, value_name = "Q", value_parser = quantile)]
    hedge_quantile: Option<f64>,
    /// The largest fraction of idempotent calls hedged (with --hedge-after-ms or
    /// --hedge-quantile).
    #[arg(long, value_name = "FRACTION", default_value_t = 0.1)]
    hedge_max: f64,
    /// The most elements of a client batch sent upstream in one batch request (1:
    /// each on its own; default 100 for http:// upstreams, 1 for tcp:// and unix://,
    /// where a batch refused as a whole cannot be told from other errors).
    #[arg(long, value_name = "N")]
    batch_max: Option<usize>,
    /// Probe upstream connections idle this long (0: never); one that does not answer
    /// in time is taken out until it answers again.
    #[arg(long, value_name = "MS")]
    health_interval_ms: Option<u64>,
    /// Do not let identical in-flight calls to idempotent methods share one upstream
    /// call.
    #[arg(long)]
    no_coalesce: bool,
    /// Cache the results of methods matching PATTERN for MS milliseconds; repeat it.
    #[arg(long, value_name = "PATTERN=MS")]
    cache: Vec<String>,
    /// The most bytes the response cache holds (default 64 MiB).
    #[arg(long, value_name = "BYTES")]
    cache_bytes: Option<usize>,
    /// Connections to each upstream, shared by every client (default 2).
    #[arg(long, value_name = "N")]
    connections: Option<usize>,
    /// No connection of each reactor's own to each upstream: every call goes through
    /// the shared connections and the upstream thread.
    #[arg(long)]
    no_reactor_connections: bool,
    /// Forward a subscription: SUBSCRIBE:NOTIFICATION:UNSUBSCRIBE (e.g.
    /// eth_subscribe:eth_subscription:eth_unsubscribe); repeat it. Its subscribe method
    /// is routed like any method, to a group of tcp:// or unix:// upstreams; identical
    /// subscriptions of all clients share one upstream subscription.
    #[arg(long, value_name = "SUB:NOTE:UNSUB")]
    subscription: Vec<String>,
    /// Notifications queued per client subscription while its client reads slowly
    /// (then the oldest are dropped and counted in a `lagged` notification; default
    /// 1024).
    #[arg(long, value_name = "N")]
    subscription_queue: Option<usize>,
    /// How long a forwarded call waits for its upstream, then -32001 upstream_timeout
    /// (default 30000).
    #[arg(long, value_name = "MS")]
    upstream_timeout_ms: Option<u64>,
    /// Newline-delimited JSON-RPC over TCP on ADDR ("off" to disable).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7710")]
    tcp: String,
    /// JSON-RPC over HTTP/1.1 on ADDR, and over WebSocket on the same path ("off" to
    /// disable).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7711")]
    http: String,
    /// Newline-delimited JSON-RPC on a Unix domain socket at PATH.
    #[arg(long, value_name = "PATH")]
    unix: Option<PathBuf>,
    /// Prometheus metrics (and /health) on a listener of their own at ADDR.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// Event-loop threads for client connections.
    #[arg(long, value_name = "N", default_value_t = 1)]
    reactors: usize,
    /// Largest request, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = defaults::DEFAULT_MAX_REQUEST_BYTES)]
    max_request_bytes: usize,
    /// Largest response (and largest upstream answer), in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = defaults::DEFAULT_MAX_RESPONSE_BYTES)]
    max_response_bytes: usize,
    /// Longest batch.
    #[arg(long, value_name = "N", default_value_t = defaults::DEFAULT_MAX_BATCH_LEN)]
    max_batch_len: usize,
    /// Most client connections.
    #[arg(long, value_name = "N", default_value_t = defaults::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// A call not answered within MS is answered -32001 (0: never).
    #[arg(long, value_name = "MS", default_value_t = defaults::DEFAULT_REQUEST_TIMEOUT.as_millis() as u64)]
    request_timeout_ms: u64,
    /// API keys (TOML), as the server's --auth-file.
    #[arg(long, value_name = "FILE")]
    auth_file: Option<PathBuf>,
    /// Rate limit per peer address for anonymous callers, as the server's.
    #[arg(long, value_name = "RATE[:BURST]")]
    rate_limit: Option<String>,
    /// Limit failed authentications per peer address to RATE a second with BURST at
    /// once (say 1:10); past it, tokens from that address are refused unread (-32005,
    /// HTTP 429) until the bucket refills. Only where clients connect directly: behind
    /// a load balancer every client shares its address. See docs/OPERATIONS.md.
    #[arg(long, value_name = "RATE[:BURST]|off", default_value = "off")]
    auth_fail_limit: String,
    /// Turn metrics off.
    #[arg(long)]
    no_metrics: bool,
}

fn millis(ms: u64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// `A=B` split at its first `=`, both sides non-empty.
fn pair<'a>(flag: &str, s: &'a str) -> Result<(&'a str, &'a str), String> {
    match s.split_once('=') {
        Some((a, b)) if !a.is_empty() && !b.is_empty() => Ok((a, b)),
        _ => Err(format!("--{flag} {s:?}: expected the form A=B")),
    }
}

fn proxy(a: &Args) -> Result<Proxy, String> {
    let mut b = Proxy::builder();
    if let Some(path) = &a.config {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--config {}: {e}", path.display()))?;
        b.toml(&text)
            .map_err(|e| format!("--config {}: {e}", path.display()))?;
    }
    for u in &a.upstream {
        let (name, url) = pair("upstream", u)?;
        b.upstream(name, url);
    }
    for r in &a.route {
        let (pattern, name) = pair("route", r)?;
        b.route(pattern, name);
    }
    for pattern in &a.idempotent {
        b.idempotent(pattern);
    }
    for c in &a.cache {
        let (pattern, ms) = pair("cache", c)?;
        let ms: u64 = ms
            .parse()
            .map_err(|_| format!("--cache {c:?}: MS must be a whole number of milliseconds"))?;
        b.cache(pattern, Duration::from_millis(ms));
    }
    if let Some(ms) = a.hedge_after_ms {
        b.hedge(Duration::from_millis(ms), a.hedge_max);
    }
    if let Some(q) = a.hedge_quantile {
        b.hedge_quantile(q, a.hedge_max);
    }
    if let Some(n) = a.batch_max {
        b.batch_max(n);
    }
    if let Some(ms) = a.health_interval_ms {
        b.health_interval(Duration::from_millis(ms));
    }
    if a.no_coalesce {
        b.coalesce(false);
    }
    if let Some(n) = a.cache_bytes {
        b.cache_bytes(n);
    }
    if let Some(n) = a.connections {
        b.connections(n);
    }
    if a.no_reactor_connections {
        b.reactor_connections(false);
    }
    for spec in &a.subscription {
        let mut parts = spec.split(':');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(s), Some(n), Some(u), None) => {
                b.subscription(s, n, u);
            }
            _ => {
                return Err(format!(
                    "--subscription {spec:?}: expected SUBSCRIBE:NOTIFICATION:UNSUBSCRIBE"
                ))
            }
        }
    }
    if let Some(n) = a.subscription_queue {
        b.subscription_queue(n);
    }
    if let Some(ms) = a.upstream_timeout_ms {
        b.timeout(Duration::from_millis(ms.max(1)));
    }
    b.max_answer_bytes(a.max_response_bytes);
    b.start().map_err(|e| e.to_string())
}

fn guard(a: &Args) -> Result<Option<Guard>, GuardError> {
    // Built first, so that a bad value is an error even when nothing else asks for a
    // guard.
    let mut g = Guard::new().with_auth_failure_limit(&a.auth_fail_limit)?;
    if a.auth_file.is_none() && a.rate_limit.is_none() {
        return Ok(None);
    }
    if let Some(path) = &a.auth_file {
        g = g.with_key_file(path)?;
    }
    if let Some(spec) = &a.rate_limit {
        g = g.with_peer_rate_limit(spec)?;
    }
    Ok(Some(g))
}

fn serve(a: Args) -> Result<(), String> {
    let proxy = proxy(&a)?;
    let mut methods = Registry::builder();
    proxy.install(&mut methods).map_err(|e| e.to_string())?;
    let config = Config::default()
        .max_request_bytes(a.max_request_bytes)
        .max_response_bytes(a.max_response_bytes)
        .max_batch_len(a.max_batch_len)
        .request_timeout(millis(a.request_timeout_ms));
    let mut engine = Engine::new(methods.freeze(), config);
    if a.no_metrics {
        engine = engine.without_metrics();
    }
    if let Some(m) = engine.metrics() {
        proxy.export_metrics(m);
    }
    if let Some(g) = guard(&a).map_err(|e| e.to_string())? {
        engine = engine.with_guard(g);
    }
    let settings = ServerConfig::default()
        .max_connections(a.max_connections)
        .reactors(a.reactors);
    let io = |e: std::io::Error| e.to_string();
    let mut server = Server::with_config(std::sync::Arc::new(engine), settings).map_err(io)?;
    let mut lines = Vec::new();
    if a.tcp != "off" {
        let bound = server.listen_tcp(a.tcp.as_str()).map_err(io)?;
        lines.push(format!("listening tcp {bound}"));
    }
    if a.http != "off" {
        let bound = server.listen_http(a.http.as_str()).map_err(io)?;
        lines.push(format!("listening http {bound}"));
    }
    if let Some(path) = &a.unix {
        server.listen_unix(path).map_err(io)?;
        lines.push(format!("listening unix {}", path.display()));
    }
    if let Some(addr) = &a.metrics {
        let bound = server.listen_metrics(addr.as_str()).map_err(io)?;
        lines.push(format!("listening metrics {bound}"));
    }
    server.shutdown_on_signals().map_err(io)?;
    let mut out = std::io::stdout().lock();
    for l in lines {
        let _ = writeln!(out, "{l}");
    }
    let _ = out.flush();
    drop(out);
    let served = server.run().map_err(io);
    // The server has answered what it received; only now may the upstreams go.
    drop(proxy);
    served
}

fn main() -> ExitCode {
    match serve(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("proxy: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A quantile: a number from 0 to 1.
fn quantile(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(q) if (0.0..=1.0).contains(&q) => Ok(q),
        _ => Err(format!("{s:?} is not a quantile (a number from 0 to 1)")),
    }
}
