//! Deadlines that travel with the call, over real sockets: a caller's budget
//! (`RPC-Timeout-Ms`, `params._meta.timeoutMs`) that ran out is not run and is answered
//! -32001 `deadline_exceeded`; a budget shorter than `request_timeout` times pool and
//! deferred calls out at the budget; contexts see the shorter deadline; the ringrpc
//! client sends what is left of each call, shrinking over retries.

mod util;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ringrpc::client::{Client, Error, Options, Retry};
use ringrpc::{demo, Config, Context, Engine, Hooks, Params, RpcError, ServerConfig};
use serde_json::{json, Value};
use util::http::post;
use util::line::Line;
use util::server::Served;

/// The server's own deadline: far longer than every budget sent below, so a call timed
/// out within seconds was timed out by its budget.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs of `count`, per test engine.
#[derive(Clone, Default)]
struct Runs(Arc<AtomicUsize>);

/// The deadlines the before hook saw in `sleep` calls' contexts, as ms left.
#[derive(Clone, Default)]
struct SeenDeadlines(Arc<Mutex<Vec<Option<u64>>>>);

impl Hooks for SeenDeadlines {
    fn before(&self, ctx: &Context<'_>, _params: &Params<'_>) -> Result<(), RpcError> {
        if ctx.method() == "sleep" {
            self.0.lock().unwrap().push(left_ms(ctx));
        }
        Ok(())
    }
}

/// What is left until the context's deadline, in ms (`None`: no deadline).
fn left_ms(ctx: &Context<'_>) -> Option<u64> {
    ctx.deadline()
        .map(|d| d.saturating_duration_since(Instant::now()).as_millis() as u64)
}

/// The demo methods plus `count` (plain, counts its runs), `left` (context-aware,
/// answers the ms left until its deadline, or null) and `left_later` (deferred, the
/// same from its context).
fn builder(runs: &Runs) -> ringrpc::RegistryBuilder {
    let mut b = demo::builder();
    let r = runs.clone();
    b.method("count", move |_p: Params<'_>| -> Result<usize, RpcError> {
        Ok(r.0.fetch_add(1, Ordering::SeqCst) + 1)
    })
    .unwrap()
    .method_with_ctx("left", |ctx, _p| Ok(left_ms(ctx)))
    .unwrap()
    .deferred_method("left_later", |ctx, _p, responder| {
        responder.respond(Ok::<_, RpcError>(left_ms(ctx)));
    })
    .unwrap();
    b
}

fn engine(runs: &Runs) -> Engine {
    Engine::new(
        builder(runs).freeze(),
        Config::default().request_timeout(Some(REQUEST_TIMEOUT)),
    )
}

fn req(method: &str, params: Value, id: u64) -> Value {
    json!({"jsonrpc": "2.0", "method": method, "params": params, "id": id})
}

/// Checks `v` is the refusal of a call whose budget of `ms` had run out.
fn assert_expired(v: &Value, ms: u64) {
    assert_eq!(v["error"]["code"], -32001, "{v}");
    assert_eq!(
        v["error"]["data"],
        json!({"reason": "deadline_exceeded"}),
        "{v}"
    );
    let message = v["error"]["message"].as_str().unwrap();
    assert_eq!(
        message,
        format!("Deadline exceeded: the caller's budget of {ms} ms ran out before the call ran")
    );
}

/// The count of `ringrpc_deadline_exceeded_total` in `engine`'s metrics.
fn deadline_events(engine: &Engine) -> u64 {
    let text = engine.metrics().unwrap().render();
    text.lines()
        .find_map(|l| l.strip_prefix("ringrpc_deadline_exceeded_total "))
        .map_or(0, |n| n.trim().parse().unwrap())
}

#[test]
fn an_expired_budget_header_is_not_run_over_http() {
    let runs = Runs::default();
    let engine = Arc::new(engine(&runs));
    let s = Served::start(Arc::clone(&engine), ServerConfig::default());
    let counter = |id| post(s.http, &[], &req("get_counter", json!([]), id)).body["result"].clone();
    let before = counter(1);

    // `incr` (de-duplicated, so past the straight path) and `count` (plain).
    let zero = [("RPC-Timeout-Ms", "0")];
    let a = post(s.http, &zero, &req("incr", json!([5]), 2));
    assert_eq!(a.status, 200);
    assert_expired(&a.body, 0);
    assert_eq!(counter(3), before, "an expired `incr` ran");
    let a = post(s.http, &zero, &req("count", json!([]), 4));
    assert_expired(&a.body, 0);
    // Every element of a batch under the header is refused; a notification silently.
    let batch = json!([
        req("count", json!({}), 5),
        {"jsonrpc": "2.0", "method": "count"},
        req("sleep", json!({"ms": 5000}), 6),
    ]);
    let a = post(s.http, &zero, &batch);
    let answers = a.body.as_array().unwrap();
    assert_eq!(answers.len(), 2, "{}", a.body);
    for v in answers {
        assert_expired(v, 0);
    }
    assert_eq!(runs.0.load(Ordering::SeqCst), 0);

    // A budget left, or a value that is not a budget (ignored, not refused): runs.
    for value in ["60000", "-1", "1.5", "soon", "99999999999"] {
        let a = post(
            s.http,
            &[("RPC-Timeout-Ms", value)],
            &req("count", json!([]), 7),
        );
        assert!(a.body["result"].is_u64(), "{value}: {}", a.body);
    }
    assert_eq!(runs.0.load(Ordering::SeqCst), 5);
    let a = post(
        s.http,
        &[("RPC-Timeout-Ms", "60000")],
        &req("incr", json!([5]), 8),
    );
    assert!(a.body["result"].is_i64(), "{}", a.body);
    assert_ne!(counter(9), before);
    // Counted: two single calls and the batch's three calls.
    assert_eq!(deadline_events(&engine), 5);
    s.stop();
}

#[test]
fn an_expired_budget_in_meta_is_not_run_over_tcp_and_unix() {
    let runs = Runs::default();
    let engine = Arc::new(engine(&runs));
    let s = Served::start(Arc::clone(&engine), ServerConfig::default());
    let mut tcp = Line::tcp(s.tcp);
    let mut unix = Line::unix(&s.unix);
    let expired = json!({"_meta": {"timeoutMs": 0}});
    assert_expired(&tcp.call(&req("count", expired.clone(), 1)), 0);
    assert_expired(&unix.call(&req("count", expired.clone(), 2)), 0);
    // A blocking call is refused before it reaches the pool: at once, not after 5 s.
    let start = Instant::now();
    let v = tcp.call(&req(
        "sleep",
        json!({"ms": 5000, "_meta": {"timeoutMs": 0}}),
        3,
    ));
    assert_expired(&v, 0);
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "{:?}",
        start.elapsed()
    );
    // A notification with an expired budget does not run either.
    let note = json!({"jsonrpc": "2.0", "method": "count", "params": expired});
    let mut line = serde_json::to_vec(&note).unwrap();
    line.push(b'\n');
    let mut raw = TcpStream::connect(s.tcp).unwrap();
    raw.write_all(&line).unwrap();
    // ... answered in order on its connection, so this call comes after it.
    let v = json!({"jsonrpc": "2.0", "method": "ping", "id": 4});
    let mut line = serde_json::to_vec(&v).unwrap();
    line.push(b'\n');
    raw.write_all(&line).unwrap();
    let mut answer = String::new();
    BufReader::new(&raw).read_line(&mut answer).unwrap();
    assert!(answer.contains("pong"), "{answer}");
    assert_eq!(runs.0.load(Ordering::SeqCst), 0, "an expired call ran");

    // A budget left runs; so do budgets that are not ones, and array params (never
    // looked into).
    for params in [
        json!({"_meta": {"timeoutMs": 60000}}),
        json!({"_meta": {"timeoutMs": -1}}),
        json!({"_meta": {"timeoutMs": 0.0}}),
        json!({"_meta": {"timeoutMs": "0"}}),
        json!({"_meta": 0}),
        json!([{"_meta": {"timeoutMs": 0}}]),
    ] {
        let v = tcp.call(&req("count", params.clone(), 5));
        assert!(v["result"].is_u64(), "{params}: {v}");
    }
    assert_eq!(runs.0.load(Ordering::SeqCst), 6);
    assert_eq!(deadline_events(&engine), 4);
    s.stop();
}

#[test]
fn a_budget_shorter_than_request_timeout_times_out_pool_and_deferred_calls() {
    // Timed-out sleeps go on running on their workers: enough workers that the last
    // batch's calls do not wait for them.
    let settings = ServerConfig::default().workers(8);
    let s = Served::start(engine(&Runs::default()), settings);
    // Each would take 5 s; the budget is 300 ms; request_timeout is 30 s.
    let timed_out = |v: &Value, start: Instant| {
        assert_eq!(v["error"]["code"], -32001, "{v}");
        let took = start.elapsed();
        assert!(took < Duration::from_secs(4), "answered after {took:?}");
    };
    let start = Instant::now();
    let a = post(
        s.http,
        &[("RPC-Timeout-Ms", "300")],
        &req("sleep", json!({"ms": 5000}), 1),
    );
    timed_out(&a.body, start);
    let start = Instant::now();
    let a = post(
        s.http,
        &[("RPC-Timeout-Ms", "300")],
        &req("delay", json!([5000]), 2),
    );
    timed_out(&a.body, start);
    let mut tcp = Line::tcp(s.tcp);
    let start = Instant::now();
    let v = tcp.call(&req(
        "sleep",
        json!({"ms": 5000, "_meta": {"timeoutMs": 300}}),
        3,
    ));
    timed_out(&v, start);
    // In a batch, each element keeps its own deadline: the short one is answered at its
    // budget, the other when it is done.
    let start = Instant::now();
    let v = tcp.call(&json!([
        req("sleep", json!({"ms": 5000, "_meta": {"timeoutMs": 300}}), 4),
        req("sleep", json!({"ms": 1500}), 5),
    ]));
    let took = start.elapsed();
    let answers = v.as_array().unwrap();
    let by_id = |id| answers.iter().find(|a| a["id"] == id).unwrap();
    assert_eq!(by_id(4)["error"]["code"], -32001, "{v}");
    assert_eq!(by_id(5)["result"], Value::Null, "{v}");
    assert!(by_id(5).get("error").is_none(), "{v}");
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(4),
        "{took:?}"
    );
    s.stop();
}

#[test]
fn contexts_see_the_shorter_deadline() {
    let seen = SeenDeadlines::default();
    let engine = Engine::new(
        builder(&Runs::default()).freeze(),
        Config::default().request_timeout(Some(REQUEST_TIMEOUT)),
    )
    .with_hooks(seen.clone());
    let s = Served::start(engine, ServerConfig::default());
    let budget_ms = 2_000;
    let within = |v: &Value| {
        let left = v["result"].as_u64().unwrap_or_else(|| panic!("{v}"));
        assert!(
            left <= budget_ms && left > budget_ms / 2,
            "{left} ms left: {v}"
        );
    };
    let meta = json!({"_meta": {"timeoutMs": budget_ms}});
    let mut tcp = Line::tcp(s.tcp);
    // Inline: a deadline only when the caller sent a budget.
    within(&tcp.call(&req("left", meta.clone(), 1)));
    assert_eq!(tcp.call(&req("left", json!({}), 2))["result"], Value::Null);
    // Deferred: the budget, not request_timeout.
    within(&tcp.call(&req("left_later", meta.clone(), 3)));
    let v = tcp.call(&req("left_later", json!({}), 4));
    let left = v["result"].as_u64().unwrap();
    assert!(left > budget_ms * 5, "request_timeout's deadline: {v}");
    // Over HTTP, from the header.
    let header = [("RPC-Timeout-Ms", "2000")];
    within(&post(s.http, &header, &req("left", json!([]), 5)).body);
    within(&post(s.http, &header, &req("left_later", json!([]), 6)).body);
    // A pool call: its context (seen by the hooks where it is read) and its timer.
    let v = tcp.call(&req(
        "sleep",
        json!({"ms": 1, "_meta": {"timeoutMs": budget_ms}}),
        7,
    ));
    assert!(v.get("error").is_none(), "{v}");
    let _ = tcp.call(&req("sleep", json!({"ms": 1}), 8));
    let seen = seen.0.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    let left = seen[0].unwrap();
    assert!(left <= budget_ms && left > budget_ms / 2, "{seen:?}");
    assert!(seen[1].unwrap() > budget_ms * 5, "{seen:?}");
    s.stop();
}

// ---------------------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------------------

/// A hand-played server: every request is recorded (its budget: the `RPC-Timeout-Ms`
/// header over HTTP, `params._meta.timeoutMs` on lines); the first `busy` of each id
/// are answered `-32000 Server busy` (transient: the client retries), then a result.
/// Returns its address and the budgets seen, in order.
fn recording_peer(http: bool, busy: usize) -> (std::net::SocketAddr, Arc<Mutex<Vec<Seen>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    std::thread::spawn(move || {
        let mut tries = std::collections::HashMap::<String, usize>::new();
        for s in l.incoming() {
            let Ok(s) = s else { return };
            let mut r = BufReader::new(s);
            loop {
                let next = if http {
                    read_http(&mut r)
                } else {
                    read_line(&mut r)
                };
                let Some((header, body)) = next else { break };
                let answers: Vec<Value> = match &body {
                    Value::Array(items) => items
                        .iter()
                        .filter_map(|item| {
                            record.lock().unwrap().push(Seen::of(header, item));
                            answer(item, &mut tries, busy)
                        })
                        .collect(),
                    item => {
                        record.lock().unwrap().push(Seen::of(header, item));
                        answer(item, &mut tries, busy).into_iter().collect()
                    }
                };
                let text = match &body {
                    Value::Array(_) => serde_json::to_vec(&answers).unwrap(),
                    _ => answers
                        .first()
                        .map(|a| serde_json::to_vec(a).unwrap())
                        .unwrap_or_default(),
                };
                let s = r.get_mut();
                let wrote = if http {
                    let head = format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", text.len());
                    s.write_all(head.as_bytes())
                        .and_then(|()| s.write_all(&text))
                } else if text.is_empty() {
                    Ok(())
                } else {
                    s.write_all(&text).and_then(|()| s.write_all(b"\n"))
                };
                if wrote.is_err() {
                    break;
                }
            }
        }
    });
    (addr, seen)
}

/// One request as the peer saw it.
#[derive(Clone, Debug, PartialEq)]
struct Seen {
    method: String,
    /// `RPC-Timeout-Ms`, over HTTP.
    header: Option<u64>,
    /// `params._meta.timeoutMs`.
    meta: Option<u64>,
    /// The params, `_meta` left out.
    params: Value,
}

impl Seen {
    fn of(header: Option<u64>, item: &Value) -> Self {
        let mut params = item.get("params").cloned().unwrap_or(Value::Null);
        let meta = params
            .as_object_mut()
            .and_then(|p| p.remove("_meta"))
            .and_then(|m| m["timeoutMs"].as_u64());
        Self {
            method: item["method"].as_str().unwrap_or_default().to_owned(),
            header,
            meta,
            params,
        }
    }

    /// The budget, however it came.
    fn budget(&self) -> Option<u64> {
        self.header.or(self.meta)
    }
}

/// The answer to `item` (`None` for a notification).
fn answer(
    item: &Value,
    tries: &mut std::collections::HashMap<String, usize>,
    busy: usize,
) -> Option<Value> {
    let id = item.get("id")?.clone();
    let n = tries.entry(id.to_string()).or_default();
    *n += 1;
    Some(if *n <= busy {
        json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32000, "message": "Server busy"}})
    } else {
        json!({"jsonrpc": "2.0", "id": id, "result": *n})
    })
}

fn read_line(r: &mut BufReader<TcpStream>) -> Option<(Option<u64>, Value)> {
    let mut line = String::new();
    match r.read_line(&mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some((None, serde_json::from_str(&line).unwrap())),
    }
}

/// One HTTP request: its `RPC-Timeout-Ms` and its JSON body.
fn read_http(r: &mut BufReader<TcpStream>) -> Option<(Option<u64>, Value)> {
    let (mut len, mut budget) = (0, None);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            len = v.trim().parse().unwrap();
        }
        if let Some(v) = lower.strip_prefix("rpc-timeout-ms:") {
            budget = Some(v.trim().parse().unwrap());
        }
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).ok()?;
    Some((budget, serde_json::from_slice(&body).unwrap()))
}

#[test]
fn the_client_budget_shrinks_over_retries() {
    for http in [false, true] {
        let (addr, seen) = recording_peer(http, 3);
        let url = if http {
            format!("http://{addr}/")
        } else {
            format!("tcp://{addr}")
        };
        let timeout = Duration::from_secs(5);
        let retry = Retry::default()
            .max_attempts(4)
            .initial_backoff(Duration::from_millis(60))
            .max_backoff(Duration::from_millis(60))
            .max_elapsed(Duration::from_secs(5));
        let c =
            Client::connect_with(&url, Options::default().timeout(timeout).retry(retry)).unwrap();
        let n: usize = c.call_idempotent("m", json!({"x": 1})).unwrap();
        assert_eq!(n, 4, "{url}");
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 4, "{url}: {seen:?}");
        let budgets: Vec<u64> = seen.iter().map(|s| s.budget().unwrap()).collect();
        // The whole call's budget: max_elapsed plus a timeout, from the first attempt.
        assert!(
            budgets[0] <= 10_000 && budgets[0] > 9_000,
            "{url}: {budgets:?}"
        );
        // Each attempt waited at least the backoff (30–60 ms) after the last.
        for w in budgets.windows(2) {
            assert!(w[1] + 20 <= w[0], "{url}: not shrinking: {budgets:?}");
        }
        for s in &seen {
            // Only one way per transport, and the params otherwise as given.
            assert_eq!(s.header.is_some(), http, "{url}: {s:?}");
            assert_eq!(s.meta.is_some(), !http, "{url}: {s:?}");
            assert_eq!(s.params, json!({"x": 1}), "{url}: {s:?}");
        }
    }
}

#[test]
fn the_client_sends_what_is_left_of_each_call_unless_told_not_to() {
    for http in [false, true] {
        let (addr, seen) = recording_peer(http, 0);
        let url = if http {
            format!("http://{addr}/")
        } else {
            format!("tcp://{addr}")
        };
        let opts = Options::default().timeout(Duration::from_secs(3));
        let c = Client::connect_with(&url, opts.clone()).unwrap();
        let _: usize = c.call("named", json!({"a": 1})).unwrap();
        let _: usize = c.call("empty", json!({})).unwrap();
        let _: usize = c.call("positional", [1, 2]).unwrap();
        let _: usize = c.call("none", ()).unwrap();
        let _: usize = c
            .call("has_meta", json!({"_meta": {"progressToken": 7}}))
            .unwrap();
        c.notify("note", json!({"a": 1})).unwrap();
        let p = c.start("started", json!({"a": 2})).unwrap();
        let _: usize = p.wait().unwrap();
        let mut b = c.batch();
        let k = b.call("in_batch", json!({"b": 2})).unwrap();
        b.call("in_batch_positional", [3]).unwrap();
        b.notify("in_batch_note", json!({})).unwrap();
        let _: usize = b.send().unwrap().get(k).unwrap();
        // The peer serves one connection at a time.
        drop(c);
        let off = Client::connect_with(&url, opts.send_deadline(false)).unwrap();
        let _: usize = off.call("off", json!({"a": 1})).unwrap();

        let seen = seen.lock().unwrap().clone();
        let get = |m: &str| {
            seen.iter()
                .find(|s| s.method == m)
                .unwrap_or_else(|| panic!("{m}: {seen:?}"))
                .clone()
        };
        let left = |m: &str| {
            let b = get(m)
                .budget()
                .unwrap_or_else(|| panic!("{url}: {m} has no budget"));
            assert!(b <= 3_000 && b > 1_000, "{url}: {m}: {b}");
        };
        for m in ["named", "empty", "started", "in_batch"] {
            left(m);
            assert_eq!(get(m).meta.is_some(), !http, "{url}: {m}");
        }
        assert_eq!(get("empty").params, json!({}));
        // Params that are not an object, or hold `_meta` already: unchanged on lines
        // (over HTTP the header still says it).
        for m in ["positional", "none", "in_batch_positional"] {
            assert_eq!(get(m).meta, None, "{url}: {m}");
            assert_eq!(get(m).header.is_some(), http, "{url}: {m}");
        }
        assert_eq!(get("positional").params, json!([1, 2]));
        assert_eq!(get("none").params, Value::Null);
        let has_meta = seen.iter().find(|s| s.method == "has_meta").unwrap();
        assert_eq!(has_meta.meta, None, "{url}: its own _meta kept");
        assert_eq!(has_meta.header.is_some(), http, "{url}");
        // Nobody waits for notifications (over HTTP the batch's header covers it).
        assert_eq!(get("note").budget(), None, "{url}");
        assert_eq!(get("in_batch_note").meta, None, "{url}");
        assert_eq!(get("off").budget(), None, "{url}: send_deadline(false)");
    }
}

/// The client against the server: a call whose timeout is shorter than the work is
/// timed out by the server at the client's budget (or by the client, whichever is
/// first), and an inline call's context sees the client's budget.
#[test]
fn the_server_times_out_a_client_call_at_its_budget() {
    let s = Served::start(engine(&Runs::default()), ServerConfig::default());
    let urls = [format!("tcp://{}", s.tcp), format!("http://{}/", s.http)];
    for url in &urls {
        let c = Client::connect_with(url, Options::default().timeout(Duration::from_millis(300)))
            .unwrap();
        let start = Instant::now();
        let r = c.call::<Value, _>("sleep", json!({"ms": 5000}));
        assert!(
            matches!(&r, Err(Error::ReadTimeout))
                || matches!(&r, Err(Error::Server(e)) if e.code == -32001),
            "{url}: {r:?}"
        );
        assert!(start.elapsed() < Duration::from_secs(4), "{url}");
        // The context of an inline call sees the client's budget.
        let c =
            Client::connect_with(url, Options::default().timeout(Duration::from_secs(2))).unwrap();
        let left: Option<u64> = c.call("left", json!({})).unwrap();
        let left = left.unwrap_or_else(|| panic!("{url}: no deadline"));
        assert!(left <= 2_000 && left > 1_000, "{url}: {left}");
    }
    s.stop();
}

/// The no-I/O path (`Engine::handle`, `Engine::handle_from`) takes budgets the same way.
#[test]
fn the_no_io_path_takes_budgets_too() {
    let runs = Runs::default();
    let engine = engine(&runs);
    let mut scratch = engine.scratch();
    let mut run = |frame: &str, head: Option<&str>| {
        let mut out = Vec::new();
        let conn = ringrpc::Connection::EMBEDDED;
        let source = match head {
            Some(h) => ringrpc::Source::http(&conn, h.as_bytes()),
            None => ringrpc::Source::new(&conn),
        };
        let _ = engine.handle_from(frame.as_bytes(), &source, &mut scratch, &mut out);
        serde_json::from_slice::<Value>(&out).unwrap()
    };
    let expired = r#"{"jsonrpc":"2.0","method":"count","params":{"_meta":{"timeoutMs":0}},"id":1}"#;
    assert_expired(&run(expired, None), 0);
    let head = "POST / HTTP/1.1\r\nHost: x\r\nRPC-Timeout-Ms: 0\r\n\r\n";
    let plain = r#"{"jsonrpc":"2.0","method":"count","id":2}"#;
    assert_expired(&run(plain, Some(head)), 0);
    assert_eq!(runs.0.load(Ordering::SeqCst), 0);
    assert_eq!(run(plain, None)["result"], 1);
    // A deferred call is waited for until its budget, not request_timeout.
    let start = Instant::now();
    let late = r#"{"jsonrpc":"2.0","method":"delay","params":[5000],"id":3}"#;
    let head = "POST / HTTP/1.1\r\nHost: x\r\nRPC-Timeout-Ms: 200\r\n\r\n";
    assert_eq!(run(late, Some(head))["error"]["code"], -32001);
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "{:?}",
        start.elapsed()
    );
}
