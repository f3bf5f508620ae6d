//! De-duplication of retried calls, in memory, over real sockets: replays with the new
//! id, fingerprint mismatches, calls still running (inline, pool and deferred methods,
//! past their deadline), `Idempotency-Key` over HTTP, and what is never stored.

mod util;

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringrpc::dedup::{Dedup, DEFAULT_TTL};
use ringrpc::guard::Guard;
use ringrpc::{demo, Config, Engine, Params, RpcError, ServerConfig};
use serde_json::{json, Value};
use util::line::Line;
use util::server::Served;

const KEYS: &str = "[[key]]\nname = \"app\"\ntoken = \"t\"\nallow = [\"*\"]\n\
                    [[key]]\nname = \"other\"\ntoken = \"o\"\nallow = [\"*\"]\n";

/// How long `slow_incr` and `later_incr` take.
const HANDLER_MS: u64 = 800;

/// Runs of the test methods below.
static SLOW_RUNS: AtomicUsize = AtomicUsize::new(0);
static LATER_RUNS: AtomicUsize = AtomicUsize::new(0);

/// The demo methods plus `slow_incr` (blocking, 800 ms) and `later_incr` (deferred,
/// answered after 800 ms from a thread), both de-duplicated. Far longer than their
/// 100 ms deadline, so that even a loaded machine sends the retry while they run.
fn engine(timeout_ms: u64) -> Engine {
    let mut b = demo::builder();
    b.blocking_method("slow_incr", |p: Params<'_>| -> Result<usize, RpcError> {
        let [n]: [usize; 1] = p.parse()?;
        std::thread::sleep(Duration::from_millis(HANDLER_MS));
        Ok(SLOW_RUNS.fetch_add(1, Ordering::SeqCst) + n)
    })
    .unwrap()
    .dedup("slow_incr")
    .unwrap()
    .deferred_method("later_incr", |_ctx, p, responder| {
        let n: Result<[usize; 1], RpcError> = p.parse();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(HANDLER_MS));
            responder.respond(n.map(|[n]| LATER_RUNS.fetch_add(1, Ordering::SeqCst) + n));
        });
    })
    .unwrap()
    .dedup("later_incr")
    .unwrap();
    Engine::new(
        b.freeze(),
        Config::default().request_timeout(Some(Duration::from_millis(timeout_ms))),
    )
    .with_guard(Guard::new().with_keys_toml(KEYS).unwrap())
    .with_dedup(Dedup::memory(1 << 20, DEFAULT_TTL))
}

/// A TCP connection authenticated with `token`.
fn authed(addr: SocketAddr, token: &str) -> Line<TcpStream> {
    let mut l = Line::tcp(addr);
    let v = l.call(
        &json!({"jsonrpc": "2.0", "method": "rpc.auth", "params": {"token": token}, "id": 0}),
    );
    assert!(v["result"]["identity"].is_string(), "{v}");
    l
}

fn req(method: &str, params: Value, id: Value) -> Value {
    json!({"jsonrpc": "2.0", "method": method, "params": params, "id": id})
}

fn code(v: &Value) -> i64 {
    v["error"]["code"].as_i64().unwrap_or(0)
}

#[test]
fn a_retry_replays_the_first_answer_with_its_own_id() {
    let s = Served::start(engine(5_000), ServerConfig::default());
    let mut a = authed(s.tcp, "t");
    assert_eq!(a.call(&req("incr", json!([5]), json!(7)))["result"], 5);
    assert_eq!(a.call(&req("incr", json!([5]), json!(7)))["result"], 5);
    // A retry on a new connection (the first one broke) is the same call.
    let mut b = authed(s.tcp, "t");
    let v = b.call(&req("incr", json!([5]), json!(7)));
    assert_eq!((&v["id"], &v["result"]), (&json!(7), &json!(5)));
    assert_eq!(
        b.call(&req("get_counter", json!([]), json!(8)))["result"],
        5
    );
    // Other params under the same id: a mistake, refused, nothing runs.
    let v = b.call(&req("incr", json!([6]), json!(7)));
    assert_eq!(code(&v), -32043, "{v}");
    assert_eq!(v["error"]["data"]["reason"], "fingerprint_mismatch");
    assert_eq!(
        b.call(&req("get_counter", json!([]), json!(9)))["result"],
        5
    );
    // Another identity's id 7 is another call; ids of every kind are keys.
    let mut c = authed(s.tcp, "o");
    assert_eq!(c.call(&req("incr", json!([1]), json!(7)))["result"], 6);
    assert_eq!(c.call(&req("incr", json!([1]), json!("7")))["result"], 7);
    assert_eq!(c.call(&req("incr", json!([1]), json!("7")))["result"], 7);
    // Methods not marked run every time.
    assert_eq!(
        c.call(&req("get_counter", json!([]), json!(1)))["result"],
        7
    );
    s.stop();
}

#[test]
fn refused_calls_are_not_stored() {
    let s = Served::start(engine(5_000), ServerConfig::default());
    let mut a = authed(s.tcp, "t");
    assert_eq!(code(&a.call(&req("incr", json!(["x"]), json!(1)))), -32602);
    // The key was freed: the corrected call (other params) is not a mismatch.
    assert_eq!(a.call(&req("incr", json!([2]), json!(1)))["result"], 2);
    // Overflow is -32602 too: not stored, the counter unchanged.
    assert_eq!(
        code(&a.call(&req("incr", json!([i64::MAX]), json!(2)))),
        -32602
    );
    assert_eq!(a.call(&req("incr", json!([1]), json!(2)))["result"], 3);
    s.stop();
}

#[test]
fn a_batch_with_one_id_twice_runs_it_once() {
    let s = Served::start(engine(5_000), ServerConfig::default());
    let mut a = authed(s.tcp, "t");
    let v = a.call(&json!([
        req("incr", json!([1]), json!(1)),
        req("incr", json!([1]), json!(1)),
        req("incr", json!([1]), json!(2)),
        req("get_counter", json!([]), json!(3)),
    ]));
    let results: Vec<&Value> = v.as_array().unwrap().iter().map(|a| &a["result"]).collect();
    assert_eq!(results, [&json!(1), &json!(1), &json!(2), &json!(2)], "{v}");
    s.stop();
}

/// Sends `req` and waits for its answer, then sends it again at once while the first
/// is still running, and once more after it finished.
fn timed_out_then_replayed(method: &str, runs: &AtomicUsize) {
    let s = Served::start(engine(100), ServerConfig::default());
    let before = runs.load(Ordering::SeqCst);
    let mut a = authed(s.tcp, "t");
    // The handler takes 800 ms; the deadline is 100 ms.
    let v = a.call(&req(method, json!([10]), json!(1)));
    assert_eq!(code(&v), -32001, "{v}");
    // Still running: the retry is told to come back, and nothing runs again.
    let v = a.call(&req(method, json!([10]), json!(1)));
    assert_eq!(code(&v), -32042, "{v}");
    assert_eq!(v["error"]["data"]["retryAfterMs"], 100);
    // Once it finished, a retry (here on another connection) gets its real outcome,
    // with the retry's id. Retried as a client would, while told it is in progress
    // (a loaded machine finishes the handler late).
    std::thread::sleep(Duration::from_millis(HANDLER_MS));
    let mut b = authed(s.tcp, "t");
    let deadline = Instant::now() + Duration::from_secs(10);
    let v = loop {
        let v = b.call(&req(method, json!([10]), json!(1)));
        if code(&v) != -32042 {
            break v;
        }
        assert!(Instant::now() < deadline, "still in progress after 10 s");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(v["id"], 1);
    assert!(v["result"].as_u64().is_some_and(|r| r >= 10), "{v}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        before + 1,
        "the handler ran once"
    );
    s.stop();
}

#[test]
fn a_pool_call_past_its_deadline_stays_in_progress_until_it_finishes() {
    timed_out_then_replayed("slow_incr", &SLOW_RUNS);
}

#[test]
fn a_deferred_call_past_its_deadline_stays_in_progress_until_it_answers() {
    timed_out_then_replayed("later_incr", &LATER_RUNS);
}

/// One HTTP/1.1 POST: (status, body).
fn post(addr: SocketAddr, headers: &[(&str, &str)], body: &Value) -> (u16, Value) {
    let a = util::http::post(addr, headers, body);
    (a.status, a.body)
}

/// A de-duplicated call in a batch whose answers pass `max_response_bytes` before it:
/// the batch gets -32002 in its place, but the call ran, and a retry (alone) gets its
/// real answer, not the -32002 (which was stored in its place).
#[test]
fn a_batch_elements_answer_cut_for_size_is_not_what_is_stored() {
    let engine = demo::engine(Config::default().max_response_bytes(400))
        .with_guard(Guard::new().with_keys_toml(KEYS).unwrap())
        .with_dedup(Dedup::memory(1 << 20, DEFAULT_TTL));
    let s = Served::start(engine, ServerConfig::default());
    let mut a = authed(s.tcp, "t");
    let big = "x".repeat(340);
    let batch = json!([
        req("echo", json!([big]), json!(1)),
        req("incr", json!([2]), json!(7))
    ]);
    let v = a.call(&batch);
    assert_eq!(v[0]["result"], json!([big]), "{v}");
    assert_eq!(code(&v[1]), -32002, "{v}");
    let v = a.call(&req("incr", json!([2]), json!(7)));
    assert_eq!((&v["id"], &v["result"]), (&json!(7), &json!(2)), "{v}");
    assert_eq!(
        a.call(&req("get_counter", json!([]), json!(8)))["result"],
        2
    );
    // A replay in such a batch is cut as any answer is.
    let v = a.call(&batch);
    assert_eq!(code(&v[1]), -32002, "{v}");
    assert_eq!(
        a.call(&req("get_counter", json!([]), json!(9)))["result"],
        2
    );
    s.stop();
}

#[test]
fn http_idempotency_keys() {
    // No keys: anonymous callers, de-duplicated only with an Idempotency-Key.
    let engine = demo::engine(Config::default()).with_dedup(Dedup::memory(1 << 20, DEFAULT_TTL));
    let engine = Arc::new(engine);
    let s = Served::start(Arc::clone(&engine), ServerConfig::default());
    let incr = req("incr", json!([3]), json!(1));
    let key = [("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")];
    assert_eq!(post(s.http, &key, &incr).1["result"], 3);
    let (status, v) = post(s.http, &key, &req("incr", json!([3]), json!(2)));
    assert_eq!(
        (status, &v["id"], &v["result"]),
        (200, &json!(2), &json!(3)),
        "{v}"
    );
    // Without the header an anonymous call is not de-duplicated (ids repeat across
    // clients).
    assert_eq!(post(s.http, &[], &incr).1["result"], 6);
    assert_eq!(post(s.http, &[], &incr).1["result"], 9);
    // Nor with an empty one, which two anonymous clients would share.
    let empty = [("Idempotency-Key", "")];
    assert_eq!(post(s.http, &empty, &incr).1["result"], 12);
    assert_eq!(post(s.http, &empty, &incr).1["result"], 15);
    // The key with other params: -32043.
    assert_eq!(
        code(&post(s.http, &key, &req("incr", json!([4]), json!(1))).1),
        -32043
    );
    // Elements of one batch under one key stay apart by their position; their ids may
    // change between attempts.
    let other = [("Idempotency-Key", "batch-1")];
    let batch = json!([
        req("incr", json!([1]), json!(1)),
        req("incr", json!([1]), json!(2))
    ]);
    let (_, v) = post(s.http, &other, &batch);
    let first: Vec<&Value> = v.as_array().unwrap().iter().map(|a| &a["result"]).collect();
    assert_eq!(first, [&json!(16), &json!(17)]);
    let renumbered = json!([
        req("incr", json!([1]), json!(3)),
        req("incr", json!([1]), json!(4))
    ]);
    let (_, v) = post(s.http, &other, &renumbered);
    let again: Vec<(&Value, &Value)> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (&a["id"], &a["result"]))
        .collect();
    assert_eq!(again, [(&json!(3), &json!(16)), (&json!(4), &json!(17))]);
    s.stop();
}
