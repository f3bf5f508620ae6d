//! Side-by-side timing of ringrpc and the two baselines, robust to a noisy machine.
//!
//! ```text
//! cargo run --release -p benches --bin side_by_side -- [subtract|echo|batch] [ROUNDS]
//! ```
//!
//! Criterion measures one function after another, so when the machine's load shifts
//! between them the ratio shifts too. Here each round times all three back to back
//! on the same input (every iteration copies the input into a reused frame buffer,
//! standing for the read, then handles it), and the ratios are taken per round; the
//! medians over the rounds are printed.

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

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let kind = args.next().unwrap_or_else(|| "subtract".into());
    let rounds: usize = args.next().and_then(|r| r.parse().ok()).unwrap_or(15);
    let (input, requests, n) = match kind.as_str() {
        "subtract" => (inputs::SUBTRACT.as_bytes().to_vec(), 1, 200_000),
        "echo" => (inputs::ECHO_1K.as_bytes().to_vec(), 1, 20_000),
        "batch" => (
            inputs::batch16().into_bytes(),
            inputs::BATCH_LEN as usize,
            20_000,
        ),
        other => {
            eprintln!("side_by_side: unknown input {other:?} (subtract, echo or batch)");
            return ExitCode::from(2);
        }
    };
    let engine = demo::engine(Config::default());
    let mut scratch = engine.scratch();
    let mut frame = input.clone();
    let mut out = Vec::with_capacity(64 * 1024);
    let (mut r, mut s, mut j, mut rs, mut rj) = (vec![], vec![], vec![], vec![], vec![]);
    for _ in 0..rounds.max(1) {
        let tr = time(n, || {
            frame.copy_from_slice(black_box(&input));
            out.clear();
            let _ = black_box(engine.handle(&frame, &mut scratch, &mut out));
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
        s.push(ts);
        j.push(tj);
        rs.push(ts / tr);
        rj.push(tj / tr);
    }
    let per = |ns: f64| ns / requests as f64;
    println!(
        "{kind}: ns per request (median of {rounds} rounds): ringrpc {:.0}, serde_json {:.0}, jsonrpsee_types {:.0}",
        per(median(r)),
        per(median(s)),
        per(median(j))
    );
    println!(
        "{kind}: speed-up of ringrpc (median of per-round ratios): {:.2}x serde_json, {:.2}x jsonrpsee_types",
        median(rs),
        median(rj)
    );
    ExitCode::SUCCESS
}
