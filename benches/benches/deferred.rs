//! Calls answered later: what a `deferred_method` costs next to an inline method.
//!
//! - `deferred_tcp/{inline,deferred}`: a real server on loopback TCP, 64 calls pipelined
//!   on one connection per iteration. `inline` is `ping`, answered on the reactor;
//!   `deferred` is `handoff`, whose handler sends its `Responder` to another thread,
//!   which answers it (the reactor is woken, puts the answer in its slot, writes it).
//!   The difference per call is the cost of answering later from another thread.
//! - `deferred_no_io/{inline,deferred}`: `Engine::handle` alone, the deferred answer
//!   waited for on a condition variable (one cross-thread round trip per call).
//!
//! ```text
//! cargo bench -p benches --bench deferred -- --warm-up-time 1 --measurement-time 5
//! ```

use std::hint::black_box;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::mpsc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ringrpc::server::Server;
use ringrpc::{demo, Config, Engine, Responder};

/// The demo methods plus `handoff`, whose responders are answered by a thread of
/// their own.
fn engine() -> Engine {
    let (tx, rx) = mpsc::channel::<Responder>();
    std::thread::spawn(move || {
        for r in rx {
            r.respond(Ok("pong"));
        }
    });
    let tx = std::sync::Mutex::new(tx);
    let mut b = demo::builder();
    b.deferred_method("handoff", move |_ctx, _p, responder| {
        // A poisoned lock or a gone thread: the responder is dropped, answering -32603.
        if let Ok(tx) = tx.lock() {
            let _ = tx.send(responder);
        }
    })
    .expect("a new name");
    Engine::new(b.freeze(), Config::default())
}

const DEPTH: usize = 64;

fn deferred_tcp(c: &mut Criterion) {
    let mut server = Server::new(engine()).expect("server");
    let addr = server.listen_tcp("127.0.0.1:0").expect("listen");
    let handle = server.handle();
    let thread = std::thread::spawn(move || server.run());

    let mut group = c.benchmark_group("deferred_tcp");
    group.throughput(Throughput::Elements(DEPTH as u64));
    for (name, method) in [("inline", "ping"), ("deferred", "handoff")] {
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let mut reader = BufReader::new(stream.try_clone().expect("clone"));
        let mut writer = stream;
        let batch: String = (0..DEPTH)
            .map(|i| format!("{{\"jsonrpc\":\"2.0\",\"method\":\"{method}\",\"id\":{i}}}\n"))
            .collect();
        let mut line = String::new();
        // Check the answers once.
        writer.write_all(batch.as_bytes()).expect("write");
        for i in 0..DEPTH {
            line.clear();
            reader.read_line(&mut line).expect("read");
            assert_eq!(
                line,
                format!("{{\"jsonrpc\":\"2.0\",\"id\":{i},\"result\":\"pong\"}}\n")
            );
        }
        group.bench_function(name, |b| {
            b.iter(|| {
                writer.write_all(batch.as_bytes()).expect("write");
                for _ in 0..DEPTH {
                    line.clear();
                    reader.read_line(&mut line).expect("read");
                }
                black_box(&line);
            });
        });
    }
    group.finish();
    handle.shutdown();
    let _ = thread.join();
}

fn deferred_no_io(c: &mut Criterion) {
    let engine = engine();
    let mut group = c.benchmark_group("deferred_no_io");
    group.throughput(Throughput::Elements(1));
    for (name, frame) in [
        (
            "inline",
            &br#"{"jsonrpc":"2.0","method":"ping","id":1}"#[..],
        ),
        (
            "deferred",
            br#"{"jsonrpc":"2.0","method":"handoff","id":1}"#,
        ),
    ] {
        let mut scratch = engine.scratch();
        let mut out = Vec::with_capacity(256);
        let _ = engine.handle(frame, &mut scratch, &mut out);
        assert_eq!(out, br#"{"jsonrpc":"2.0","id":1,"result":"pong"}"#);
        group.bench_function(name, |b| {
            b.iter(|| {
                out.clear();
                let outcome = engine.handle(black_box(frame), &mut scratch, &mut out);
                let _ = black_box((outcome, &out));
            });
        });
    }
    group.finish();
}

criterion_group!(benches, deferred_tcp, deferred_no_io);
criterion_main!(benches);
