//! Crossed answers under load: many clients use the *same* ids at once, each call's
//! params are unique, and every answer is checked to carry its own call's params back.
//! Point it at a JSON-RPC proxy in front of any server with an `echo` method that
//! answers its params (the ringrpc demo server has one); a proxy that mixes up
//! colliding ids shows up as mismatches.
//!
//! ```text
//! cargo run --release -p benches --bin collide -- --tcp 127.0.0.1:7710 \
//!     --clients 64 --calls 1000000 --depth 32
//! ```
//!
//! Every client numbers its calls 1, 2, 3, … (so all clients collide on every id) and
//! also sends every tenth message as a batch of three calls sharing one id. Prints one
//! JSON line: calls, answers, mismatches, errors, seconds; exits 1 on any mismatch or
//! error.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::{json, Value};

/// Many clients, colliding ids, unique params: count answers that are not their own.
#[derive(Parser, Debug)]
#[command(about)]
struct Args {
    /// Newline-delimited JSON-RPC over TCP at ADDR (host:port).
    #[arg(long, value_name = "ADDR")]
    tcp: String,
    /// Client connections, each on its own thread.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// Calls in all (batch elements count one each).
    #[arg(long, default_value_t = 1_000_000)]
    calls: u64,
    /// Messages in flight per connection.
    #[arg(long, default_value_t = 32)]
    depth: usize,
}

/// What a message expects back: the params of each of its calls.
enum Expect {
    One(Value),
    Batch([Value; 3]),
}

#[derive(Default)]
struct Counts {
    calls: AtomicU64,
    answers: AtomicU64,
    mismatches: AtomicU64,
    errors: AtomicU64,
}

fn client(addr: String, c: usize, calls: u64, depth: usize, counts: Arc<Counts>) {
    let Ok(stream) = TcpStream::connect(&addr) else {
        counts.errors.fetch_add(calls, Ordering::Relaxed);
        return;
    };
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(w) = stream.try_clone() else { return };
    let mut w = std::io::BufWriter::new(w);
    let mut r = BufReader::new(stream);
    let mut expect: VecDeque<Expect> = VecDeque::with_capacity(depth);
    let (mut sent, mut k) = (0u64, 0u64);
    let mut line = String::new();
    let mut out = String::new();
    while sent < calls || !expect.is_empty() {
        // Fill the window.
        out.clear();
        while sent < calls && expect.len() < depth {
            k += 1;
            // The same ids on every connection: 1, 2, 3, …
            if k % 10 == 0 && sent + 3 <= calls {
                let p = [json!([c, k, 0]), json!([c, k, 1]), json!([c, k, 2])];
                out.push('[');
                for (i, params) in p.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&format!(
                        r#"{{"jsonrpc":"2.0","method":"echo","params":{params},"id":{k}}}"#
                    ));
                }
                out.push_str("]\n");
                expect.push_back(Expect::Batch(p));
                sent += 3;
            } else {
                let params = json!([c, k]);
                out.push_str(&format!(
                    r#"{{"jsonrpc":"2.0","method":"echo","params":{params},"id":{k}}}"#
                ));
                out.push('\n');
                expect.push_back(Expect::One(params));
                sent += 1;
            }
        }
        if !out.is_empty()
            && w.write_all(out.as_bytes())
                .and_then(|()| w.flush())
                .is_err()
        {
            counts.errors.fetch_add(calls - sent, Ordering::Relaxed);
            return;
        }
        // One answer (answers on a line transport come in request order).
        line.clear();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            counts.errors.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let Some(want) = expect.pop_front() else {
            counts.mismatches.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let got: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
        let (n, bad) = match want {
            Expect::One(params) => {
                let bad = if got.get("error").is_some() {
                    counts.errors.fetch_add(1, Ordering::Relaxed);
                    0
                } else {
                    u64::from(got["result"] != params)
                };
                (1, bad)
            }
            Expect::Batch(params) => {
                let results: Vec<&Value> = got
                    .as_array()
                    .map(|a| a.iter().map(|e| &e["result"]).collect())
                    .unwrap_or_default();
                let bad = (0..3)
                    .filter(|&i| results.get(i).copied() != Some(&params[i]))
                    .count() as u64;
                (3, bad)
            }
        };
        counts.answers.fetch_add(n, Ordering::Relaxed);
        counts.mismatches.fetch_add(bad, Ordering::Relaxed);
        counts.calls.fetch_add(n, Ordering::Relaxed);
    }
}

fn main() -> ExitCode {
    let a = Args::parse();
    let counts = Arc::new(Counts::default());
    let started = Instant::now();
    let per = a.calls / a.clients as u64;
    let threads: Vec<_> = (0..a.clients)
        .map(|c| {
            let (addr, counts) = (a.tcp.clone(), Arc::clone(&counts));
            let calls = per + u64::from((c as u64) < a.calls % a.clients as u64);
            std::thread::spawn(move || client(addr, c, calls, a.depth, counts))
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    let secs = started.elapsed().as_secs_f64();
    let (mismatches, errors) = (
        counts.mismatches.load(Ordering::Relaxed),
        counts.errors.load(Ordering::Relaxed),
    );
    println!(
        "{}",
        json!({
            "calls": counts.calls.load(Ordering::Relaxed),
            "answers": counts.answers.load(Ordering::Relaxed),
            "mismatches": mismatches,
            "errors": errors,
            "seconds": secs,
        })
    );
    if mismatches + errors > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
