//! ringrpc's demo method set served by jsonrpsee 0.26 over HTTP: the off-the-shelf Rust
//! JSON-RPC server that `loadgen` measures ringrpc against.
//!
//! ```text
//! cargo run --release -p benches --bin jsonrpsee_server -- [--http 127.0.0.1:7901] [--threads 1] [--ws]
//! ```
//!
//! With `--ws`, WebSocket too, on the same address (jsonrpsee's default server serves
//! both; without it, HTTP only).
//!
//! Prints `listening http ADDR` (the bound address, so `--http 127.0.0.1:0` works) once
//! it accepts connections, then serves until killed.
//!
//! The methods answer as `ringrpc::demo` does: `subtract` (`[a, b]` or
//! `{"minuend", "subtrahend"}`), `sum` (an array of integers), `add` (`[a, b]`), `echo`
//! (the params, verbatim), `get_data` (`["hello", 5]`), `ping` (`"pong"`), `sleep`
//! (`{"ms": N}`, N ≤ 60000, then `null`), and `update` / `notify_hello` / `notify_sum`
//! (notifications; called with an id they answer `null`). Integers are `i64`, overflow is
//! `-32602`. Differences that are jsonrpsee's own: `sleep` awaits a tokio timer instead
//! of blocking a thread, `"params": null` counts as absent, and ids are `null`, `u64` or
//! strings.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use jsonrpsee::server::{RpcModule, Server, ServerConfig};
use jsonrpsee::types::{ErrorObject, ErrorObjectOwned, Params};
use serde::Deserialize;
use serde_json::value::RawValue;

/// The longest `sleep` accepted, in milliseconds (as `ringrpc::demo::MAX_SLEEP_MS`).
const MAX_SLEEP_MS: u64 = 60_000;

#[derive(Parser)]
#[command(about = "ringrpc's demo methods served by jsonrpsee over HTTP")]
struct Args {
    /// Address to listen on (port 0 picks a free port; the bound one is printed).
    #[arg(long, default_value = "127.0.0.1:7901")]
    http: SocketAddr,
    /// Tokio worker threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Serve WebSocket too (on the same address).
    #[arg(long)]
    ws: bool,
}

#[derive(Deserialize)]
struct Subtract {
    minuend: i64,
    subtrahend: i64,
}

#[derive(Deserialize)]
struct Sleep {
    ms: u64,
}

fn invalid_params(msg: impl std::fmt::Display) -> ErrorObjectOwned {
    ErrorObject::owned(-32602, format!("Invalid params: {msg}"), None::<()>)
}

fn overflow() -> ErrorObjectOwned {
    invalid_params("the result overflows a 64-bit signed integer")
}

fn module() -> Result<RpcModule<()>, jsonrpsee::core::RegisterMethodError> {
    let mut m = RpcModule::new(());
    m.register_method("subtract", |p: Params<'_>, _, _| {
        let s: Subtract = p.parse()?;
        s.minuend.checked_sub(s.subtrahend).ok_or_else(overflow)
    })?;
    m.register_method("sum", |p: Params<'_>, _, _| {
        let v: Vec<i64> = p.parse()?;
        v.iter()
            .try_fold(0i64, |acc, x| acc.checked_add(*x))
            .ok_or_else(overflow)
    })?;
    m.register_method("add", |p: Params<'_>, _, _| {
        let [a, b]: [i64; 2] = p.parse()?;
        a.checked_add(b).ok_or_else(overflow)
    })?;
    m.register_method("get_data", |_, _, _| {
        Ok::<_, ErrorObjectOwned>(("hello", 5))
    })?;
    m.register_method("ping", |_, _, _| "pong")?;
    // The params as sent (no re-encoding), `null` when there are none.
    m.register_method("echo", |p: Params<'_>, _, _| {
        let raw = p.as_str().unwrap_or("null").to_owned();
        RawValue::from_string(raw).map_err(invalid_params)
    })?;
    m.register_async_method("sleep", |p: Params<'static>, _, _| async move {
        let s: Sleep = p.parse()?;
        if s.ms > MAX_SLEEP_MS {
            return Err(invalid_params(format_args!(
                "`ms` must be at most {MAX_SLEEP_MS}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(s.ms)).await;
        Ok::<(), ErrorObjectOwned>(())
    })?;
    for name in ["update", "notify_hello", "notify_sum"] {
        m.register_method(name, |_, _, _| ())?;
    }
    // As the ringrpc demo's: `tick` notifications 0, 1, 2, … every `interval_ms` (a
    // tokio interval, catching up after a delay as the demo's timer does) until the
    // client unsubscribes or goes; each waits for room in the connection's buffer.
    m.register_subscription(
        "subscribe_ticks",
        "tick",
        "unsubscribe_ticks",
        |p: Params<'static>, pending, _, _| async move {
            let [ms] = match p.parse::<[f64; 1]>() {
                Ok(ms) if (0.001..=MAX_SLEEP_MS as f64).contains(&ms[0]) => ms,
                _ => {
                    pending
                        .reject(invalid_params("`interval_ms` must be 0.001 to 60000"))
                        .await;
                    return Ok(());
                }
            };
            let sink = pending.accept().await?;
            let mut every = tokio::time::interval(Duration::from_secs_f64(ms / 1000.0));
            every.tick().await;
            for n in 0u64.. {
                every.tick().await;
                let msg = serde_json::value::to_raw_value(&n)?;
                if sink.send(msg).await.is_err() {
                    break;
                }
            }
            Ok::<(), jsonrpsee::core::SubscriptionError>(())
        },
    )?;
    Ok(m)
}

async fn serve(addr: SocketAddr, ws: bool) -> Result<(), Box<dyn std::error::Error>> {
    let config = ServerConfig::builder().max_connections(100_000);
    let config = if ws { config } else { config.http_only() }.build();
    let server = Server::builder().set_config(config).build(addr).await?;
    let bound = server.local_addr()?;
    let handle = server.start(module()?);
    println!("listening http {bound}");
    handle.stopped().await;
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("jsonrpsee_server: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match rt.block_on(serve(args.http, args.ws)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("jsonrpsee_server: {e}");
            ExitCode::from(2)
        }
    }
}
