//! What protecting a service costs per call, side by side in one process: the guard
//! (authentication and allow-lists, rate limits) and de-duplication in memory, each
//! against the same call without it, through `Engine::handle_from` (no I/O).
//!
//! ```text
//! cargo run --release -p benches --bin protect_cost -- [ROUNDS]
//! cargo run --release -p benches --bin protect_cost -- profile VARIANT CALLS
//! ```
//!
//! `profile` runs one variant's loop alone (after filling its store), for counting
//! instructions under callgrind: run it with two call counts and divide the difference.
//!
//! The criterion bench `guard` measures the same calls one after another, so on a
//! shared machine whose speed drifts, its differences drift too. Here each round times
//! every variant back to back and takes the differences within the round; the medians
//! over the rounds are printed (and the spread, lowest and highest).
//!
//! - `auth_allow`, `auth_allow_limit`, `peer_limit`: `ping` from an authenticated
//!   connection (token checked once, at `rpc.auth`) allowed by a list of names and
//!   prefixes; the same key with a rate limit it never reaches; an anonymous caller
//!   limited per peer address — each against `ping` with no guard.
//! - `claim_64k`, `claim_16m`: `incr` with a new id each call against a memory store of
//!   64 KiB (it stays in the CPU's caches) and 16 MiB (it does not), full and evicting,
//!   against the same calls with no store.

use std::hint::black_box;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use ringrpc::dedup::Dedup;
use ringrpc::guard::{Guard, Session};
use ringrpc::{demo, Config, Connection, Engine, Peer, Source, Transport};

use benches::inputs::KEYS;

const PING: &[u8] = br#"{"jsonrpc":"2.0","method":"ping","id":1}"#;

/// Ids cycled by the de-duplication variants: more than a 16 MiB store holds (~150,000
/// entries), so an id comes back only after its entry was evicted.
const IDS: usize = 1 << 18;

/// One engine and where its calls come from.
struct Variant {
    name: &'static str,
    engine: Engine,
    conn: Box<Connection>,
    session: Box<Session>,
    /// `ping` (one frame) or `incr` with a new id each call.
    dedup: bool,
}

impl Variant {
    fn new(
        name: &'static str,
        engine: Engine,
        peer: Peer,
        token: Option<&str>,
        dedup: bool,
    ) -> Self {
        let v = Self {
            name,
            engine,
            conn: Box::new(Connection::new(Transport::Tcp, peer, 1)),
            session: Box::new(Session::new()),
            dedup,
        };
        if let Some(token) = token {
            let frame = format!(
                r#"{{"jsonrpc":"2.0","method":"rpc.auth","params":{{"token":"{token}"}},"id":0}}"#
            );
            let mut out = Vec::new();
            let _ = v.engine.handle_from(
                frame.as_bytes(),
                &v.source(),
                &mut v.engine.scratch(),
                &mut out,
            );
            assert!(
                String::from_utf8_lossy(&out).contains("identity"),
                "{}",
                String::from_utf8_lossy(&out)
            );
        }
        v
    }

    fn source(&self) -> Source<'_> {
        Source::new(&self.conn).with_session(&self.session)
    }

    /// Mean nanoseconds per call over `n` calls; `next` is the next id to use.
    fn time(&self, n: usize, frames: &[Vec<u8>], next: &mut usize, out: &mut Vec<u8>) -> f64 {
        let source = self.source();
        let mut scratch = self.engine.scratch();
        let t = Instant::now();
        for _ in 0..n {
            out.clear();
            let frame: &[u8] = if self.dedup {
                let f = &frames[*next & (IDS - 1)];
                *next += 1;
                f
            } else {
                PING
            };
            let r = self
                .engine
                .handle_from(black_box(frame), &source, &mut scratch, out);
            let _ = black_box((r, &out));
        }
        t.elapsed().as_nanos() as f64 / n as f64
    }
}

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let profile = args.first().map(String::as_str) == Some("profile");
    let rounds: usize = args.first().and_then(|r| r.parse().ok()).unwrap_or(15);
    let keyed = || Guard::new().with_keys_toml(KEYS).expect("keys");
    let engine = || demo::engine(Config::default());
    let peer = Peer::Ip(SocketAddr::from((Ipv4Addr::LOCALHOST, 40000)));
    let memory = |bytes| Dedup::memory(bytes, Duration::from_secs(600));
    // (variant, its baseline's index)
    let variants = [
        (Variant::new("ping", engine(), peer, None, false), 0),
        (
            Variant::new(
                "auth_allow",
                engine().with_guard(keyed()),
                peer,
                Some("r3ader"),
                false,
            ),
            0,
        ),
        (
            Variant::new(
                "auth_allow_limit",
                engine().with_guard(keyed()),
                peer,
                Some("m3tered"),
                false,
            ),
            0,
        ),
        (
            Variant::new(
                "peer_limit",
                engine().with_guard(
                    Guard::new()
                        .with_peer_rate_limit("1000000000:1000000000")
                        .expect("limit"),
                ),
                peer,
                None,
                false,
            ),
            0,
        ),
        (
            Variant::new(
                "incr",
                engine().with_guard(keyed()),
                peer,
                Some("r3ader"),
                true,
            ),
            4,
        ),
        (
            Variant::new(
                "claim_64k",
                engine().with_guard(keyed()).with_dedup(memory(64 << 10)),
                peer,
                Some("r3ader"),
                true,
            ),
            4,
        ),
        (
            Variant::new(
                "claim_16m",
                engine().with_guard(keyed()).with_dedup(memory(16 << 20)),
                peer,
                Some("r3ader"),
                true,
            ),
            4,
        ),
    ];
    let frames: Vec<Vec<u8>> = (0..IDS as u32)
        .map(|i| {
            format!(r#"{{"jsonrpc":"2.0","method":"incr","params":[1],"id":{i}}}"#).into_bytes()
        })
        .collect();
    let mut out = Vec::with_capacity(1024);
    // Each de-duplicating variant keeps its own ids going, so none comes back early.
    let mut next = vec![0usize; variants.len()];
    if profile {
        let name = args.get(1).map_or("ping", String::as_str);
        let calls: usize = args.get(2).and_then(|c| c.parse().ok()).unwrap_or(100_000);
        let Some(i) = variants.iter().position(|(v, _)| v.name == name) else {
            eprintln!("protect_cost: no variant {name:?}");
            std::process::exit(2);
        };
        let v = &variants[i].0;
        let _ = v.time(
            if v.dedup { IDS } else { 10_000 },
            &frames,
            &mut next[i],
            &mut out,
        );
        let _ = v.time(calls, &frames, &mut next[i], &mut out);
        return;
    }
    // Fill the stores first: the steady state is a full store that evicts.
    for (i, (v, _)) in variants.iter().enumerate() {
        let _ = v.time(
            if v.dedup { IDS } else { 10_000 },
            &frames,
            &mut next[i],
            &mut out,
        );
    }
    let n = 200_000;
    let mut ns: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    let mut cost: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    for _ in 0..rounds.max(1) {
        let t: Vec<f64> = variants
            .iter()
            .enumerate()
            .map(|(i, (v, _))| v.time(n, &frames, &mut next[i], &mut out))
            .collect();
        for (i, (_, base)) in variants.iter().enumerate() {
            ns[i].push(t[i]);
            cost[i].push(t[i] - t[*base]);
        }
    }
    println!("ns per call, median of {rounds} rounds (lowest..highest); cost: the difference from its baseline within each round");
    for (i, (v, base)) in variants.iter().enumerate() {
        let (m, lo, hi) = median(ns[i].clone());
        if i == *base {
            println!("{:>17}: {m:6.1} ({lo:.1}..{hi:.1})", v.name);
        } else {
            let (c, clo, chi) = median(cost[i].clone());
            println!(
                "{:>17}: {m:6.1} ({lo:.1}..{hi:.1})  cost over {}: {c:6.1} ({clo:.1}..{chi:.1})",
                v.name, variants[*base].0.name
            );
        }
    }
}
