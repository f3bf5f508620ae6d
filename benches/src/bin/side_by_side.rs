//! Side-by-side timing of ringrpc and the two baselines, robust to a noisy machine.
//!
//! ```text
//! cargo run --release -p benches --bin side_by_side -- [subtract|echo|batch] [ROUNDS]
//! cargo run --release -p benches --bin side_by_side -- profile KIND CALLS [bare]
//! ```
//!
//! Criterion measures one function after another, so when the machine's load shifts
//! between them the ratio shifts too. Here each round times all three back to back
//! on the same input (every iteration copies the input into a reused frame buffer,
//! standing for the read, then handles it), and the ratios are taken per round; the
//! medians over the rounds are printed. `profile` only runs ringrpc's loop (`bare`:
//! without metrics), for counting instructions under callgrind: run it with two call
//! counts and divide the difference. ringrpc is timed twice: as built by default
//! (metrics on) and `.without_metrics()`, so the metrics' share shows in the same run.

use std::hint::black_box;
use std::process::ExitCode;
use std::time::Instant;

use benches::{inputs, jsonrpsee_baseline, serde_json_baseline};
use ringrpc::{demo, Config};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Mean nanoseconds per iteration of `f` over `n` iterations.
fn time(n: usize, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

/// The input for `kind`: its bytes, the requests in it, the iterations per round.
fn input(kind: &str) -> Option<(Vec<u8>, usize, usize)> {
    Some(match kind {
        "subtract" => (inputs::SUBTRACT.as_bytes().to_vec(), 1, 200_000),
        "echo" => (inputs::ECHO_1K.as_bytes().to_vec(), 1, 20_000),
        "batch" => (
            inputs::batch16().into_bytes(),
            inputs::BATCH_LEN as usize,
            20_000,
        ),
        _ => return None,
    })
}

/// `profile KIND CALLS [bare]`: ringrpc's loop alone.
fn profile(mut args: impl Iterator<Item = String>) -> ExitCode {
    let kind = args.next().unwrap_or_else(|| "subtract".into());
    let calls: usize = args.next().and_then(|c| c.parse().ok()).unwrap_or(100_000);
    let Some((input, ..)) = input(&kind) else {
        eprintln!("side_by_side: unknown input {kind:?} (subtract, echo or batch)");
        return ExitCode::from(2);
    };
    let mut engine = demo::engine(Config::default());
    if args.next().as_deref() == Some("bare") {
        engine = engine.without_metrics();
    }
    let mut scratch = engine.scratch();
    let mut frame = input.clone();
    let mut out = Vec::with_capacity(64 * 1024);
    for _ in 0..calls {
        frame.copy_from_slice(black_box(&input));
        out.clear();
        let _ = black_box(engine.handle(&frame, &mut scratch, &mut out));
    }
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let kind = args.next().unwrap_or_else(|| "subtract".into());
    if kind == "profile" {
        return profile(args);
    }
    let rounds: usize = args.next().and_then(|r| r.parse().ok()).unwrap_or(15);
    let Some((input, requests, n)) = input(&kind) else {
        eprintln!("side_by_side: unknown input {kind:?} (subtract, echo or batch)");
        return ExitCode::from(2);
    };
    let engine = demo::engine(Config::default());
    let bare = demo::engine(Config::default()).without_metrics();
    let mut scratch = engine.scratch();
    let mut frame = input.clone();
    let mut out = Vec::with_capacity(64 * 1024);
    let (mut r, mut s, mut j, mut rs, mut rj) = (vec![], vec![], vec![], vec![], vec![]);
    let (mut b, mut bs) = (vec![], vec![]);
    for _ in 0..rounds.max(1) {
        let tr = time(n, || {
            frame.copy_from_slice(black_box(&input));
            out.clear();
            let _ = black_box(engine.handle(&frame, &mut scratch, &mut out));
        });
        let tb = time(n, || {
            frame.copy_from_slice(black_box(&input));
            out.clear();
            let _ = black_box(bare.handle(&frame, &mut scratch, &mut out));
        });
        let ts = time(n, || {
            frame.copy_from_slice(black_box(&input));
            out.clear();
            black_box(serde_json_baseline::handle(&frame, &mut out));
        });
        let tj = time(n / 2, || {
            frame.copy_from_slice(black_box(&input));
            out.clear();
            black_box(jsonrpsee_baseline::handle(&frame, &mut out));
        });
        r.push(tr);
        b.push(tb);
        bs.push(ts / tb);
        s.push(ts);
        j.push(tj);
        rs.push(ts / tr);
        rj.push(tj / tr);
    }
    let per = |ns: f64| ns / requests as f64;
    println!(
        "{kind}: ns per request (median of {rounds} rounds): ringrpc {:.0} (without metrics {:.0}), serde_json {:.0}, jsonrpsee_types {:.0}",
        per(median(r)),
        per(median(b)),
        per(median(s)),
        per(median(j))
    );
    println!(
        "{kind}: speed-up of ringrpc (median of per-round ratios): {:.2}x serde_json, {:.2}x jsonrpsee_types; without metrics {:.2}x serde_json",
        median(rs),
        median(rj),
        median(bs)
    );
    ExitCode::SUCCESS
}
