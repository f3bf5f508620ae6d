//! Zero heap allocations per call in steady state with the guard and de-duplication on:
//! an authenticated connection's calls checked against an allow-list and a rate limit,
//! a batch charged per element, anonymous calls charged per peer address, and calls
//! de-duplicated in memory (claim, run, store the answer, evict the oldest; replays).

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use ringrpc::dedup::Dedup;
use ringrpc::guard::{Guard, Session};
use ringrpc::{demo, Config, Connection, Engine, Peer, Source, Transport};

#[path = "util/counting.rs"]
mod counting;
use counting::allocs;

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

const KEYS: &str = r#"
[[key]]
name  = "app"
token = "t"
allow = ["ping", "get_*", "incr", "add"]
rate  = 1e9
burst = 1000000000
[weights]
add = 2
"#;

/// Calls `frames` (cycled) `n` times from `source`; allocations during the calls.
fn calls(engine: &Engine, source: &Source<'_>, frames: &[Vec<u8>], n: usize, want: &str) -> u64 {
    let mut scratch = engine.scratch();
    let mut out = Vec::with_capacity(64 * 1024);
    let mut run = |from: usize, to: usize| {
        for i in from..to {
            out.clear();
            let _ = engine.handle_from(&frames[i % frames.len()], source, &mut scratch, &mut out);
            assert!(
                std::str::from_utf8(&out).is_ok_and(|s| s.contains(want)),
                "{}",
                String::from_utf8_lossy(&out)
            );
        }
    };
    // Warm-up: buffers, maps and the store grow to fit (the store fills and evicts).
    run(0, n);
    let before = allocs();
    run(n, 2 * n);
    allocs() - before
}

fn frames(method: &str, params: &str, n: u32) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            format!(r#"{{"jsonrpc":"2.0","method":"{method}","params":{params},"id":{i}}}"#)
                .into_bytes()
        })
        .collect()
}

fn authenticated(engine: &Engine, session: &Session, conn: &Connection) {
    let source = Source::new(conn).with_session(session);
    let mut out = Vec::new();
    let frame = br#"{"jsonrpc":"2.0","method":"rpc.auth","params":{"token":"t"},"id":0}"#;
    let _ = engine.handle_from(frame, &source, &mut engine.scratch(), &mut out);
    assert!(String::from_utf8_lossy(&out).contains(r#""identity":"app""#));
}

#[test]
fn auth_allow_list_and_rate_limit() {
    let engine =
        demo::engine(Config::default()).with_guard(Guard::new().with_keys_toml(KEYS).unwrap());
    let conn = Connection::new(Transport::Tcp, Peer::Unknown, 1);
    let session = Session::new();
    authenticated(&engine, &session, &conn);
    let source = Source::new(&conn).with_session(&session);
    let ping = frames("ping", "[]", 1);
    assert_eq!(calls(&engine, &source, &ping, 10_000, "pong"), 0);
    let batch = vec![format!(
        "[{}]",
        (0..16)
            .map(|i| format!(r#"{{"jsonrpc":"2.0","method":"add","params":[1,2],"id":{i}}}"#))
            .collect::<Vec<_>>()
            .join(",")
    )
    .into_bytes()];
    assert_eq!(calls(&engine, &source, &batch, 2_000, "3"), 0);
    // Refused calls (not on the list) are answered without allocating either.
    let echo = frames("echo", "[1]", 1);
    assert_eq!(calls(&engine, &source, &echo, 2_000, "-32041"), 0);
}

#[test]
fn anonymous_calls_limited_per_peer() {
    let engine = demo::engine(Config::default())
        .with_guard(Guard::new().with_peer_rate_limit("1000000000").unwrap());
    let ping = frames("ping", "[]", 1);
    // Many peers: the table turns over.
    let conns: Vec<Connection> = (0..1000u32)
        .map(|i| {
            let ip = Ipv4Addr::from(0x7f01_0000 + i);
            Connection::new(
                Transport::Tcp,
                Peer::Ip(SocketAddr::from((ip, 5000))),
                u64::from(i),
            )
        })
        .collect();
    let session = Session::new();
    let mut total = 0;
    for round in 0..2 {
        for conn in &conns {
            let source = Source::new(conn).with_session(&session);
            let a = calls(&engine, &source, &ping, 20, "pong");
            if round == 1 {
                total += a;
            }
        }
    }
    assert_eq!(
        total, 0,
        "allocations for 40,000 anonymous calls from 1,000 peers"
    );
}

#[test]
fn dedup_in_memory() {
    let engine = demo::engine(Config::default())
        .with_guard(Guard::new().with_keys_toml(KEYS).unwrap())
        .with_dedup(Dedup::memory(64 << 10, Duration::from_secs(600)));
    let conn = Connection::new(Transport::Tcp, Peer::Unknown, 1);
    let session = Session::new();
    authenticated(&engine, &session, &conn);
    let source = Source::new(&conn).with_session(&session);
    // New ids: claim, run, store, evict (64 KiB hold about 500 answers).
    let incr = frames("incr", "[1]", 50_000);
    assert_eq!(calls(&engine, &source, &incr, 20_000, "result"), 0);
    // The same id again and again: replays.
    let same = frames("incr", "[1]", 1);
    assert_eq!(calls(&engine, &source, &same, 10_000, "result"), 0);
}

/// Answers too long to be kept in their slot: each in a buffer, reused from the one an
/// eviction frees.
#[test]
fn dedup_in_memory_long_answers() {
    let mut methods = demo::builder();
    methods.dedup("echo").unwrap();
    let keys = KEYS.replace(r#""add"]"#, r#""add", "echo"]"#);
    let engine = Engine::new(methods.freeze(), Config::default())
        .with_guard(Guard::new().with_keys_toml(&keys).unwrap())
        .with_dedup(Dedup::memory(64 << 10, Duration::from_secs(600)));
    let conn = Connection::new(Transport::Tcp, Peer::Unknown, 1);
    let session = Session::new();
    authenticated(&engine, &session, &conn);
    let source = Source::new(&conn).with_session(&session);
    let long = format!(r#"["{}"]"#, "x".repeat(200));
    let echo = frames("echo", &long, 50_000);
    assert_eq!(calls(&engine, &source, &echo, 20_000, "xxxx"), 0);
}
