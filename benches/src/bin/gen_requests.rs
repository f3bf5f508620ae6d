//! Writes newline-delimited JSON-RPC requests to stdout, for the whole-process
//! comparisons.
//!
//! ```text
//! gen_requests [N] [--kind subtract|echo|batch]
//! ```
//!
//! - `subtract` (default): the specification's call with ids 1..=N,
//!   `{"jsonrpc":"2.0","method":"subtract","params":[42,23],"id":i}`;
//! - `echo`: the ~1 KB echo bench request with ids 1..=N;
//! - `batch`: N lines, each a batch of 16 `add` calls (ids continue across lines).
//!
//! N defaults to 1,000,000.

use std::io::{self, BufWriter, Write};
use std::process::ExitCode;

use benches::inputs;

enum Kind {
    Subtract,
    Echo,
    Batch,
}

fn usage(msg: &str) -> ExitCode {
    eprintln!("gen_requests: {msg}\nusage: gen_requests [N] [--kind subtract|echo|batch]");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut n: u64 = 1_000_000;
    let mut kind = Kind::Subtract;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = match arg.strip_prefix("--kind=") {
            Some(v) => Some(v.to_owned()),
            None if arg == "--kind" => args.next(),
            None => None,
        };
        if arg.starts_with("--kind") {
            kind = match value.as_deref() {
                Some("subtract") => Kind::Subtract,
                Some("echo") => Kind::Echo,
                Some("batch") => Kind::Batch,
                _ => return usage("--kind takes subtract, echo or batch"),
            };
        } else {
            match arg.replace('_', "").parse() {
                Ok(v) => n = v,
                Err(_) => return usage(&format!("not a count: {arg}")),
            }
        }
    }
    match write(n, &kind) {
        Ok(()) => ExitCode::SUCCESS,
        // A closed pipe (`| head`) is a normal way to stop.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gen_requests: {e}");
            ExitCode::FAILURE
        }
    }
}

fn write(n: u64, kind: &Kind) -> io::Result<()> {
    let mut out = BufWriter::with_capacity(64 * 1024, io::stdout().lock());
    // The fixed inputs end in `"id":<k>}`: keep everything up to the id's digits.
    let prefix = |s: &'static str| {
        let at = s.rfind(r#""id":"#).expect("input has an id") + r#""id":"#.len();
        &s[..at]
    };
    match kind {
        Kind::Subtract => {
            let p = prefix(inputs::SUBTRACT);
            for i in 1..=n {
                writeln!(out, "{p}{i}}}")?;
            }
        }
        Kind::Echo => {
            let p = prefix(inputs::ECHO_1K);
            for i in 1..=n {
                writeln!(out, "{p}{i}}}")?;
            }
        }
        Kind::Batch => {
            for i in 0..n {
                let first = i * inputs::BATCH_LEN + 1;
                writeln!(out, "{}", inputs::batch_add(first, inputs::BATCH_LEN))?;
            }
        }
    }
    out.flush()
}
