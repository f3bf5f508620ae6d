//! A command-line JSON-RPC 2.0 client for any server: TCP, Unix socket or HTTP.
//!
//! ```text
//! cargo run --release --example client -- tcp://127.0.0.1:7700 subtract '[42, 23]'
//! cargo run --release --example client -- http://127.0.0.1:7701/ get_data
//! cargo run --release --example client -- unix:///tmp/ringrpc.sock update '[1,2]' --notify
//! ```
//!
//! Prints the result as JSON on stdout and exits 0; prints the server's error object
//! on stderr and exits 1; prints any other failure (connecting, timing out, a broken
//! reply, params that are not an array or object) on stderr and exits 2.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use ringrpc::client::{Client, Error, Options};
use serde_json::value::RawValue;

#[derive(Parser)]
#[command(about = "Call a JSON-RPC 2.0 method over tcp://, unix:// or http://")]
struct Args {
    /// tcp://host:port, unix:///path or http://host[:port][/path]
    url: String,
    /// The method to call.
    method: String,
    /// The params as JSON (an array or an object); none if omitted.
    params: Option<String>,
    /// Send a notification (no id, no answer).
    #[arg(long)]
    notify: bool,
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
        Err(Error::Server(e)) => {
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
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
