//! What protecting a service costs per call: authentication and allow-lists, rate
//! limits (per identity, per peer address, per batch element), and de-duplication in
//! memory — each next to the same call without it, through `Engine::handle_from` (no
//! I/O, so the differences are the features' own cost).
//!
//! ```text
//! cargo bench -p benches --bench guard -- --warm-up-time 1 --measurement-time 4
//! ```
//!
//! - `guard/bare`: `ping` on an engine without a guard (the baseline).
//! - `guard/auth_allow`: `ping` from a connection authenticated with `rpc.auth`, allowed
//!   by a list of names and prefixes (the token was checked once, at `rpc.auth`).
//! - `guard/auth_allow_limit`: the same key with a rate limit it never reaches.
//! - `guard/peer_limit`: an anonymous caller limited per peer address.
//! - `guard_batch/{bare,limited}`: a batch of 100 `ping`s, without a guard and with a
//!   rate limit per identity: every element charged.
//! - `dedup/{plain,claim_64k,claim_16m,replay}`: `incr` without a store; with the memory
//!   store, a new id each call (claim, run, store the answer; the store full and
//!   evicting: steady state), in a store small enough to stay in the CPU's caches and in
//!   one that is not; the same id each call (a replay).

use std::hint::black_box;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ringrpc::dedup::Dedup;
use ringrpc::guard::{Guard, Session};
use ringrpc::{demo, Config, Connection, Engine, Peer, Source, Transport};

use benches::inputs::KEYS;

const PING: &[u8] = br#"{"jsonrpc":"2.0","method":"ping","id":1}"#;

/// Runs `frame` through `engine` from `source` once and checks the answer.
fn check(engine: &Engine, source: &Source<'_>, frame: &[u8], want: &str) {
    let mut out = Vec::new();
    let _ = engine.handle_from(frame, source, &mut engine.scratch(), &mut out);
    let got = String::from_utf8_lossy(&out);
    assert!(got.contains(want), "{got}");
}

fn auth(engine: &Engine, source: &Source<'_>, token: &str) {
    let frame =
        format!(r#"{{"jsonrpc":"2.0","method":"rpc.auth","params":{{"token":"{token}"}},"id":0}}"#);
    check(engine, source, frame.as_bytes(), "identity");
}

fn bench_frame(
    c: &mut Criterion,
    group: &str,
    name: &str,
    engine: &Engine,
    source: &Source<'_>,
    frame: &[u8],
    elements: u64,
) {
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(elements));
    let mut scratch = engine.scratch();
    let mut out = Vec::with_capacity(64 * 1024);
    g.bench_function(name, |b| {
        b.iter(|| {
            out.clear();
            let r = engine.handle_from(black_box(frame), source, &mut scratch, &mut out);
            let _ = black_box((r, &out));
        });
    });
    g.finish();
}

fn guard(c: &mut Criterion) {
    let tcp = Connection::new(
        Transport::Tcp,
        Peer::Ip(SocketAddr::from((Ipv4Addr::LOCALHOST, 40000))),
        1,
    );

    let bare = demo::engine(Config::default());
    let source = Source::new(&tcp);
    check(&bare, &source, PING, "pong");
    bench_frame(c, "guard", "bare", &bare, &source, PING, 1);

    let keyed =
        demo::engine(Config::default()).with_guard(Guard::new().with_keys_toml(KEYS).unwrap());
    let session = Session::new();
    let source = Source::new(&tcp).with_session(&session);
    auth(&keyed, &source, "r3ader");
    check(&keyed, &source, PING, "pong");
    bench_frame(c, "guard", "auth_allow", &keyed, &source, PING, 1);

    let session = Session::new();
    let source = Source::new(&tcp).with_session(&session);
    auth(&keyed, &source, "m3tered");
    check(&keyed, &source, PING, "pong");
    bench_frame(c, "guard", "auth_allow_limit", &keyed, &source, PING, 1);

    let peers = demo::engine(Config::default()).with_guard(
        Guard::new()
            .with_peer_rate_limit("1000000000:1000000000")
            .unwrap(),
    );
    let session = Session::new();
    let source = Source::new(&tcp).with_session(&session);
    check(&peers, &source, PING, "pong");
    bench_frame(c, "guard", "peer_limit", &peers, &source, PING, 1);
}

fn guard_batch(c: &mut Criterion) {
    let tcp = Connection::new(Transport::Tcp, Peer::Unknown, 1);
    let batch = format!(
        "[{}]",
        (0..100)
            .map(|i| format!(r#"{{"jsonrpc":"2.0","method":"ping","id":{i}}}"#))
            .collect::<Vec<_>>()
            .join(",")
    );
    let bare = demo::engine(Config::default());
    let source = Source::new(&tcp);
    bench_frame(
        c,
        "guard_batch",
        "bare",
        &bare,
        &source,
        batch.as_bytes(),
        100,
    );

    let keyed =
        demo::engine(Config::default()).with_guard(Guard::new().with_keys_toml(KEYS).unwrap());
    let session = Session::new();
    let source = Source::new(&tcp).with_session(&session);
    auth(&keyed, &source, "m3tered");
    check(&keyed, &source, batch.as_bytes(), "pong");
    bench_frame(
        c,
        "guard_batch",
        "limited",
        &keyed,
        &source,
        batch.as_bytes(),
        100,
    );
}

fn dedup(c: &mut Criterion) {
    let tcp = Connection::new(Transport::Tcp, Peer::Unknown, 1);
    let keyed = || Guard::new().with_keys_toml(KEYS).expect("keys");
    let incr = br#"{"jsonrpc":"2.0","method":"incr","params":[1],"id":1}"#;

    // A new id each call (the frames cycled through, as below, so both pay the same
    // cache misses for them), against a store that fills, then evicts (the steady state
    // of a busy server), and an id comes back only long after its entry left: 64 KiB
    // (it stays in the CPU's caches) and 16 MiB (it does not). 2^18 ids: the 16 MiB
    // store holds about 150,000 entries of ~110 bytes, so an id cycled back has always
    // been evicted (with 2^17 they would come back as replays).
    const IDS: usize = 1 << 18;
    let frames: Vec<Vec<u8>> = (0..IDS as u32)
        .map(|i| {
            format!(r#"{{"jsonrpc":"2.0","method":"incr","params":[1],"id":{i}}}"#).into_bytes()
        })
        .collect();
    for (name, bytes) in [
        ("plain", 0),
        ("claim_64k", 64 << 10),
        ("claim_16m", 16 << 20),
    ] {
        let stored = demo::engine(Config::default()).with_guard(keyed());
        let stored = if bytes == 0 {
            stored
        } else {
            stored.with_dedup(Dedup::memory(bytes, Duration::from_secs(600)))
        };
        let session = Session::new();
        let source = Source::new(&tcp).with_session(&session);
        auth(&stored, &source, "r3ader");
        let mut g = c.benchmark_group("dedup");
        g.throughput(Throughput::Elements(1));
        let mut scratch = stored.scratch();
        let mut out = Vec::with_capacity(1024);
        let mut i = 0usize;
        g.bench_function(name, |b| {
            b.iter(|| {
                out.clear();
                let frame = &frames[i & (IDS - 1)];
                i += 1;
                let r = stored.handle_from(black_box(frame), &source, &mut scratch, &mut out);
                let _ = black_box((r, &out));
            });
        });
        g.finish();
    }

    let stored = demo::engine(Config::default())
        .with_guard(keyed())
        .with_dedup(Dedup::memory(1 << 20, Duration::from_secs(600)));
    let session = Session::new();
    let source = Source::new(&tcp).with_session(&session);
    auth(&stored, &source, "r3ader");
    check(&stored, &source, incr, "result");
    bench_frame(c, "dedup", "replay", &stored, &source, incr, 1);
}

criterion_group!(benches, guard, guard_batch, dedup);
criterion_main!(benches);
