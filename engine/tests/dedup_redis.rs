//! De-duplication in Redis, against a real `redis-server` (util/redis.rs starts one per
//! test; a missing one fails the test): two engines sharing one Redis behave as one
//! for retried calls (embedded, and two servers over HTTP with `Idempotency-Key`),
//! refusals are not stored, Redis going down fails closed (or open) and coming back
//! needs no restart, and over real sockets a pool or deferred call past its deadline
//! stays in progress until it finishes.

mod util;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringrpc::dedup::Dedup;
use ringrpc::guard::{Guard, Session};
use ringrpc::{demo, Config, Connection, Engine, Params, Peer, RpcError, ServerConfig, Source};
use ringrpc::{Scratch, Transport};
use serde_json::{json, Value};
use util::line::Line;
use util::redis::{Link, RedisServer};
use util::server::Served;

const KEYS: &str = "[[key]]\nname = \"app\"\ntoken = \"t\"\nallow = [\"*\"]\n\
                    [[key]]\nname = \"other\"\ntoken = \"u\"\nallow = [\"*\"]\n";

const TTL: Duration = Duration::from_secs(600);

fn guard() -> Guard {
    Guard::new().with_keys_toml(KEYS).unwrap()
}

/// A demo engine with the guard and a Redis store at `url`.
fn instance(url: &str, fail_open: bool) -> Engine {
    demo::engine(Config::default())
        .with_guard(guard())
        .with_dedup(Dedup::redis(url, TTL, fail_open).unwrap())
}

/// One caller of an embedded engine: its connection, session and buffers.
struct Caller<'e> {
    engine: &'e Engine,
    conn: Connection,
    session: Session,
    scratch: Scratch,
}

impl<'e> Caller<'e> {
    /// A caller authenticated with `token`.
    fn new(engine: &'e Engine, token: &str) -> Self {
        let mut c = Self {
            engine,
            conn: Connection::new(Transport::Tcp, Peer::Unknown, 1),
            session: Session::new(),
            scratch: engine.scratch(),
        };
        let auth =
            c.call(json!({"jsonrpc":"2.0","method":"rpc.auth","params":{"token":token},"id":0}));
        assert!(auth.get("result").is_some(), "auth failed: {auth}");
        c
    }

    fn call(&mut self, request: Value) -> Value {
        let frame = request.to_string();
        let source = Source::new(&self.conn).with_session(&self.session);
        let mut out = Vec::new();
        let _ = self
            .engine
            .handle_from(frame.as_bytes(), &source, &mut self.scratch, &mut out);
        util::check_reply(&out).unwrap_or_else(|e| panic!("{frame}: {e}"))
    }

    fn incr(&mut self, params: Value, id: Value) -> Value {
        self.call(json!({"jsonrpc":"2.0","method":"incr","params":params,"id":id}))
    }

    fn counter(&mut self) -> i64 {
        let v = self.call(json!({"jsonrpc":"2.0","method":"get_counter","id":"c"}));
        v["result"]
            .as_i64()
            .unwrap_or_else(|| panic!("get_counter: {v}"))
    }
}

fn code(v: &Value) -> Option<i64> {
    util::error_code(v)
}

#[test]
fn two_instances_share_answers() {
    let redis = RedisServer::start();
    let (a, b) = (instance(&redis.url(), false), instance(&redis.url(), false));
    let (mut on_a, mut on_b) = (Caller::new(&a, "t"), Caller::new(&b, "t"));

    assert_eq!(
        on_a.incr(json!([5]), json!(7)),
        json!({"jsonrpc":"2.0","id":7,"result":5})
    );
    // The retry reaches the other instance: replayed, not run there.
    assert_eq!(
        on_b.incr(json!([5]), json!(7)),
        json!({"jsonrpc":"2.0","id":7,"result":5})
    );
    assert_eq!(on_b.counter(), 0);
    assert_eq!(on_a.counter(), 5);
    // String ids are keys too, and the replay carries the retry's own id.
    assert_eq!(
        on_a.incr(json!([2]), json!("k\"1")),
        json!({"jsonrpc":"2.0","id":"k\"1","result":7})
    );
    assert_eq!(
        on_b.incr(json!([2]), json!("k\"1")),
        json!({"jsonrpc":"2.0","id":"k\"1","result":7})
    );
    assert_eq!(on_b.counter(), 0);

    // The same id with other params: a mistake, refused on either instance.
    for caller in [&mut on_a, &mut on_b] {
        let v = caller.incr(json!([6]), json!(7));
        assert_eq!(code(&v), Some(-32043), "{v}");
        assert_eq!(v["id"], 7);
    }
    assert_eq!((on_a.counter(), on_b.counter()), (7, 0));

    // Another identity's id 7 is another call.
    let mut other = Caller::new(&b, "u");
    assert_eq!(
        other.incr(json!([5]), json!(7)),
        json!({"jsonrpc":"2.0","id":7,"result":5})
    );
    assert_eq!(on_b.counter(), 5);

    // A refusal (the call never started) frees the key: the corrected call runs, on
    // the other instance too.
    let bad = on_a.incr(json!(["x"]), json!(9));
    assert_eq!(code(&bad), Some(-32602), "{bad}");
    assert_eq!(on_b.incr(json!([1]), json!(9))["result"], 6);
    assert_eq!(on_a.incr(json!([1]), json!(9))["result"], 6);
    assert_eq!((on_a.counter(), on_b.counter()), (7, 6));

    // What is in Redis: one key per stored call (7 and "k\"1" for app, 7 for other,
    // 9 for app), none for the refusal.
    assert_eq!(redis.command("DBSIZE"), ":4");
}

#[test]
fn down_fails_closed_and_recovery_needs_no_restart() {
    let mut redis = RedisServer::start();
    redis.kill();
    // Built while Redis is down: connecting is lazy.
    let engine = instance(&redis.url(), false);
    let mut c = Caller::new(&engine, "t");

    let v = c.incr(json!([1]), json!(1));
    assert_eq!(code(&v), Some(-32000), "{v}");
    assert_eq!(v["error"]["data"]["reason"], "dedup_unavailable", "{v}");
    assert_eq!(v["id"], 1);
    assert_eq!(c.counter(), 0, "refused calls do not run");

    redis.restart();
    assert_eq!(c.incr(json!([1]), json!(1))["result"], 1);
    assert_eq!(c.incr(json!([1]), json!(1))["result"], 1, "replayed");

    // Down again: refused, whatever the key.
    redis.kill();
    for id in [1, 2] {
        let v = c.incr(json!([1]), json!(id));
        assert_eq!(code(&v), Some(-32000), "{v}");
    }
    assert_eq!(c.counter(), 1);

    // Back (empty: it keeps nothing on disk), then restarted under pooled connections:
    // the dead ones are replaced, no call fails.
    redis.restart();
    assert_eq!(c.incr(json!([1]), json!(2))["result"], 2);
    redis.restart();
    assert_eq!(c.incr(json!([1]), json!(3))["result"], 3);
    assert_eq!(c.incr(json!([1]), json!(3))["result"], 3, "replayed");
    assert_eq!(c.counter(), 3);
}

#[test]
fn down_fails_open_when_asked() {
    let mut redis = RedisServer::start();
    let engine = instance(&redis.url(), true);
    let mut c = Caller::new(&engine, "t");
    assert_eq!(c.incr(json!([1]), json!(1))["result"], 1);
    assert_eq!(c.incr(json!([1]), json!(1))["result"], 1, "replayed");
    redis.kill();
    // Run without de-duplication: the retry adds again.
    assert_eq!(c.incr(json!([1]), json!(2))["result"], 2);
    assert_eq!(c.incr(json!([1]), json!(2))["result"], 3);
    redis.restart();
    assert_eq!(c.incr(json!([1]), json!(3))["result"], 4);
    assert_eq!(c.incr(json!([1]), json!(3))["result"], 4, "replayed");
}

/// A newline-delimited TCP connection, with timeouts so a hang fails the test.
/// The demo methods plus two de-duplicated methods that take [`RUN`], counting their
/// runs: `slow_incr` (blocking, on the pool) and `later_incr` (deferred, answered from
/// a thread of its own, which then stores the answer in Redis).
fn slow_engine(url: &str, runs: &Arc<AtomicUsize>, finished: &Arc<AtomicUsize>) -> Engine {
    let mut b = demo::builder();
    let (r, f) = (Arc::clone(runs), Arc::clone(finished));
    b.blocking_method(
        "slow_incr",
        move |_p: Params<'_>| -> Result<usize, RpcError> {
            let n = r.fetch_add(1, Ordering::SeqCst) + 1;
            std::thread::sleep(RUN);
            f.fetch_add(1, Ordering::SeqCst);
            Ok(n)
        },
    )
    .unwrap()
    .dedup("slow_incr")
    .unwrap();
    let (r, f) = (Arc::clone(runs), Arc::clone(finished));
    b.deferred_method("later_incr", move |_ctx, _p, responder| {
        let n = r.fetch_add(1, Ordering::SeqCst) + 1;
        let f = Arc::clone(&f);
        std::thread::spawn(move || {
            std::thread::sleep(RUN);
            f.fetch_add(1, Ordering::SeqCst);
            responder.respond(Ok::<usize, RpcError>(n));
        });
    })
    .unwrap()
    .dedup("later_incr")
    .unwrap();
    Engine::new(
        b.freeze(),
        Config::default().request_timeout(Some(Duration::from_millis(100))),
    )
    .with_guard(guard())
    .with_dedup(Dedup::redis(url, TTL, false).unwrap())
}

/// How long `slow_incr` and `later_incr` take; their deadline is 100 ms.
const RUN: Duration = Duration::from_millis(800);

/// Over TCP: `method` times out (-32001), a retry while it runs is told to come back
/// (-32042), a retry after it finished gets its real result; it ran once.
fn timed_out_then_replayed(method: &str) {
    let redis = RedisServer::start();
    let (runs, finished) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let engine = slow_engine(&redis.url(), &runs, &finished);
    // Workers enough for the retry to be claimed while the first call still runs.
    let served = Served::start(engine, ServerConfig::default().workers(4));
    let mut tcp = Line::tcp(served.tcp);
    let auth =
        tcp.call(&json!({"jsonrpc":"2.0","method":"rpc.auth","params":{"token":"t"},"id":0}));
    assert!(auth.get("result").is_some(), "{auth}");

    let call = json!({"jsonrpc":"2.0","method":method,"params":[],"id":1});
    let t0 = Instant::now();
    let first = tcp.call(&call);
    assert_eq!(code(&first), Some(-32001), "{first}");

    let retry = tcp.call(&call);
    assert_eq!(code(&retry), Some(-32042), "{retry}");
    assert_eq!(retry["error"]["data"]["reason"], "in_progress", "{retry}");
    assert_eq!(retry["id"], 1);
    assert!(
        t0.elapsed() < RUN && finished.load(Ordering::SeqCst) == 0,
        "the first call was still running"
    );

    // Once the handler is done (and its answer stored, just after), a retry on another
    // connection gets the real result.
    let mut again = Line::tcp(served.tcp);
    again.call(&json!({"jsonrpc":"2.0","method":"rpc.auth","params":{"token":"t"},"id":0}));
    let deadline = Instant::now() + Duration::from_secs(5);
    let replay = loop {
        if finished.load(Ordering::SeqCst) == 1 {
            let v = again.call(&call);
            if code(&v) != Some(-32042) {
                break v;
            }
        }
        assert!(Instant::now() < deadline, "still in progress after 5 s");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(replay, json!({"jsonrpc":"2.0","id":1,"result":1}));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
    served.stop();
}

#[test]
fn a_pool_call_past_its_deadline_is_answered_by_its_real_outcome() {
    timed_out_then_replayed("slow_incr");
}

#[test]
fn a_deferred_call_past_its_deadline_is_answered_by_its_real_outcome() {
    timed_out_then_replayed("later_incr");
}

/// A call that outlives its claim's marker (the TTL) does not, when it finishes, take
/// over the claim of the retry that ran after the marker expired: its finish only
/// touches its own claim, so a retry meanwhile is told the second run is in progress
/// (it used to be replayed the first run's answer, and the second run's was dropped).
#[test]
fn a_call_outliving_its_marker_leaves_the_next_claim_alone() {
    const LONG: Duration = Duration::from_millis(3000);
    let redis = RedisServer::start();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut b = demo::builder();
    let r = Arc::clone(&runs);
    b.blocking_method(
        "long_incr",
        move |_p: Params<'_>| -> Result<usize, RpcError> {
            let n = r.fetch_add(1, Ordering::SeqCst) + 1;
            std::thread::sleep(LONG);
            Ok(n)
        },
    )
    .unwrap()
    .dedup("long_incr")
    .unwrap();
    let engine = Engine::new(b.freeze(), Config::default())
        .with_guard(guard())
        .with_dedup(Dedup::redis(&redis.url(), Duration::from_secs(2), false).unwrap());
    let call = json!({"jsonrpc":"2.0","method":"long_incr","params":[],"id":7});
    std::thread::scope(|s| {
        // A runs from 0 to 3 s; its marker expires at 2 s.
        let a = s.spawn(|| Caller::new(&engine, "t").call(call.clone()));
        std::thread::sleep(Duration::from_millis(2300));
        // B, a retry, claims anew at 2.3 s (its marker lasts to 4.3 s) and runs to 5.3 s.
        let b = s.spawn(|| Caller::new(&engine, "t").call(call.clone()));
        assert_eq!(a.join().unwrap()["result"], 1);
        // Between A's finish and B's: B's claim holds.
        let c = Caller::new(&engine, "t").call(call.clone());
        assert_eq!(code(&c), Some(-32042), "{c}");
        assert_eq!(b.join().unwrap()["result"], 2);
    });
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// An engine whose de-duplicated `gated_incr` (params `[GATE]`, 0 or 1) counts its runs
/// in `runs`, then holds until `gates[GATE]` opens; Redis at `url`.
fn gated_engine(url: &str, runs: &Arc<AtomicUsize>, gates: &Arc<[AtomicBool; 2]>) -> Engine {
    let mut b = demo::builder();
    let (r, g) = (Arc::clone(runs), Arc::clone(gates));
    b.blocking_method(
        "gated_incr",
        move |p: Params<'_>| -> Result<usize, RpcError> {
            let (gate,): (usize,) = p.parse()?;
            let n = r.fetch_add(1, Ordering::SeqCst) + 1;
            while !g[gate % 2].load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(n)
        },
    )
    .unwrap()
    .dedup("gated_incr")
    .unwrap();
    Engine::new(b.freeze(), Config::default())
        .with_guard(guard())
        .with_dedup(Dedup::redis(url, TTL, false).unwrap())
}

/// What the tests of answers Redis misses share: a Redis server, a link to it that can
/// be cut, and the run counter and gates (both shut) of their `gated_engine`s.
struct Gated {
    redis: RedisServer,
    link: Link,
    runs: Arc<AtomicUsize>,
    gates: Arc<[AtomicBool; 2]>,
}

impl Gated {
    fn new() -> Self {
        let redis = RedisServer::start();
        let link = Link::to(&redis);
        Self {
            redis,
            link,
            runs: Arc::new(AtomicUsize::new(0)),
            gates: Arc::new([AtomicBool::new(false), AtomicBool::new(false)]),
        }
    }
}

/// A `gated_incr` call held by gate `gate`, with id `id`.
fn gated(gate: usize, id: u64) -> Value {
    json!({"jsonrpc":"2.0","method":"gated_incr","params":[gate],"id":id})
}

/// Waits (at most 10 s) until `what` holds.
fn wait_for(what: &dyn Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !what() {
        assert!(Instant::now() < deadline, "timed out");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `call` retried by `c` until it is neither refused for Redis (-32000) nor in progress
/// (-32042): its stored answer, within 10 s.
fn once_stored(c: &mut Caller<'_>, call: &Value) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = c.call(call.clone());
        if code(&v) != Some(-32042) && code(&v) != Some(-32000) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "not stored 10 s after Redis came back: {v}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Redis unreachable when a call ends (the link to it cut, its data kept): the answer
/// is stored once it is reachable again, and a retry then gets it. (Before, the
/// claim's marker stayed until the TTL: retries were told -32042 for ten minutes.)
#[test]
fn an_answer_redis_missed_is_stored_when_it_is_back() {
    // (The server is only reached through the link, but lives to the end.)
    let Gated {
        redis: _redis,
        link,
        runs,
        gates,
    } = Gated::new();
    let engine = gated_engine(&link.url(), &runs, &gates);
    let call = gated(0, 7);
    std::thread::scope(|s| {
        let first = s.spawn(|| Caller::new(&engine, "t").call(call.clone()));
        wait_for(&|| runs.load(Ordering::SeqCst) == 1 || first.is_finished());
        // Claimed, running: now Redis cannot be reached, and the call ends.
        link.cut();
        gates[0].store(true, Ordering::SeqCst);
        assert_eq!(first.join().unwrap()["result"], 1, "answered all the same");
    });
    let mut retry = Caller::new(&engine, "t");
    let v = retry.call(call.clone());
    assert_eq!(code(&v), Some(-32000), "unreachable: {v}");
    std::thread::sleep(Duration::from_millis(300));
    link.restore();
    assert_eq!(
        once_stored(&mut retry, &call),
        json!({"jsonrpc":"2.0","id":7,"result":1})
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
}

/// The answer to `call` (a `gated_incr`, its gate shut) posted to `served` by identity
/// `app`, with `link` cut while it runs: an answer Redis misses.
fn missed_over_http(
    served: &Served,
    link: &Link,
    runs: &AtomicUsize,
    gates: &[AtomicBool; 2],
    call: &Value,
) -> Value {
    let gate = call["params"][0].as_u64().expect("a gated call") as usize % 2;
    let before = runs.load(Ordering::SeqCst);
    std::thread::scope(|s| {
        let first = s.spawn(|| post(served.http, &[("Authorization", "Bearer t")], call));
        wait_for(&|| runs.load(Ordering::SeqCst) > before || first.is_finished());
        link.cut();
        gates[gate].store(true, Ordering::SeqCst);
        first.join().unwrap()
    })
}

/// A `gated_engine` reaching Redis through `link`, served (the engine also held here, as
/// a SIGHUP reload thread holds it), whose first call, `call`, ended with the link cut.
fn served_missed(
    link: &Link,
    runs: &Arc<AtomicUsize>,
    gates: &Arc<[AtomicBool; 2]>,
    call: &Value,
) -> (Arc<Engine>, Served) {
    let engine = Arc::new(gated_engine(&link.url(), runs, gates));
    let served = Served::start(Arc::clone(&engine), ServerConfig::default());
    assert_eq!(
        missed_over_http(&served, link, runs, gates, call)["result"],
        1
    );
    (engine, served)
}

/// When the shutdown tests below bring Redis back and stop: midway between two of the
/// retry thread's tries, so that only the shutdown's own flush can store the answer.
const SHUTDOWN_AT: Duration = Duration::from_millis(2_350);

/// An engine dropped (a server's graceful shutdown) while an answer waits to be stored,
/// Redis reachable again: the drop makes the write before it returns, so another
/// instance's retry gets the answer. (Before, the retry thread stopped at the drop and
/// the write was lost: the retry was told -32042 until the TTL.)
#[test]
fn an_answer_waiting_at_shutdown_is_stored_by_the_drop() {
    let Gated {
        redis,
        link,
        runs,
        gates,
    } = Gated::new();
    let call = gated(0, 9);
    {
        let engine = gated_engine(&link.url(), &runs, &gates);
        std::thread::scope(|s| {
            let first = s.spawn(|| Caller::new(&engine, "t").call(call.clone()));
            wait_for(&|| runs.load(Ordering::SeqCst) == 1 || first.is_finished());
            link.cut();
            gates[0].store(true, Ordering::SeqCst);
            assert_eq!(first.join().unwrap()["result"], 1);
        });
        // The retry thread tries at about 0, 50, 150, 350, 750, 1,550 and 3,150 ms
        // after the failure (its backoff doubling from 50 ms): the link comes back and
        // the engine is dropped midway between the last two, ~750 ms from each.
        std::thread::sleep(SHUTDOWN_AT);
        link.restore();
    }
    // Another instance, straight to Redis: the stored answer, the handler not run again.
    let other = gated_engine(&redis.url(), &runs, &gates);
    let v = Caller::new(&other, "t").call(call.clone());
    assert_eq!(v, json!({"jsonrpc":"2.0","id":9,"result":1}), "{v}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
}

/// The same through a server's graceful shutdown, with the engine still held elsewhere
/// (its drop would come too late): `Server::run` makes the waiting write before it
/// returns.
#[test]
fn a_server_shutting_down_stores_the_answer_waiting() {
    let Gated {
        redis,
        link,
        runs,
        gates,
    } = Gated::new();
    let call = gated(0, 11);
    let (engine, served) = served_missed(&link, &runs, &gates, &call);
    // (As above: between two of the retry thread's tries.)
    std::thread::sleep(SHUTDOWN_AT);
    link.restore();
    served.stop();
    let other = gated_engine(&redis.url(), &runs, &gates);
    let v = Caller::new(&other, "t").call(call.clone());
    assert_eq!(v, json!({"jsonrpc":"2.0","id":11,"result":1}), "{v}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");

    // The engine served again: its store still retries what Redis misses.
    let served = Served::start(Arc::clone(&engine), ServerConfig::default());
    let again = gated(1, 12);
    assert_eq!(
        missed_over_http(&served, &link, &runs, &gates, &again)["result"],
        2
    );
    std::thread::sleep(Duration::from_millis(300));
    link.restore();
    assert_eq!(
        once_stored(&mut Caller::new(&other, "t"), &again),
        json!({"jsonrpc":"2.0","id":12,"result":2})
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2, "each handler ran once");
    served.stop();
    drop(engine);
}

/// A server shut down while Redis is still unreachable: its flush gives up after two
/// seconds, but the answer is not forgotten: once Redis is back, it is stored (the
/// engine still held, as by a SIGHUP reload thread), with no other call failing to
/// start the retries again.
#[test]
fn an_answer_the_shutdown_could_not_store_is_stored_later() {
    let Gated {
        redis,
        link,
        runs,
        gates,
    } = Gated::new();
    let call = gated(0, 13);
    let (engine, served) = served_missed(&link, &runs, &gates, &call);
    served.stop();
    link.restore();
    let other = gated_engine(&redis.url(), &runs, &gates);
    assert_eq!(
        once_stored(&mut Caller::new(&other, "t"), &call),
        json!({"jsonrpc":"2.0","id":13,"result":1})
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
    drop(engine);
}

/// A write Redis refuses (here: the claim's key turned into a hash behind the store's
/// back, so its compare-and-set fails with WRONGTYPE) does not hold up the answers
/// waiting behind it: it goes to the back, and they are stored once Redis is back.
#[test]
fn an_answer_redis_refuses_does_not_hold_up_the_others() {
    let Gated {
        redis,
        link,
        runs,
        gates,
    } = Gated::new();
    let engine = gated_engine(&link.url(), &runs, &gates);
    std::thread::scope(|s| {
        let a = s.spawn(|| Caller::new(&engine, "t").call(gated(0, 0)));
        wait_for(&|| runs.load(Ordering::SeqCst) == 1);
        let key_a = redis.keys("ringrpc:dedup:*").pop().expect("A's marker");
        let b = s.spawn(|| Caller::new(&engine, "t").call(gated(1, 1)));
        wait_for(&|| runs.load(Ordering::SeqCst) == 2);
        // Both answers miss Redis, A's first.
        link.cut();
        gates[0].store(true, Ordering::SeqCst);
        assert_eq!(a.join().unwrap()["result"], 1);
        gates[1].store(true, Ordering::SeqCst);
        assert_eq!(b.join().unwrap()["result"], 2);
        // A's key is no longer a string: its answer can never be stored.
        assert_eq!(redis.command(&format!("DEL {key_a}")), ":1");
        assert_eq!(redis.command(&format!("HSET {key_a} f v")), ":1");
    });
    link.restore();
    let mut retry = Caller::new(&engine, "t");
    assert_eq!(
        once_stored(&mut retry, &gated(1, 1)),
        json!({"jsonrpc":"2.0","id":1,"result":2})
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// One HTTP/1.1 POST; the answer's body (a 200 is required).
fn post(addr: SocketAddr, headers: &[(&str, &str)], body: &Value) -> Value {
    let a = util::http::post(addr, headers, body);
    assert_eq!(a.status, 200, "{}", a.body);
    a.body
}

#[test]
fn http_idempotency_keys_across_two_servers() {
    let redis = RedisServer::start();
    // Anonymous callers: de-duplicated by their Idempotency-Key only.
    let serve = || {
        let engine = demo::engine(Config::default())
            .with_dedup(Dedup::redis(&redis.url(), TTL, false).unwrap());
        Served::start(engine, ServerConfig::default())
    };
    let (a, b) = (serve(), serve());
    let req = |n: i64, id: i64| json!({"jsonrpc":"2.0","method":"incr","params":[n],"id":id});
    let counter = json!({"jsonrpc":"2.0","method":"get_counter","id":0});

    let key = [("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")];
    assert_eq!(post(a.http, &key, &req(3, 1))["result"], 3);
    // The retry went to the other server, numbered anew by the client.
    assert_eq!(
        post(b.http, &key, &req(3, 2)),
        json!({"jsonrpc":"2.0","id":2,"result":3})
    );
    assert_eq!(post(b.http, &[], &counter)["result"], 0);
    let v = post(b.http, &key, &req(4, 1));
    assert_eq!(code(&v), Some(-32043), "{v}");

    // A batch's elements stay apart by their position. They run on the pool (claims
    // talk to Redis), so in any order, answered in any order.
    let results = |v: &Value, ids: [i64; 2]| -> [Value; 2] {
        let arr = v
            .as_array()
            .unwrap_or_else(|| panic!("not a batch answer: {v}"));
        assert_eq!(arr.len(), 2, "{v}");
        ids.map(|id| {
            let a = arr.iter().find(|a| a["id"] == id);
            a.unwrap_or_else(|| panic!("no answer for id {id}: {v}"))["result"].clone()
        })
    };
    let batch_key = [("Idempotency-Key", "batch-1")];
    let first = results(
        &post(a.http, &batch_key, &json!([req(1, 1), req(1, 2)])),
        [1, 2],
    );
    let mut sorted = first.clone();
    sorted.sort_by_key(|r| r.as_i64());
    assert_eq!(sorted, [json!(4), json!(5)], "{first:?}");
    // Renumbered, on the other server: each position gets its own first answer.
    let again = results(
        &post(b.http, &batch_key, &json!([req(1, 3), req(1, 4)])),
        [3, 4],
    );
    assert_eq!(again, first);
    assert_eq!(post(b.http, &[], &counter)["result"], 0);
    assert_eq!(post(a.http, &[], &counter)["result"], 5);
    a.stop();
    b.stop();
}
