//! What the metrics cost per call: the same frames through `Engine::handle`, with
//! metrics on (the default) and off (`Engine::without_metrics`).
//!
//! ```text
//! taskset -c 0 cargo bench -p benches --bench metrics -- --warm-up-time 1 --measurement-time 4
//! ```
//!
//! - `metrics/{off,on}`: one `ping` per frame. With metrics on, each frame finds the
//!   thread's shard (a thread-local lookup, as an embedder's thread does; a server's
//!   reactor holds its shard instead), reads the clock at its start, and the call
//!   counts itself: the clock again, a code slot, a counter and a histogram bucket.
//! - `metrics_batch/{off,on}`: a batch of 100 `ping`s per frame: per element, the cost
//!   of counting and timing one call (the frame's share spread over 100), plus the
//!   batch size histogram.
//! - `observe/{bare,sampled,access_log}`: one `ping` per frame (metrics on): as is; in
//!   a sampled trace (a `tracing` span per call, no subscriber installed); and with the
//!   JSON access log (the line formatted and queued; written by the log's thread to
//!   `io::sink`).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ringrpc::{demo, Config, Engine};

const PING: &[u8] = br#"{"jsonrpc":"2.0","method":"ping","id":1}"#;

fn bench_pair(c: &mut Criterion, group: &str, frame: &[u8], elements: u64) {
    let on = Engine::new(demo::registry(), Config::default());
    let off = Engine::new(demo::registry(), Config::default()).without_metrics();
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(elements));
    for (name, engine) in [("off", &off), ("on", &on)] {
        let mut scratch = engine.scratch();
        let mut out = Vec::with_capacity(64 * 1024);
        out.clear();
        let _ = engine.handle(frame, &mut scratch, &mut out);
        assert!(String::from_utf8_lossy(&out).contains("pong"));
        g.bench_function(name, |b| {
            b.iter(|| {
                out.clear();
                let r = engine.handle(black_box(frame), &mut scratch, &mut out);
                let _ = black_box((r, &out));
            });
        });
    }
    g.finish();
    let text = on
        .metrics()
        .map(ringrpc::metrics::Metrics::render)
        .unwrap_or_default();
    assert!(text.contains(r#"method="ping",transport="embedded",code="0""#));
}

fn observe(c: &mut Criterion) {
    use ringrpc::access_log::{AccessLog, Format};
    use ringrpc::trace::Trace;
    use ringrpc::{Connection, Source};
    let bare = Engine::new(demo::registry(), Config::default());
    let logged = Engine::new(demo::registry(), Config::default())
        .with_access_log(AccessLog::to_writer(Format::Json, std::io::sink(), 1 << 16));
    let trace = Trace::root(true);
    let conn = Connection::EMBEDDED;
    let plain = Source::new(&conn);
    let traced = Source::new(&conn).with_trace(&trace);
    let mut g = c.benchmark_group("observe");
    g.throughput(Throughput::Elements(1));
    for (name, engine, source) in [
        ("bare", &bare, plain),
        ("sampled", &bare, traced),
        ("access_log", &logged, plain),
    ] {
        let mut scratch = engine.scratch();
        let mut out = Vec::with_capacity(4096);
        g.bench_function(name, |b| {
            b.iter(|| {
                out.clear();
                let r = engine.handle_from(black_box(PING), &source, &mut scratch, &mut out);
                let _ = black_box((r, &out));
            });
        });
    }
    g.finish();
}

fn metrics(c: &mut Criterion) {
    bench_pair(c, "metrics", PING, 1);
    let batch: Vec<String> = (0..100)
        .map(|i| format!(r#"{{"jsonrpc":"2.0","method":"ping","id":{i}}}"#))
        .collect();
    let batch = format!("[{}]", batch.join(","));
    bench_pair(c, "metrics_batch", batch.as_bytes(), 100);
}

criterion_group!(benches, metrics, observe);
criterion_main!(benches);
