//! Zero heap allocations per request in steady state, counted by a global allocator.
//!
//! The stream is fed through a fixed `BytesMut` read buffer in 16 KiB "reads", as a
//! transport would, and answered with `Engine::handle_lines` into a reused output
//! buffer: framing, in-place parsing, validation, dispatch and serialization all count.

use bytes::BytesMut;
use ringrpc::{demo, Config};

#[path = "util/counting.rs"]
mod counting;
use counting::allocs;

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

const SUBTRACT: &str = r#"{"jsonrpc":"2.0","method":"subtract","params":[42,23],"id":1}"#;

fn echo_1k() -> String {
    let mut items = Vec::new();
    for i in 0..12 {
        items.push(format!(
            r#"{{"name":"item \"{i}\"\n","tags":["a\u00e9","b"],"n":{i},"neg":-{i}5,"f":{i}.25,"ok":true,"none":null}}"#
        ));
    }
    let req = format!(
        r#"{{"jsonrpc":"2.0","method":"echo","params":{{"items":[{}],"meta":{{"depth":{{"x":[1,[2,[3]]]}}}}}},"id":"e-1"}}"#,
        items.join(",")
    );
    assert!((900..1400).contains(&req.len()), "{}", req.len());
    req
}

fn batch_16() -> String {
    let calls: Vec<String> = (1..=16)
        .map(|i| format!(r#"{{"jsonrpc":"2.0","method":"add","params":[{i},{i}],"id":{i}}}"#))
        .collect();
    format!("[{}]", calls.join(","))
}

/// Runs `count` copies of `line` through the engine and returns (allocations, replies).
fn run(line: &str, count: usize) -> (u64, usize) {
    let engine = demo::engine(Config::default());
    let (mut decoder, mut scratch) = (engine.decoder(), engine.scratch());
    let mut stream = Vec::new();
    for _ in 0..count {
        stream.extend_from_slice(line.as_bytes());
        stream.push(b'\n');
    }
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut out = Vec::with_capacity(64 * 1024);
    let mut replies = 0;
    let mut feed = |chunks: &[u8], replies: &mut usize| {
        for chunk in chunks.chunks(16 * 1024) {
            buf.extend_from_slice(chunk);
            *replies += engine.handle_lines(&mut buf, &mut decoder, &mut scratch, &mut out);
            // The transport would write `out` to the socket here.
            out.clear();
        }
    };
    // Warm-up: buffers grow to fit.
    let warm = line.len() * 64 + 64;
    feed(&stream[..warm.min(stream.len())], &mut replies);
    let before = allocs();
    feed(&stream[warm.min(stream.len())..], &mut replies);
    (allocs() - before, replies)
}

#[test]
fn zero_allocations_per_subtract() {
    let (allocs, replies) = run(SUBTRACT, 10_000);
    assert_eq!(replies, 10_000);
    assert_eq!(allocs, 0, "allocations for 10,000 subtract requests");
}

#[test]
fn zero_allocations_per_1k_echo() {
    let (allocs, replies) = run(&echo_1k(), 10_000);
    assert_eq!(replies, 10_000);
    assert_eq!(allocs, 0, "allocations for 10,000 echo requests");
}

#[test]
fn zero_allocations_per_batch_of_16() {
    let (allocs, replies) = run(&batch_16(), 10_000);
    assert_eq!(replies, 10_000);
    assert_eq!(allocs, 0, "allocations for 10,000 batches of 16");
}

#[test]
fn the_counter_counts() {
    let before = allocs();
    let v = vec![1u8; 10];
    assert_eq!(allocs() - before, 1);
    drop(v);
}
