//! Client round trips per second on one connection: the ringrpc client against
//! jsonrpsee 0.26's HTTP client, both calling the same in-process ringrpc server (the
//! demo `add`).
//!
//! ```text
//! cargo bench -p benches --bench client
//! ```
//!
//! - **depth 1**: one call at a time (`call`; jsonrpsee: `request` on a current-thread
//!   tokio runtime).
//! - **depth 64**: 64 calls in flight on the one connection. ringrpc: 64 `start`s, then
//!   64 `wait`s on one thread (pipelined single requests, over TCP and over HTTP/1.1
//!   pipelining), and a batch of 64. jsonrpsee's HTTP client cannot pipeline on one
//!   connection (concurrent requests open more connections), so its depth 64 is a batch
//!   of 64 — the same for both, side by side.
//!
//! Throughput is in calls (`Elements`). Server and client share the machine's CPUs, as
//! they would on one host; compare ratios from one run.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use jsonrpsee_core::client::ClientT;
use jsonrpsee_core::params::BatchRequestBuilder;
use jsonrpsee_core::rpc_params;
use jsonrpsee_http_client::HttpClientBuilder;
use ringrpc::client::Client;
use ringrpc::server::Server;
use ringrpc::{demo, Config};

const DEPTH: usize = 64;

fn bench(c: &mut Criterion) {
    let mut server = Server::new(demo::engine(Config::default())).unwrap();
    let tcp = server.listen_tcp("127.0.0.1:0").unwrap();
    let http = server.listen_http("127.0.0.1:0").unwrap();
    let stop = server.handle();
    let thread = std::thread::spawn(move || server.run());

    let ring_tcp = Client::connect(&format!("tcp://{tcp}")).unwrap();
    let ring_http = Client::connect(&format!("http://{http}/")).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let jsonrpsee = rt.block_on(async {
        HttpClientBuilder::default()
            .build(format!("http://{http}"))
            .unwrap()
    });

    let mut g = c.benchmark_group("client_depth1");
    g.throughput(Throughput::Elements(1));
    g.bench_function("ringrpc_tcp", |b| {
        b.iter(|| ring_tcp.call::<i64, _>("add", [1, 2]).unwrap())
    });
    g.bench_function("ringrpc_http", |b| {
        b.iter(|| ring_http.call::<i64, _>("add", [1, 2]).unwrap())
    });
    g.bench_function("jsonrpsee_http", |b| {
        b.iter(|| {
            rt.block_on(jsonrpsee.request::<i64, _>("add", rpc_params![1, 2]))
                .unwrap()
        })
    });
    g.finish();

    let mut g = c.benchmark_group("client_depth64");
    g.throughput(Throughput::Elements(DEPTH as u64));
    let mut pending = Vec::with_capacity(DEPTH);
    for (name, client) in [
        ("ringrpc_tcp_pipelined", &ring_tcp),
        ("ringrpc_http_pipelined", &ring_http),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| {
                for i in 0..DEPTH as i64 {
                    pending.push(client.start("add", [i, 1]).unwrap());
                }
                for p in pending.drain(..) {
                    p.wait::<i64>().unwrap();
                }
            })
        });
    }
    for (name, client) in [
        ("ringrpc_tcp_batch", &ring_tcp),
        ("ringrpc_http_batch", &ring_http),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut batch = client.batch();
                let keys: Vec<_> = (0..DEPTH as i64)
                    .map(|i| batch.call("add", [i, 1]).unwrap())
                    .collect();
                let mut reply = batch.send().unwrap();
                for k in keys {
                    reply.get::<i64>(k).unwrap();
                }
            })
        });
    }
    g.bench_function("jsonrpsee_http_batch", |b| {
        b.iter(|| {
            let mut batch = BatchRequestBuilder::new();
            for i in 0..DEPTH as i64 {
                batch.insert("add", rpc_params![i, 1]).unwrap();
            }
            let res = rt.block_on(jsonrpsee.batch_request::<i64>(batch)).unwrap();
            assert_eq!(res.num_successful_calls(), DEPTH);
        })
    });
    g.finish();

    stop.shutdown();
    let _ = thread.join();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench
}
criterion_main!(benches);
