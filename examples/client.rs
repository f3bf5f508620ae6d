//! A command-line JSON-RPC 2.0 client for any server: TCP, Unix socket or HTTP.
//!
//! ```text
//! cargo run --release --example client -- tcp://127.0.0.1:7700 subtract '[42, 23]'
//! cargo run --release --example client -- http://127.0.0.1:7701/ get_data
//! cargo run --release --example client -- unix:///tmp/ringrpc.sock update '[1,2]' --notify
//! cargo run --release --example client -- ws://127.0.0.1:7701/ subscribe_ticks '[100]' --follow --count 5
//! ```
//!
//! Prints the result as JSON on stdout and exits 0; prints the server's error object
//! on stderr and exits 1; prints any other failure (connecting, timing out, a broken
//! reply, params that are not an array or object) on stderr and exits 2.
//!
//! With `--follow`, the method is a subscription: each notification's result is
//! printed on its own line as it comes (flushed at once), notifications lost on the way
//! are reported on stderr, and the subscription is ended with its unsubscribe method
//! (`--unsubscribe`, by default the method's name with `subscribe` turned into
//! `unsubscribe`) after `--count` notifications or on Ctrl-C. A subscription the server
//! closes exits 0; one it ends with an error exits 1.

use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use ringrpc::client::{Client, Error, Options};
use serde_json::value::RawValue;

#[derive(Parser)]
#[command(about = "Call a JSON-RPC 2.0 method over tcp://, unix://, http:// or ws://")]
struct Args {
    /// tcp://host:port, unix:///path, http://host[:port][/path] or ws://host[:port][/path]
    url: String,
    /// The method to call.
    method: String,
    /// The params as JSON (an array or an object); none if omitted.
    params: Option<String>,
    /// Send a notification (no id, no answer).
    #[arg(long, conflicts_with = "follow")]
    notify: bool,
    /// Subscribe: print every notification's result as it comes.
    #[arg(long)]
    follow: bool,
    /// With --follow: the method that ends the subscription (default: the method's
    /// name with `subscribe` turned into `unsubscribe`).
    #[arg(long, requires = "follow")]
    unsubscribe: Option<String>,
    /// With --follow: stop after this many notifications.
    #[arg(long, requires = "follow")]
    count: Option<u64>,
    /// Connect timeout and call deadline, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let params: Option<Box<RawValue>> = match args.params.as_deref().map(serde_json::from_str) {
        None => None,
        Some(Ok(p)) => Some(p),
        Some(Err(e)) => {
            eprintln!("params are not valid JSON: {e}");
            return ExitCode::from(2);
        }
    };
    let t = Duration::from_millis(args.timeout_ms);
    let options = Options::default().connect_timeout(t).timeout(t);
    if args.follow {
        return follow(&args, options, &params);
    }
    let result = Client::connect_with(&args.url, options).and_then(|c| {
        if args.notify {
            c.notify(&args.method, &params).map(|()| None)
        } else {
            c.call_with(&args.method, &params, |r| {
                Ok(Some(r.raw_json().into_owned()))
            })
        }
    });
    match result {
        Ok(json) => {
            if let Some(json) = json {
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(&json).and_then(|()| out.write_all(b"\n"));
            }
            ExitCode::SUCCESS
        }
        Err(e) => failed(e),
    }
}

/// Prints a failure on stderr: the server's error object (exit 1) or another (exit 2).
fn failed(e: Error) -> ExitCode {
    match e {
        Error::Server(e) => {
            // `data` is printed as the server sent it.
            let message = serde_json::Value::String(e.message);
            match e.data {
                Some(data) => {
                    eprintln!(r#"{{"code":{},"message":{message},"data":{data}}}"#, e.code)
                }
                None => eprintln!(r#"{{"code":{},"message":{message}}}"#, e.code),
            }
            ExitCode::from(1)
        }
        e => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// `--follow`: subscribes and prints notifications until `--count`, Ctrl-C or the
/// server's end of the subscription.
fn follow(args: &Args, options: Options, params: &Option<Box<RawValue>>) -> ExitCode {
    let unsubscribe = match &args.unsubscribe {
        Some(m) => m.clone(),
        None if args.method.contains("subscribe") => {
            args.method.replacen("subscribe", "unsubscribe", 1)
        }
        None => {
            eprintln!("error: name the unsubscribe method with --unsubscribe");
            return ExitCode::from(2);
        }
    };
    // Ctrl-C (or SIGTERM) ends the subscription cleanly: the loop sees the flag at the
    // next notification or within a tenth of a second.
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        if let Err(e) = signal_hook::flag::register(sig, Arc::clone(&stop)) {
            eprintln!("warning: a signal will not unsubscribe: {e}");
        }
    }
    let client = match Client::connect_with(&args.url, options) {
        Ok(c) => c,
        Err(e) => return failed(e),
    };
    let mut sub = match client.subscribe(&args.method, params, &unsubscribe) {
        Ok(s) => s,
        Err(e) => return failed(e),
    };
    let mut out = std::io::stdout().lock();
    let mut seen = 0;
    while args.count.is_none_or(|n| seen < n) && !stop.load(Ordering::Relaxed) {
        match sub.next_timeout(Duration::from_millis(100)) {
            Some(Ok(n)) => {
                if n.missed_before() > 0 {
                    eprintln!("missed {} notifications", n.missed_before());
                }
                let printed = out
                    .write_all(n.raw_json())
                    .and_then(|()| out.write_all(b"\n"))
                    .and_then(|()| out.flush());
                if printed.is_err() {
                    // stdout closed (piped into `head`): done.
                    break;
                }
                seen += 1;
            }
            Some(Err(Error::ReadTimeout)) => {}
            Some(Err(e)) => return failed(e),
            None => return ExitCode::SUCCESS,
        }
    }
    match sub.unsubscribe() {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => failed(e),
    }
}
