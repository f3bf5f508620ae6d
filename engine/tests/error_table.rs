//! docs/PROTOCOL.md's error table, checked against the engine over real sockets: the
//! table must list exactly the engine's reasons ([`Reason::ALL`]) with their codes,
//! message prefixes and retry hints, and every row is triggered on a running server
//! (TCP lines and HTTP as fits the row), checking the answer's code, message prefix,
//! `data.reason` and `data.retryAfterMs`.
//!
//! A reason added to the engine without a trigger here fails [`every_row_over_a_socket`]
//! (the match in [`trigger`] ends in a panic), and one missing from the table fails
//! [`the_table_lists_every_reason`].
//!
//! Every socket has timeouts, so a hang fails the test instead of stalling it.

mod util;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use ringrpc::dedup::{Dedup, DEFAULT_TTL};
use ringrpc::guard::Guard;
use ringrpc::{demo, Config, Engine, Params, Reason, RpcError, ServerConfig};
use serde_json::{json, Value};
use util::line::Line;
use util::server::Served;

/// The longest a read or write may block.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// One row of the table: code, message prefix, reason, and the `retryAfterMs` column
/// (`None`: "no"; `Some(None)`: "yes"; `Some(Some(n))`: "yes (n)").
#[derive(Debug)]
struct Row {
    code: i32,
    message: String,
    reason: String,
    retry_after: Option<Option<u64>>,
}

/// The rows of docs/PROTOCOL.md's error table that have a reason.
fn table() -> Vec<Row> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/PROTOCOL.md"))
        .expect("docs/PROTOCOL.md");
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in doc.lines() {
        if line.starts_with("| code | message (prefix) | `data.reason` |") {
            in_table = true;
            continue;
        }
        if !in_table || line.starts_with("| ---") {
            continue;
        }
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
        assert_eq!(cells.len(), 5, "a table row of five cells: {line}");
        if cells[2] == "—" {
            // Application and relayed errors: the method's or upstream's own.
            continue;
        }
        let unquote = |c: &str| {
            c.strip_prefix('`')
                .and_then(|c| c.strip_suffix('`'))
                .unwrap_or_else(|| panic!("`{c}` is not quoted: {line}"))
                .to_owned()
        };
        let retry_after = match cells[4] {
            "no" => None,
            "yes" => Some(None),
            c => {
                let n = c
                    .strip_prefix("yes (")
                    .and_then(|c| c.strip_suffix(')'))
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("retryAfterMs cell `{c}`: {line}"));
                Some(Some(n))
            }
        };
        rows.push(Row {
            code: cells[0].parse().unwrap_or_else(|_| panic!("code: {line}")),
            message: unquote(cells[1]),
            reason: unquote(cells[2]),
            retry_after,
        });
    }
    assert!(!rows.is_empty(), "no error table found in docs/PROTOCOL.md");
    rows
}

#[test]
fn the_table_lists_every_reason() {
    let rows = table();
    let documented: Vec<&str> = rows.iter().map(|r| r.reason.as_str()).collect();
    let engine: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(
        documented, engine,
        "the table's reasons, in Reason::ALL's order"
    );
    for (row, &r) in rows.iter().zip(Reason::ALL) {
        assert_eq!(row.code, r.code().code(), "{row:?}");
        assert_eq!(row.message, r.code().message(), "{row:?}");
        assert_eq!(row.retry_after.is_some(), r.has_retry_after(), "{row:?}");
    }
}

#[test]
fn every_row_over_a_socket() {
    let mut failures = Vec::new();
    for row in table() {
        let reason = Reason::from_name(&row.reason)
            .unwrap_or_else(|| panic!("{}: not a reason of the engine", row.reason));
        for (how, answer) in trigger(reason) {
            if let Err(e) = check(&row, &answer) {
                failures.push(format!("{} ({how}): {e}: {answer}", row.reason));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The client's view: `ServerError::reason` and `retry_after` over TCP and HTTP.
#[cfg(feature = "client")]
#[test]
fn the_client_reads_reason_and_hint() {
    use ringrpc::client::{Client, Error};
    let server_error = |r: Result<Value, Error>| match r {
        Err(Error::Server(e)) => e,
        other => panic!("not a server error: {other:?}"),
    };
    let s = served(Config::default(), ServerConfig::default());
    let guard = Guard::new().with_peer_rate_limit("0.1:1").unwrap();
    let limited = Served::start(
        engine(Config::default()).with_guard(guard),
        ServerConfig::default(),
    );
    for (plain, metered) in [
        (format!("tcp://{}", s.tcp), format!("tcp://{}", limited.tcp)),
        (
            format!("http://{}/", s.http),
            format!("http://{}/", limited.http),
        ),
    ] {
        let c = Client::connect(&plain).unwrap();
        let e = server_error(c.call("nope", [0]));
        assert_eq!(e.reason(), Some("method_not_found"), "{plain}: {e}");
        assert_eq!(e.retry_after(), None);
        let e = server_error(c.call("subtract", ["a", "b"]));
        assert_eq!(
            e.reason().and_then(Reason::from_name),
            Some(Reason::InvalidParams)
        );
        // The first call of this peer passes (over HTTP too: the TCP one was charged
        // to the same address, so only the first URL's call passes).
        let c = Client::connect(&metered).unwrap();
        let refused = (0..2).find_map(|_| c.call::<Value, _>("ping", ()).err());
        let e = server_error(Err(refused.expect("no call was limited")));
        assert_eq!(e.reason(), Some("rate_limited"), "{metered}: {e}");
        assert!(e.retry_after().is_some_and(|d| !d.is_zero()), "{e}");
    }
}

/// Whether `answer` (a whole response object) is `row`'s error.
fn check(row: &Row, answer: &Value) -> Result<(), String> {
    let error = answer.get("error").ok_or("not an error")?;
    if error["code"] != row.code {
        return Err(format!("code is not {}", row.code));
    }
    let message = error["message"].as_str().ok_or("no message")?;
    if !message.starts_with(&row.message) {
        return Err(format!("the message does not start with `{}`", row.message));
    }
    let data = error.get("data").ok_or("no data")?;
    if data["reason"] != row.reason.as_str() {
        return Err(format!("data.reason is not `{}`", row.reason));
    }
    let hint = data.get("retryAfterMs");
    match (row.retry_after, hint) {
        (None, None) => {}
        (None, Some(_)) => return Err("retryAfterMs where the table says no".into()),
        (Some(_), None) => return Err("no retryAfterMs".into()),
        (Some(want), Some(hint)) => {
            let ms = hint.as_u64().ok_or("retryAfterMs is not a whole number")?;
            if ms == 0 || want.is_some_and(|w| w != ms) {
                return Err(format!("retryAfterMs {ms}, the table says {want:?}"));
            }
        }
    }
    let keys: Vec<&String> = data
        .as_object()
        .ok_or("data is not an object")?
        .keys()
        .collect();
    if keys.len() != 1 + usize::from(hint.is_some()) {
        return Err(format!(
            "data holds more than reason and retryAfterMs: {keys:?}"
        ));
    }
    Ok(())
}

/// Makes the engine answer `reason` over real sockets: each answer with how it was
/// triggered. A new reason needs a trigger here (the crate's enum is
/// `#[non_exhaustive]`, so the last arm catches it and fails the test).
fn trigger(reason: Reason) -> Vec<(&'static str, Value)> {
    match reason {
        Reason::ParseError => {
            let s = served(Config::default(), ServerConfig::default());
            let tcp = raw_line(s.tcp, br#"{"jsonrpc":"2.0","method":"ping","id":1"#);
            let deep = raw_line(
                s.tcp,
                format!("{}{}", "[".repeat(100), "]".repeat(100)).as_bytes(),
            );
            let (status, http) = raw_post(s.http, br#"{"jsonrpc":"#);
            assert_eq!(status, 200, "{http}");
            vec![("tcp", tcp), ("tcp, too deep", deep), ("http", http)]
        }
        Reason::InvalidRequest => {
            let s = served(Config::default(), ServerConfig::default());
            let mut l = Line::tcp(s.tcp);
            let bad = l.call(&json!({"jsonrpc": "2.0", "method": 1, "id": 1}));
            let empty = l.call(&json!([]));
            let element = l.call(&json!([1]))[0].clone();
            vec![
                ("tcp, method not a string", bad),
                ("tcp, empty batch", empty),
                ("tcp, batch element", element),
            ]
        }
        Reason::RequestTooLarge => {
            let s = served(
                Config::default().max_request_bytes(1024),
                ServerConfig::default(),
            );
            let big = format!(
                r#"{{"jsonrpc":"2.0","method":"echo","params":["{}"],"id":1}}"#,
                "a".repeat(2048)
            );
            let v = raw_line(s.tcp, big.as_bytes());
            assert_eq!(v["id"], Value::Null);
            vec![("tcp", v)]
        }
        Reason::BatchTooLarge => {
            let s = served(Config::default().max_batch_len(2), ServerConfig::default());
            let ping = json!({"jsonrpc": "2.0", "method": "ping", "id": 1});
            let v = Line::tcp(s.tcp).call(&json!([ping, ping, ping]));
            vec![("tcp", v)]
        }
        Reason::MethodNotFound => {
            let s = served(Config::default(), ServerConfig::default());
            let call = req("nope", json!([]), 1);
            let tcp = Line::tcp(s.tcp).call(&call);
            let http = util::http::post(s.http, &[], &call).body;
            let auth = req("rpc.auth", json!({"token": "x"}), 2);
            let no_keys = Line::tcp(s.tcp).call(&auth);
            vec![
                ("tcp", tcp),
                ("http", http),
                ("tcp, rpc.auth without keys", no_keys),
            ]
        }
        Reason::InvalidParams => {
            let s = served(Config::default(), ServerConfig::default());
            let mut l = Line::tcp(s.tcp);
            let typed = l.call(&req("subtract", json!(["a", 1]), 1));
            let own = l.call(&req("add", json!([i64::MAX, 1]), 2));
            vec![("tcp, typed params", typed), ("tcp, the method's own", own)]
        }
        Reason::InternalError => {
            let s = served(Config::default(), ServerConfig::default());
            let mut l = Line::tcp(s.tcp);
            let panicked = l.call(&req("panics", json!([]), 1));
            let dropped = l.call(&req("drops_responder", json!([]), 2));
            vec![
                ("tcp, panic", panicked),
                ("tcp, responder dropped", dropped),
            ]
        }
        Reason::ServerBusy => {
            // One worker, one queued call: of four calls sent at once, at least two find
            // the queue full.
            let s = served(
                Config::default(),
                ServerConfig::default().workers(1).queue_capacity(1),
            );
            let call = |id| req("sleep", json!({"ms": 300}), id).to_string();
            let lines = (1..=4).map(call).collect::<Vec<_>>().join("\n");
            let answers = raw_lines(s.tcp, lines.as_bytes(), 4);
            let busy: Vec<Value> = answers
                .into_iter()
                .filter(|a| a["error"]["code"] == -32000)
                .collect();
            assert!(!busy.is_empty(), "no call was refused");
            busy.into_iter().map(|a| ("tcp, queue full", a)).collect()
        }
        Reason::DedupUnavailable => {
            // A Redis store at an address where nothing listens.
            let port = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let url = format!("redis://127.0.0.1:{port}");
            let engine = engine(Config::default())
                .with_dedup(Dedup::redis(&url, DEFAULT_TTL, false).unwrap());
            let s = Served::start(engine, ServerConfig::default());
            let key = [("Idempotency-Key", "k-down")];
            let v = util::http::post(s.http, &key, &req("incr", json!([1]), 1)).body;
            vec![("http, Idempotency-Key", v)]
        }
        Reason::DeadlineExceeded => {
            let s = served(
                Config::default().request_timeout(Some(Duration::from_millis(100))),
                ServerConfig::default(),
            );
            let mut l = Line::tcp(s.tcp);
            let pool = l.call(&req("sleep", json!({"ms": 1000}), 1));
            let deferred = l.call(&req("delay", json!([1000]), 2));
            vec![("tcp, pool", pool), ("tcp, deferred", deferred)]
        }
        Reason::ResponseTooLarge => {
            let s = served(
                Config::default().max_response_bytes(256),
                ServerConfig::default(),
            );
            let echo = req("echo", json!(["b".repeat(1000)]), 1);
            let tcp = Line::tcp(s.tcp).call(&echo);
            let batch = Line::tcp(s.tcp).call(&json!([req("ping", json!([]), 2), echo]));
            let element = batch
                .as_array()
                .and_then(|a| a.iter().find(|e| e["id"] == 1))
                .cloned()
                .unwrap_or(Value::Null);
            vec![("tcp", tcp), ("tcp, batch element", element)]
        }
        Reason::RateLimited => {
            let guard = Guard::new().with_peer_rate_limit("0.1:1").unwrap();
            let s = Served::start(
                engine(Config::default()).with_guard(guard),
                ServerConfig::default(),
            );
            let mut l = Line::tcp(s.tcp);
            let ping = req("ping", json!([]), 1);
            assert_eq!(l.call(&ping)["result"], "pong");
            let tcp = l.call(&ping);
            let http = util::http::post(s.http, &[], &ping);
            assert_eq!(http.status, 429, "{}", http.body);
            assert!(http.header("retry-after").is_some());
            vec![("tcp", tcp), ("http 429", http.body)]
        }
        Reason::Unauthenticated => {
            let s = guarded();
            let ping = req("ping", json!([]), 1);
            let tcp = Line::tcp(s.tcp).call(&ping);
            let mut l = Line::tcp(s.tcp);
            let bad_token = l.call(&req("rpc.auth", json!({"token": "wrong"}), 2));
            let http = util::http::post(s.http, &[], &ping);
            assert_eq!(http.status, 401, "{}", http.body);
            let unknown = util::http::post(s.http, &[("Authorization", "Bearer wrong")], &ping);
            assert_eq!(unknown.status, 401, "{}", unknown.body);
            vec![
                ("tcp, no rpc.auth", tcp),
                ("tcp, unknown token", bad_token),
                ("http 401, no token", http.body),
                ("http 401, unknown token", unknown.body),
            ]
        }
        Reason::PermissionDenied => {
            let s = guarded();
            let mut l = Line::tcp(s.tcp);
            let auth = l.call(&req("rpc.auth", json!({"token": "p1ng"}), 1));
            assert!(auth["result"]["identity"].is_string(), "{auth}");
            let tcp = l.call(&req("sum", json!([1, 2]), 2));
            let http = util::http::post(
                s.http,
                &[("Authorization", "Bearer p1ng")],
                &req("sum", json!([1]), 3),
            );
            vec![("tcp", tcp), ("http", http.body)]
        }
        Reason::InProgress => {
            // The same key twice at once: the second finds the first still running
            // (whichever the server saw first runs; the other is refused).
            let s = served_dedup();
            let key = [("Idempotency-Key", "k-twice")];
            let call = req("slow_incr", json!([1]), 1);
            let first = {
                let (addr, call) = (s.http, call.clone());
                std::thread::spawn(move || util::http::post(addr, &key, &call).body)
            };
            std::thread::sleep(Duration::from_millis(100));
            let second = util::http::post(s.http, &key, &call).body;
            let first = first.join().unwrap();
            let (refused, ran): (Vec<Value>, Vec<Value>) = [first, second]
                .into_iter()
                .partition(|a| a.get("error").is_some());
            assert_eq!((refused.len(), ran.len()), (1, 1), "{refused:?} {ran:?}");
            refused
                .into_iter()
                .map(|a| ("http, Idempotency-Key", a))
                .collect()
        }
        Reason::FingerprintMismatch => {
            let s = served_dedup();
            let key = [("Idempotency-Key", "k-reused")];
            let first = util::http::post(s.http, &key, &req("incr", json!([1]), 1)).body;
            assert_eq!(first["result"], 1, "{first}");
            let v = util::http::post(s.http, &key, &req("incr", json!([2]), 1)).body;
            vec![("http, Idempotency-Key", v)]
        }
        Reason::UpstreamUnavailable => {
            // A proxy whose upstream address has nothing listening.
            let refused = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap();
            let (s, _proxy) = proxied(&format!("tcp://{refused}"), Duration::from_secs(5));
            let tcp = Line::tcp(s.tcp).call(&req("sum", json!([1]), 1));
            let http = util::http::post(s.http, &[], &req("sum", json!([1]), 2)).body;
            vec![("tcp", tcp), ("http", http)]
        }
        Reason::UpstreamTimeout => {
            // A proxy whose upstream reads requests and never answers.
            let stall = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = stall.local_addr().unwrap();
            std::thread::spawn(move || {
                for c in stall.incoming().flatten() {
                    std::thread::spawn(move || std::io::copy(&mut &c, &mut std::io::sink()));
                }
            });
            let (s, _proxy) = proxied(&format!("tcp://{addr}"), Duration::from_millis(100));
            let tcp = Line::tcp(s.tcp).call(&req("sum", json!([1]), 1));
            let http = util::http::post(s.http, &[], &req("sum", json!([1]), 2)).body;
            vec![("tcp", tcp), ("http", http)]
        }
        Reason::PushUnsupported => {
            // A subscription over HTTP, which cannot carry its notifications.
            let s = served(Config::default(), ServerConfig::default());
            let call = req("subscribe_ticks", json!([10]), 1);
            let http = util::http::post(s.http, &[], &call).body;
            vec![("http", http)]
        }
        Reason::SubscriptionLimit => {
            // A second subscription where one per connection is allowed.
            let mut methods = ringrpc::Registry::builder();
            let config = ringrpc::SubscriptionConfig {
                max_per_connection: 1,
                ..Default::default()
            };
            methods
                .subscription_with("watch", "seen", "unwatch", config, |_, _, _| Ok(()))
                .unwrap();
            let engine = ringrpc::Engine::new(methods.freeze(), Config::default());
            let s = util::server::Served::start(engine, ServerConfig::default());
            let mut l = Line::tcp(s.tcp);
            let first = l.call(&req("watch", json!([]), 1));
            assert!(first["result"].is_u64(), "{first}");
            vec![("tcp, the second", l.call(&req("watch", json!([]), 2)))]
        }
        other => panic!("no trigger for reason `{other}`: add one to this test"),
    }
}

/// A server forwarding every call to `upstream` through a proxy timing calls out after
/// `timeout` (the proxy is returned so it lives as long as the server).
fn proxied(upstream: &str, timeout: Duration) -> (Served, ringrpc::proxy::Proxy) {
    let proxy = ringrpc::proxy::Proxy::builder()
        .upstream("default", upstream)
        .timeout(timeout)
        .start()
        .unwrap();
    let mut methods = ringrpc::Registry::builder();
    proxy.install(&mut methods).unwrap();
    let engine = Engine::new(methods.freeze(), Config::default());
    (Served::start(engine, ServerConfig::default()), proxy)
}

fn req(method: &str, params: Value, id: i64) -> Value {
    json!({"jsonrpc": "2.0", "method": method, "params": params, "id": id})
}

/// The demo methods plus `panics`, `drops_responder` (a deferred method that never
/// answers) and `slow_incr` (blocking, 1 s, de-duplicated).
fn engine(config: Config) -> Engine {
    let mut b = demo::builder();
    b.method("panics", |_p: Params<'_>| -> Result<(), RpcError> {
        panic!("this method always panics")
    })
    .unwrap()
    .deferred_method("drops_responder", |_ctx, _params, responder| {
        drop(responder)
    })
    .unwrap()
    .blocking_method("slow_incr", |p: Params<'_>| -> Result<i64, RpcError> {
        let [n]: [i64; 1] = p.parse()?;
        std::thread::sleep(Duration::from_secs(1));
        Ok(n)
    })
    .unwrap()
    .dedup("slow_incr")
    .unwrap();
    Engine::new(b.freeze(), config)
}

fn served(config: Config, settings: ServerConfig) -> Served {
    Served::start(engine(config), settings)
}

/// A server whose callers need keys: `p1ng` may call only `ping`.
fn guarded() -> Served {
    let keys = "[[key]]\nname = \"pinger\"\ntoken = \"p1ng\"\nallow = [\"ping\"]\n";
    let guard = Guard::new().with_keys_toml(keys).unwrap();
    Served::start(
        engine(Config::default()).with_guard(guard),
        ServerConfig::default(),
    )
}

/// A server de-duplicating in memory (anonymous callers: by `Idempotency-Key`).
fn served_dedup() -> Served {
    let engine = engine(Config::default()).with_dedup(Dedup::memory(1 << 20, DEFAULT_TTL));
    Served::start(Arc::new(engine), ServerConfig::default())
}

/// Sends `bytes` and a newline on a new TCP connection; the one answer line.
fn raw_line(addr: SocketAddr, bytes: &[u8]) -> Value {
    raw_lines(addr, bytes, 1).remove(0)
}

/// Sends `bytes` and a newline on a new TCP connection; the first `n` answer lines.
fn raw_lines(addr: SocketAddr, bytes: &[u8], n: usize) -> Vec<Value> {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    let mut r = BufReader::new(s);
    r.get_mut().write_all(bytes).unwrap();
    r.get_mut().write_all(b"\n").unwrap();
    (0..n)
        .map(|_| {
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            util::check_reply(line.trim_end().as_bytes()).unwrap_or_else(|e| panic!("{e}"))
        })
        .collect()
}

/// POSTs `body` as it is (`Connection: close`): the status and the JSON body.
fn raw_post(addr: SocketAddr, body: &[u8]) -> (u16, Value) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let head = format!(
        "POST / HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let mut hs = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut hs);
    let Ok(httparse::Status::Complete(at)) = resp.parse(&raw) else {
        panic!("not an HTTP response: {}", util::show(&raw));
    };
    let body = util::check_reply(&raw[at..]).unwrap_or_else(|e| panic!("{e}"));
    (resp.code.unwrap_or(0), body)
}
