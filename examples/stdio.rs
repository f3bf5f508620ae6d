//! Newline-delimited JSON-RPC over stdin/stdout (MCP's stdio convention), serving the
//! demo methods.
//!
//! ```text
//! echo '{"jsonrpc":"2.0","method":"subtract","params":[42,23],"id":1}' \
//!     | cargo run --release --example stdio
//! ```
//!
//! One response line per answered request. Output is flushed whenever reading more
//! input would block, when the pending output grows past 64 KiB, and at end of input;
//! then the process exits 0. Subscriptions push too: after
//! `{"jsonrpc":"2.0","method":"subscribe_ticks","params":[1000],"id":1}` a `tick`
//! notification comes every second, until `unsubscribe_ticks` or the end of input.

use clap::Parser;
use ringrpc::{demo, server::serve_stdio, Config};

/// Serve the ringrpc demo methods on stdin/stdout: one JSON-RPC request per input line,
/// one response per output line; exits 0 at end of input.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {}

fn main() -> std::io::Result<()> {
    Args::parse();
    serve_stdio(&demo::engine(Config::default()))
}
