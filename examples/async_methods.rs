//! Methods answered from a tokio runtime: the server's reactor never waits for them.
//!
//! ```text
//! cargo run --release --example async_methods                   # http 127.0.0.1:7711
//! cargo run --release --example async_methods -- --upstream http://127.0.0.1:7701/
//! ```
//!
//! Methods (JSON-RPC over HTTP):
//! - `wait [ms]` (ms ≤ 60000): awaits a tokio timer, answers `ms`.
//! - `upstream_subtract [a, b]`: awaits `subtract` on the upstream JSON-RPC server
//!   (jsonrpsee's async HTTP client) and answers its result.
//! - any other method: forwarded to the upstream as it came (params passed through
//!   raw), and its answer relayed as it came — results verbatim, errors with their
//!   code, message and data — as a small JSON-RPC proxy would.
//!
//! Without `--upstream` the example serves the demo methods itself on a second
//! (ephemeral) port and uses that as its upstream, so it runs on its own.
//!
//! Each handler starts a task on the runtime with owned copies of what it needs and
//! returns at once; the task completes the call's `Responder` when its awaits are done.
//! The engine stays runtime-free: tokio is a dependency of the examples only.
//!
//! Prints `listening http ADDR` and `upstream URL`; SIGINT/SIGTERM stop it.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use jsonrpsee_core::client::{ClientT, Error as UpstreamError};
use jsonrpsee_core::traits::ToRpcParams;
use jsonrpsee_http_client::{HttpClient, HttpClientBuilder};
use ringrpc::server::Server;
use ringrpc::{demo, Config, Engine, Registry, RpcError, ServerConfig};
use serde_json::value::RawValue;

/// Serve methods answered from a tokio runtime (timers, calls to an upstream server).
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// JSON-RPC over HTTP/1.1 on ADDR.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7711")]
    http: String,
    /// The upstream JSON-RPC server (http://…); default: the demo methods, served by
    /// this process on an ephemeral port.
    #[arg(long, value_name = "URL")]
    upstream: Option<String>,
    /// Deadline of a call, in ms (past it the caller gets -32001).
    #[arg(long, value_name = "MS", default_value_t = 30_000)]
    request_timeout_ms: u64,
}

/// Params forwarded as they came (absent params stay absent).
struct RawParams(Option<Box<RawValue>>);

impl ToRpcParams for RawParams {
    fn to_rpc_params(self) -> Result<Option<Box<RawValue>>, serde_json::Error> {
        Ok(self.0)
    }
}

/// The upstream's failure as the error to answer: its own error object relayed as it
/// came, anything else (unreachable, timed out, a bad answer) as -32603 saying so.
fn relay(e: UpstreamError) -> RpcError {
    match e {
        UpstreamError::Call(obj) => RpcError::relay(
            obj.code(),
            obj.message().to_owned(),
            obj.data().map(RawValue::get),
        ),
        other => RpcError::relay(
            ringrpc::codes::INTERNAL_ERROR,
            format!("Internal error: the upstream call failed: {other}"),
            None,
        ),
    }
}

fn methods(rt: tokio::runtime::Handle, upstream: Arc<HttpClient>) -> Registry {
    let mut b = Registry::builder();
    let wait_rt = rt.clone();
    b.deferred_method("wait", move |_ctx, params, responder| {
        let ms = match params.parse::<[u64; 1]>() {
            Ok([ms]) if ms <= 60_000 => ms,
            Ok(_) => {
                return responder.error(RpcError::invalid_params("`ms` must be at most 60000"))
            }
            Err(e) => return responder.error(e),
        };
        wait_rt.spawn(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            responder.respond(Ok(ms));
        });
    })
    .expect("a new name");
    let (sub_rt, sub_upstream) = (rt.clone(), Arc::clone(&upstream));
    b.deferred_method("upstream_subtract", move |_ctx, params, responder| {
        let [a, b] = match params.parse::<[i64; 2]>() {
            Ok(ab) => ab,
            Err(e) => return responder.error(e),
        };
        let client = Arc::clone(&sub_upstream);
        sub_rt.spawn(async move {
            let r = client.request::<i64, _>("subtract", [a, b]).await;
            responder.respond(r.map_err(relay));
        });
    })
    .expect("a new name");
    b.deferred_fallback(move |ctx, params, responder| {
        let method = ctx.method().to_owned();
        // The params' own text, copied once: the task outlives the frame.
        let raw = params
            .raw_json()
            .map(|text| RawValue::from_string(String::from_utf8_lossy(text).into_owned()));
        let raw = match raw.transpose() {
            Ok(raw) => raw,
            Err(e) => return responder.error(RpcError::invalid_params(e)),
        };
        let client = Arc::clone(&upstream);
        rt.spawn(async move {
            match client
                .request::<Box<RawValue>, _>(&method, RawParams(raw))
                .await
            {
                Ok(result) => responder.respond_raw(result.get().as_bytes()),
                Err(e) => responder.error(relay(e)),
            }
        });
    });
    b.freeze()
}

fn serve(a: Args) -> std::io::Result<()> {
    let io = |e: Box<dyn std::error::Error + Send + Sync>| std::io::Error::other(e);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let config =
        Config::default().request_timeout(Some(Duration::from_millis(a.request_timeout_ms)));
    // The upstream: the one asked for, or the demo methods served here.
    let upstream_url = match a.upstream {
        Some(url) => url,
        None => {
            let mut upstream = Server::new(demo::engine(Config::default()))?;
            let addr = upstream.listen_http("127.0.0.1:0")?;
            std::thread::spawn(move || upstream.run());
            format!("http://{addr}/")
        }
    };
    let client = {
        let _guard = rt.enter();
        HttpClientBuilder::default()
            .request_timeout(Duration::from_millis(a.request_timeout_ms))
            .build(&upstream_url)
            .map_err(|e| io(e.into()))?
    };
    let engine = Engine::new(methods(rt.handle().clone(), Arc::new(client)), config);
    // One worker thread: nothing here blocks one (the waits run on the runtime).
    let mut server = Server::with_config(engine, ServerConfig::default().workers(1))?;
    let addr = server.listen_http(a.http.as_str())?;
    server.shutdown_on_signals()?;
    // Best effort: a reader that stopped after the first line must not stop the server.
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "listening http {addr}\nupstream {upstream_url}");
    let _ = out.flush();
    drop(out);
    let r = server.run();
    rt.shutdown_timeout(Duration::from_secs(1));
    r
}

fn main() -> ExitCode {
    match serve(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("async_methods: {e}");
            ExitCode::FAILURE
        }
    }
}
