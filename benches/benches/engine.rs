//! Whole-path engine bench: one frame in, its reply out, no I/O.
//!
//! Each group runs three implementations side by side on the same input and checks they
//! answer it (see `tests/agree.rs` for the full agreement tests):
//!
//! - `ringrpc`: `Engine::handle` with the demo methods, one reused `Scratch` and output
//!   `Vec`;
//! - `serde_json`: `benches::serde_json_baseline` (borrowed envelope, typed params, a
//!   fresh `Vec` per response appended to a reused output `Vec`);
//! - `jsonrpsee_types`: `benches::jsonrpsee_baseline` (jsonrpsee's `Request`, `Params`,
//!   `Response`).
//!
//! **The input copy.** ringrpc parses in place (simd-json unescapes strings into the frame
//! and the frame is clobbered), so every iteration first copies the input into a reused
//! frame buffer. The baselines only read their input, but they pay the very same copy
//! inside the timed loop, so the figures compare the same work: copy + handle.
//!
//! Groups: `subtract` (the specification's 61-byte call), `echo_1k` (a ~1 KB echo with
//! escapes and every JSON type), `batch16` (16 `add` calls in one batch), and
//! `parse_only` (simd-json tape vs padded tape vs serde_json envelope parse of the
//! subtract call). Throughput is in requests (`Elements`), so criterion reports
//! requests/s.
//!
//! ```text
//! cargo bench -p benches --bench engine -- --warm-up-time 1 --measurement-time 3
//! ```

use std::hint::black_box;

use benches::{inputs, jsonrpsee_baseline, serde_json_baseline};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ringrpc::{demo, Config, Outcome};
use simd_json::{Buffers, Tape};

/// A baseline's entry point.
type Handle = fn(&[u8], &mut Vec<u8>) -> bool;

/// One group: the three implementations on `input`, which holds `requests` calls.
fn whole_path(c: &mut Criterion, name: &str, input: &[u8], requests: u64) {
    let engine = demo::engine(Config::default());
    check_replies(&engine, input);

    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(requests));

    group.bench_function("ringrpc", |b| {
        let mut scratch = engine.scratch();
        let mut frame = Vec::with_capacity(input.len());
        let mut out = Vec::with_capacity(4096);
        b.iter(|| {
            frame.clear();
            frame.extend_from_slice(black_box(input));
            out.clear();
            let outcome = engine.handle(&frame, &mut scratch, &mut out);
            let _ = black_box((outcome, &out));
        });
    });

    let baselines: [(&str, Handle); 2] = [
        ("serde_json", serde_json_baseline::handle),
        ("jsonrpsee_types", jsonrpsee_baseline::handle),
    ];
    for (id, handle) in baselines {
        group.bench_function(id, |b| {
            let mut frame = Vec::with_capacity(input.len());
            let mut out = Vec::with_capacity(4096);
            b.iter(|| {
                // Every implementation copies the input each iteration (standing for
                // the read into the connection buffer), so all do the same work.
                frame.clear();
                frame.extend_from_slice(black_box(input));
                out.clear();
                let replied = handle(&frame, &mut out);
                black_box((replied, &out));
            });
        });
    }
    group.finish();
}

/// All three answer `input`, with the same JSON (as values; member order aside).
fn check_replies(engine: &ringrpc::Engine, input: &[u8]) {
    let frame = input.to_vec();
    let mut out = Vec::new();
    assert_eq!(
        engine.handle(&frame, &mut engine.scratch(), &mut out),
        Outcome::Reply
    );
    let expected: serde_json::Value = serde_json::from_slice(&out).expect("ringrpc reply");
    for handle in [serde_json_baseline::handle, jsonrpsee_baseline::handle] {
        let mut got = Vec::new();
        assert!(handle(input, &mut got));
        let got: serde_json::Value = serde_json::from_slice(&got).expect("baseline reply");
        assert_eq!(got, expected);
    }
}

fn subtract(c: &mut Criterion) {
    whole_path(c, "subtract", inputs::SUBTRACT.as_bytes(), 1);
}

fn echo_1k(c: &mut Criterion) {
    whole_path(c, "echo_1k", inputs::ECHO_1K.as_bytes(), 1);
}

fn batch16(c: &mut Criterion) {
    let input = inputs::batch16();
    whole_path(c, "batch16", input.as_bytes(), inputs::BATCH_LEN);
}

/// Parsing alone, on the subtract call: simd-json's `fill_tape` (which copies the input
/// into its own padded buffer), `fill_tape_padded` (the caller provides
/// `INPUT_PADDING` bytes of slack, so that copy is skipped), and serde_json's borrowed
/// envelope parse. Every variant copies the input into a reused buffer first, as above.
fn parse_only(c: &mut Criterion) {
    let input = inputs::SUBTRACT.as_bytes();
    let len = input.len();
    let mut group = c.benchmark_group("parse_only");
    group.throughput(Throughput::Elements(1));

    group.bench_function("simd_json_fill_tape", |b| {
        let mut buffers = Buffers::default();
        let mut tape: Tape<'static> = Tape(Vec::new());
        let mut frame = Vec::with_capacity(len);
        b.iter(|| {
            frame.clear();
            frame.extend_from_slice(black_box(input));
            let mut t = std::mem::replace(&mut tape, Tape(Vec::new())).reset();
            let r = simd_json::fill_tape(&mut frame, &mut buffers, &mut t);
            black_box((r.is_ok(), &t.0));
            tape = t.reset();
        });
    });

    group.bench_function("simd_json_fill_tape_padded", |b| {
        let mut buffers = Buffers::default();
        let mut tape: Tape<'static> = Tape(Vec::new());
        let mut frame = vec![b' '; len + simd_json::INPUT_PADDING];
        b.iter(|| {
            frame[..len].copy_from_slice(black_box(input));
            let mut t = std::mem::replace(&mut tape, Tape(Vec::new())).reset();
            let r = simd_json::fill_tape_padded(&mut frame, len, &mut buffers, &mut t);
            black_box((r.is_ok(), &t.0));
            tape = t.reset();
        });
    });

    group.bench_function("serde_json_envelope", |b| {
        let mut frame = Vec::with_capacity(len);
        b.iter(|| {
            frame.clear();
            frame.extend_from_slice(black_box(input));
            let req = serde_json_baseline::parse(&frame);
            black_box(&req);
        });
    });
    group.finish();

    // The variants all parse the input.
    let mut t = Tape(Vec::new());
    let mut f = input.to_vec();
    simd_json::fill_tape(&mut f, &mut Buffers::default(), &mut t).expect("fill_tape");
    let n = t.0.len();
    let mut p = [input, &[b' '; simd_json::INPUT_PADDING][..]].concat();
    let mut t = Tape(Vec::new());
    simd_json::fill_tape_padded(&mut p, len, &mut Buffers::default(), &mut t)
        .expect("fill_tape_padded");
    assert_eq!(t.0.len(), n);
    let req = serde_json_baseline::parse(input).expect("serde_json envelope");
    assert_eq!(req.method, "subtract");
}

criterion_group!(engine, subtract, echo_1k, batch16, parse_only);
criterion_main!(engine);
