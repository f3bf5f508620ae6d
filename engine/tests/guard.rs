//! The guard over real sockets: authentication (HTTP Bearer, `rpc.auth` on TCP, Unix
//! peers by uid), allow-lists per batch element, key file reloads, and rate limits per
//! identity and per peer address (each batch element charged, HTTP 429).
//!
//! Every socket has timeouts, so a hang fails the test instead of stalling it.

mod util;

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;

use ringrpc::guard::Guard;
use ringrpc::{demo, Config, Engine, ServerConfig};
use serde_json::{json, Value};
use util::line::Line;
use util::server::Served;

const KEYS: &str = r#"
[[key]]
name  = "ops"
token = "s3cret-ops"
allow = ["*"]

[[key]]
name  = "reader"
token = "r3ader"
allow = ["get_*", "sum", "ping", "whoami"]

[[key]]
name  = "nobody"
token = "n0body"
allow = []

[[key]]
name  = "metered"
token = "m3tered"
allow = ["*"]
rate  = 1
burst = 10

[weights]
sum = 5
"#;

fn serve(guard: Guard) -> (Served, Arc<Engine>) {
    let engine = Arc::new(demo::engine(Config::default()).with_guard(guard));
    (
        Served::start(Arc::clone(&engine), ServerConfig::default()),
        engine,
    )
}

fn keys(extra: &str) -> Guard {
    Guard::new()
        .with_keys_toml(&format!("{KEYS}{extra}"))
        .unwrap()
}

fn req(method: &str, params: Value, id: i64) -> Value {
    json!({"jsonrpc": "2.0", "method": method, "params": params, "id": id})
}

fn code(v: &Value) -> i64 {
    v["error"]["code"].as_i64().unwrap_or(0)
}

/// One HTTP/1.1 POST with `headers`: (status, header fields, body).
fn post(
    addr: SocketAddr,
    headers: &[(&str, &str)],
    body: &Value,
) -> (u16, Vec<(String, String)>, Value) {
    let a = util::http::post(addr, headers, body);
    (a.status, a.headers, a.body)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

#[test]
fn http_needs_a_bearer_token() {
    let (s, _e) = serve(keys(""));
    let ping = req("ping", json!([]), 1);

    let (status, h, body) = post(s.http, &[], &ping);
    assert_eq!(status, 401);
    assert_eq!(
        header(&h, "www-authenticate"),
        Some(r#"Bearer realm="ringrpc""#)
    );
    assert_eq!(body["error"]["code"], -32040, "{body}");
    assert_eq!(body["error"]["data"]["reason"], "unauthenticated");
    assert_eq!(body["id"], Value::Null);

    let (status, h, body) = post(s.http, &[("Authorization", "Bearer wrong")], &ping);
    assert_eq!(status, 401);
    assert!(header(&h, "www-authenticate")
        .unwrap()
        .contains("invalid_token"));
    assert_eq!(code(&body), -32040);
    // A notification-only request is refused as well: the credentials come first.
    let note = json!({"jsonrpc": "2.0", "method": "ping"});
    assert_eq!(
        post(s.http, &[("Authorization", "Basic eDp5")], &note).0,
        401
    );

    let (status, _, body) = post(s.http, &[("Authorization", "Bearer r3ader")], &ping);
    assert_eq!((status, &body["result"]), (200, &json!("pong")), "{body}");
    // The scheme is case-insensitive (RFC 9110 §11.1).
    let (status, _, _) = post(s.http, &[("authorization", "bearer r3ader")], &ping);
    assert_eq!(status, 200);
    s.stop();
}

/// With `Expect: 100-continue`, a bad or missing token is refused (401, closed) before
/// the body is asked for; a good one gets its 100, then its answer.
#[test]
fn http_credentials_are_checked_before_the_body_is_asked_for() {
    use std::io::{Read, Write};
    let (s, _e) = serve(keys(""));
    let body = r#"{"jsonrpc":"2.0","method":"ping","id":1}"#;
    let head = |auth: &str| {
        format!(
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}Expect: 100-continue\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
    };
    for auth in ["", "Authorization: Bearer wrong\r\n"] {
        let mut c = TcpStream::connect(s.http).unwrap();
        c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        c.write_all(head(auth).as_bytes()).unwrap();
        // The head alone: the answer comes without the body.
        let mut answer = String::new();
        c.read_to_string(&mut answer).unwrap();
        assert!(
            answer.starts_with("HTTP/1.1 401 Unauthorized\r\n"),
            "{answer}"
        );
        assert!(!answer.contains("100 Continue"), "{answer}");
        assert!(answer.contains("-32040"), "{answer}");
    }
    let mut c = TcpStream::connect(s.http).unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    c.write_all(head("Authorization: Bearer r3ader\r\n").as_bytes())
        .unwrap();
    let mut got = [0u8; 25];
    c.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"HTTP/1.1 100 Continue\r\n\r\n");
    c.write_all(body.as_bytes()).unwrap();
    let mut answer = vec![0u8; 4096];
    let n = c.read(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    s.stop();
}

#[test]
fn allow_lists_apply_to_every_batch_element() {
    let (s, _e) = serve(keys(""));
    let batch = json!([
        req("ping", json!([]), 1),
        req("echo", json!([1]), 2),
        req("get_data", json!([]), 3),
        req("sum", json!([1, 2]), 4),
        {"jsonrpc": "2.0", "method": "echo", "params": [5]},
        req("no_such_method", json!([]), 6),
    ]);
    let (status, _, body) = post(s.http, &[("Authorization", "Bearer r3ader")], &batch);
    assert_eq!(status, 200);
    let answers = body.as_array().unwrap();
    assert_eq!(answers.len(), 5, "the notification is not answered: {body}");
    let by_id = |id: i64| answers.iter().find(|a| a["id"] == id).unwrap();
    assert_eq!(by_id(1)["result"], "pong");
    assert_eq!(code(by_id(2)), -32041);
    assert_eq!(by_id(2)["error"]["data"]["reason"], "permission_denied");
    assert!(by_id(2)["error"]["message"]
        .as_str()
        .unwrap()
        .contains("reader may not call echo"));
    assert!(by_id(3).get("result").is_some(), "{}", by_id(3));
    assert_eq!(by_id(4)["result"], 3);
    // Unknown methods are refused like any other the identity may not call.
    assert_eq!(code(by_id(6)), -32041);

    // An empty allow list allows nothing.
    let (_, _, body) = post(
        s.http,
        &[("Authorization", "Bearer n0body")],
        &req("ping", json!([]), 9),
    );
    assert_eq!(code(&body), -32041);
    let (_, _, body) = post(
        s.http,
        &[("Authorization", "Bearer s3cret-ops")],
        &req("echo", json!([7]), 9),
    );
    assert_eq!(body["result"], json!([7]));
    s.stop();
}

#[test]
fn tcp_authenticates_with_rpc_auth_first() {
    let (s, _e) = serve(keys(""));
    let mut c = Line::tcp(s.tcp);
    let v = c.call(&req("ping", json!([]), 1));
    assert_eq!(code(&v), -32040, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("rpc.auth"));
    let v = c.call(&req("rpc.auth", json!({"token": "nope"}), 2));
    assert_eq!((code(&v), &v["id"]), (-32040, &json!(2)), "{v}");
    for bad in [json!({"token": 5}), json!({}), json!([])] {
        let v = c.call(&req("rpc.auth", bad, 3));
        assert_eq!(code(&v), -32602, "{v}");
    }
    let v = c.call(&req("rpc.auth", json!({"token": "r3ader"}), 4));
    assert_eq!(
        v,
        json!({"jsonrpc": "2.0", "id": 4, "result": {"identity": "reader"}})
    );
    assert_eq!(c.call(&req("ping", json!([]), 5))["result"], "pong");
    assert_eq!(code(&c.call(&req("echo", json!([1]), 6))), -32041);
    // The context carries the identity (whoami reports the transport; the identity is
    // in the context the handler gets).
    assert_eq!(
        c.call(&req("whoami", json!([]), 7))["result"]["transport"],
        "tcp"
    );
    // Authenticating again as someone else switches the identity.
    let v = c.call(&req("rpc.auth", json!({"token": "s3cret-ops"}), 8));
    assert_eq!(v["result"]["identity"], "ops");
    assert_eq!(c.call(&req("echo", json!([1]), 9))["result"], json!([1]));
    // A failed attempt leaves the connection unauthenticated.
    let _ = c.call(&req("rpc.auth", json!({"token": "bad"}), 10));
    assert_eq!(code(&c.call(&req("ping", json!([]), 11))), -32040);

    // Another connection starts unauthenticated.
    let mut d = Line::tcp(s.tcp);
    assert_eq!(code(&d.call(&req("ping", json!([]), 1))), -32040);

    // rpc.auth over HTTP is not how HTTP authenticates.
    let (_, _, body) = post(
        s.http,
        &[("Authorization", "Bearer r3ader")],
        &req("rpc.auth", json!({"token": "r3ader"}), 1),
    );
    assert_eq!(code(&body), -32601, "{body}");
    s.stop();
}

#[test]
fn unix_peers_may_be_allowed_by_uid() {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let (s, _e) = serve(keys(&format!(
        "[[peer]]\nuid = {uid}\nname = \"local\"\nallow = [\"ping\", \"get_*\"]\n"
    )));
    let mut c = Line::unix(&s.unix);
    assert_eq!(c.call(&req("ping", json!([]), 1))["result"], "pong");
    assert_eq!(code(&c.call(&req("echo", json!([1]), 2))), -32041);
    // A token still switches to its key's identity.
    let v = c.call(&req("rpc.auth", json!({"token": "s3cret-ops"}), 3));
    assert_eq!(v["result"]["identity"], "ops");
    assert_eq!(c.call(&req("echo", json!([1]), 4))["result"], json!([1]));
    // TCP peers have no uid.
    assert_eq!(
        code(&Line::tcp(s.tcp).call(&req("ping", json!([]), 1))),
        -32040
    );
    s.stop();

    // A uid not in the file is unauthenticated.
    let (s, _e) = serve(keys(
        "[[peer]]\nuid = 4000000000\nname = \"x\"\nallow = [\"*\"]\n",
    ));
    assert_eq!(
        code(&Line::unix(&s.unix).call(&req("ping", json!([]), 1))),
        -32040
    );
    s.stop();
}

fn temp_file(name: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("ringrpc-guard-{}-{name}", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_reload_changes_rights_without_dropping_connections() {
    let path = temp_file("reload.toml", KEYS);
    let (s, engine) = serve(Guard::new().with_key_file(&path).unwrap());
    let mut c = Line::tcp(s.tcp);
    assert_eq!(
        c.call(&req("rpc.auth", json!({"token": "r3ader"}), 1))["result"]["identity"],
        "reader"
    );
    assert_eq!(code(&c.call(&req("echo", json!([1]), 2))), -32041);

    // The reader may now call everything; ops is gone.
    std::fs::write(
        &path,
        "[[key]]\nname = \"reader\"\ntoken = \"r3ader\"\nallow = [\"*\"]\n",
    )
    .unwrap();
    engine.guard().unwrap().reload().unwrap();
    assert_eq!(c.call(&req("echo", json!([1]), 3))["result"], json!([1]));
    let (status, _, _) = post(
        s.http,
        &[("Authorization", "Bearer s3cret-ops")],
        &req("ping", json!([]), 1),
    );
    assert_eq!(
        status, 401,
        "a key removed from the file is refused at once"
    );

    // A broken file keeps the keys in force.
    std::fs::write(&path, "[[key]\n").unwrap();
    let e = engine.guard().unwrap().reload().unwrap_err();
    assert!(e.to_string().contains("key file"), "{e}");
    assert_eq!(c.call(&req("echo", json!([2]), 4))["result"], json!([2]));

    // The reader's key removed: the open connection is refused from its next call.
    std::fs::write(
        &path,
        "[[key]]\nname = \"ops\"\ntoken = \"s3cret-ops\"\nallow = [\"*\"]\n",
    )
    .unwrap();
    engine.guard().unwrap().reload().unwrap();
    assert_eq!(code(&c.call(&req("ping", json!([]), 5))), -32040);
    s.stop();
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_batch_is_charged_per_element() {
    // `metered`: 1 call/s, burst 10.
    let (s, _e) = serve(keys(""));
    let mut c = Line::tcp(s.tcp);
    c.call(&req("rpc.auth", json!({"token": "m3tered"}), 0));
    let batch: Vec<Value> = (1..=100).map(|i| req("ping", json!([]), i)).collect();
    let v = c.call(&Value::Array(batch));
    let answers = v.as_array().unwrap();
    assert_eq!(answers.len(), 100);
    let ok = answers.iter().filter(|a| a["result"] == "pong").count();
    let limited: Vec<&Value> = answers.iter().filter(|a| code(a) == -32005).collect();
    assert_eq!((ok, limited.len()), (10, 90), "{v}");
    // In order: the first ten passed.
    assert!(answers[..10].iter().all(|a| a["result"] == "pong"));
    let data = &limited[0]["error"]["data"];
    assert_eq!(data["reason"], "rate_limited");
    let retry = data["retryAfterMs"].as_u64().unwrap();
    assert!((1..=1000).contains(&retry), "{data}");

    // Over HTTP, a request whose every call was limited is a 429 with Retry-After.
    let (status, h, body) = post(
        s.http,
        &[("Authorization", "Bearer m3tered")],
        &req("ping", json!([]), 1),
    );
    assert_eq!(status, 429, "{body}");
    assert_eq!(header(&h, "retry-after"), Some("1"));
    assert_eq!(code(&body), -32005);
    s.stop();
}

#[test]
fn an_http_batch_only_partly_limited_is_answered_200() {
    // `metered`: burst 10. Twelve plain calls in one HTTP request: ten answered, two
    // limited; the request as a whole was not refused, so no 429.
    let (s, _e) = serve(keys(""));
    let batch: Vec<Value> = (1..=12).map(|i| req("ping", json!([]), i)).collect();
    let (status, _h, body) = post(
        s.http,
        &[("Authorization", "Bearer m3tered")],
        &Value::Array(batch),
    );
    assert_eq!(status, 200, "{body}");
    let codes: Vec<i64> = body.as_array().unwrap().iter().map(code).collect();
    assert_eq!(codes.iter().filter(|&&c| c == 0).count(), 10, "{body}");
    assert_eq!(codes.iter().filter(|&&c| c == -32005).count(), 2, "{body}");
    s.stop();
}

/// Notifications only, every one refused by a rate limit: no body, but 429 with
/// `Retry-After` (it was 204, as if they had run).
#[test]
fn an_http_request_of_limited_notifications_is_answered_429() {
    // `metered`: burst 10, 1 call/s.
    let (s, _e) = serve(keys(""));
    let notes = |n: usize| {
        Value::Array(
            (0..n)
                .map(|_| json!({"jsonrpc": "2.0", "method": "ping"}))
                .collect(),
        )
    };
    let auth = [("Authorization", "Bearer m3tered")];
    let (status, _, _) = post(s.http, &auth, &notes(10));
    assert_eq!(status, 204);
    let (status, h, body) = post(s.http, &auth, &notes(3));
    assert_eq!((status, &body), (429, &Value::Null));
    assert!(
        header(&h, "retry-after").is_some_and(|v| v.parse::<u64>().is_ok_and(|s| s >= 1)),
        "{h:?}"
    );
    s.stop();
}

#[test]
fn weights_charge_more_per_call() {
    // `metered` has a burst of 10 and `sum` weighs 5: two sums pass, the third does not.
    let (s, _e) = serve(keys(""));
    let mut c = Line::tcp(s.tcp);
    c.call(&req("rpc.auth", json!({"token": "m3tered"}), 0));
    let batch: Vec<Value> = (1..=3).map(|i| req("sum", json!([1, 2]), i)).collect();
    let v = c.call(&Value::Array(batch));
    let codes: Vec<i64> = v.as_array().unwrap().iter().map(code).collect();
    assert_eq!(codes, [0, 0, -32005], "{v}");
    s.stop();
}

/// A TCP connection to `addr` from source address `ip` (in 127.0.0.0/8).
fn connect_from(ip: impl Into<std::net::Ipv4Addr>, addr: SocketAddr) -> TcpStream {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.bind(&SocketAddr::new(ip.into().into(), 0).into())
        .unwrap();
    sock.connect(&addr.into()).unwrap();
    sock.into()
}

#[test]
fn anonymous_callers_are_limited_per_address() {
    let (s, _e) = serve(Guard::new().with_peer_rate_limit("1:5").unwrap());
    let mut a = Line::tcp(s.tcp);
    let batch: Vec<Value> = (1..=8).map(|i| req("ping", json!([]), i)).collect();
    let v = a.call(&Value::Array(batch.clone()));
    let limited = v
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| code(a) == -32005)
        .count();
    assert_eq!(limited, 3, "{v}");
    // Another connection from the same address shares the bucket...
    let mut b = Line::tcp(s.tcp);
    assert_eq!(code(&b.call(&req("ping", json!([]), 1))), -32005);
    // ...another address does not.
    let mut c = Line::from_tcp(connect_from([127, 0, 0, 2], s.tcp));
    assert_eq!(c.call(&req("ping", json!([]), 1))["result"], "pong");
    // Without keys, rpc.auth is not a method.
    assert_eq!(
        code(&c.call(&req("rpc.auth", json!({"token": "x"}), 2))),
        -32601
    );
    s.stop();
}

#[test]
fn a_flood_of_source_addresses_leaves_the_limiter_table_bounded() {
    // 100,000 distinct source addresses in 127.0.0.0/8, each on its own connection,
    // against a table of 10,000 per generation (never more than 20,000 held).
    const ADDRESSES: u32 = 100_000;
    const CAPACITY: usize = 10_000;
    let guard = Guard::new()
        .with_peer_rate_limit("1:1")
        .unwrap()
        .with_peer_table_capacity(CAPACITY);
    let (s, engine) = serve(guard);
    let threads: Vec<_> = (0..4u32)
        .map(|t| {
            let addr = s.tcp;
            std::thread::spawn(move || {
                let mut refused = 0;
                for i in (t..ADDRESSES).step_by(4) {
                    // 127.1.0.0 + i: skips 127.0.0.x, which other tests use.
                    let n = (1u32 << 16) + i;
                    let ip = std::net::Ipv4Addr::new(127, (n >> 16) as u8, (n >> 8) as u8, n as u8);
                    let mut c = Line::from_tcp(connect_from(ip, addr));
                    // Every address's first call passes: its bucket starts full.
                    if c.call(&req("ping", json!([]), 1))["result"] != "pong" {
                        refused += 1;
                    }
                }
                refused
            })
        })
        .collect();
    let refused: u32 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(refused, 0);
    let held = engine.guard().unwrap().peer_table_len();
    assert!(held <= 2 * CAPACITY, "{held} addresses held");
    assert!(held >= CAPACITY / 2, "the table is in use: {held}");
    s.stop();
}

#[test]
fn failed_authentications_are_limited_per_address() {
    // Three failures at once, then one per 100 s: nothing refills during the test.
    const A: [u8; 4] = [127, 2, 0, 1];
    const B: [u8; 4] = [127, 2, 0, 2];
    let guard = keys("").with_auth_failure_limit("0.01:3").unwrap();
    let (s, _e) = serve(guard);
    let auth = |token: &str, id| req("rpc.auth", json!({ "token": token }), id);
    let mut keep = Line::from_tcp(connect_from(A, s.tcp));
    assert_eq!(
        keep.call(&auth("s3cret-ops", 1))["result"]["identity"],
        "ops"
    );
    let mut c = Line::from_tcp(connect_from(A, s.tcp));
    // Authenticating is not a failure, and costs nothing.
    for id in 0..5 {
        assert_eq!(c.call(&auth("r3ader", id))["result"]["identity"], "reader");
    }
    for id in 10..13 {
        assert_eq!(code(&c.call(&auth("guess", id))), -32040);
    }
    // The fourth failure is not looked at: nor is a right token, from that address.
    for token in ["guess", "r3ader"] {
        let v = c.call(&auth(token, 20));
        assert_eq!((code(&v), &v["id"]), (-32005, &json!(20)), "{v}");
        assert_eq!(v["error"]["data"]["reason"], "rate_limited", "{v}");
        assert!(
            v["error"]["data"]["retryAfterMs"].as_u64().unwrap() > 90_000,
            "{v}"
        );
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains("failed authentications"), "{v}");
        // And it leaves the connection unauthenticated.
        assert_eq!(code(&c.call(&req("ping", json!([]), 21))), -32040);
    }
    // So does another connection from that address, over TCP or HTTP (429).
    let mut d = Line::from_tcp(connect_from(A, s.tcp));
    assert_eq!(code(&d.call(&auth("r3ader", 1))), -32005);
    let body = serde_json::to_vec(&req("ping", json!([]), 1)).unwrap();
    let bearer = [("Authorization", "Bearer r3ader")];
    let a = util::http::post_on(connect_from(A, s.http), &bearer, &body);
    assert_eq!((a.status, code(&a.body)), (429, -32005), "{}", a.body);
    let wait: u64 = a.header("retry-after").unwrap().parse().unwrap();
    assert!((90..=100).contains(&wait), "Retry-After: {wait}");
    // Another address is not limited, and its failures over HTTP count as over TCP.
    let a = util::http::post_on(connect_from(B, s.http), &bearer, &body);
    assert_eq!(
        (a.status, &a.body["result"]),
        (200, &json!("pong")),
        "{}",
        a.body
    );
    for _ in 0..3 {
        let a = util::http::post_on(
            connect_from(B, s.http),
            &[("Authorization", "Bearer no")],
            &body,
        );
        assert_eq!((a.status, code(&a.body)), (401, -32040), "{}", a.body);
    }
    let mut e = Line::from_tcp(connect_from(B, s.tcp));
    assert_eq!(code(&e.call(&auth("r3ader", 1))), -32005);
    // A connection that authenticated before keeps its identity.
    assert_eq!(keep.call(&req("ping", json!([]), 2))["result"], "pong");
    s.stop();
}

#[test]
fn failed_authentications_are_not_limited_unless_asked() {
    for guard in [keys(""), keys("").with_auth_failure_limit("off").unwrap()] {
        let (s, _e) = serve(guard);
        let mut c = Line::from_tcp(connect_from([127, 2, 0, 3], s.tcp));
        for id in 0..30 {
            let v = c.call(&req("rpc.auth", json!({"token": "guess"}), id));
            assert_eq!(code(&v), -32040, "call {id}: {v}");
        }
        s.stop();
    }
    let bad = Guard::new().with_auth_failure_limit("0");
    assert!(bad.unwrap_err().to_string().contains("rate"));
}

/// Attempts made at once from one address, on threads of their own, cannot look at
/// more tokens than the bucket holds: each is charged before its token is looked at.
#[test]
fn failed_authentications_at_once_do_not_overdraw_the_limit() {
    use ringrpc::guard::Session;
    use ringrpc::{Connection, Peer, Source, Transport};
    const THREADS: usize = 4;
    for trial in 0..200 {
        let guard = keys("").with_auth_failure_limit("0.001:1").unwrap();
        let engine = Arc::new(demo::engine(Config::default()).with_guard(guard));
        let start = Arc::new(std::sync::Barrier::new(THREADS));
        let looked: usize = (0..THREADS)
            .map(|t| {
                let (engine, start) = (Arc::clone(&engine), Arc::clone(&start));
                std::thread::spawn(move || {
                    let peer = Peer::Ip(SocketAddr::from(([10, 0, 0, 1], 1000 + t as u16)));
                    let conn = Connection::new(Transport::Tcp, peer, t as u64 + 1);
                    let session = Session::new();
                    let source = Source::new(&conn).with_session(&session);
                    let frame = br#"{"jsonrpc":"2.0","method":"rpc.auth","params":{"token":"guess"},"id":1}"#;
                    let (mut scratch, mut out) = (engine.scratch(), Vec::new());
                    start.wait();
                    let _ = engine.handle_from(frame, &source, &mut scratch, &mut out);
                    usize::from(String::from_utf8_lossy(&out).contains("-32040"))
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .sum();
        assert_eq!(
            looked, 1,
            "trial {trial}: {looked} tokens looked at, budget 1"
        );
    }
}

/// A JWT (HS256) for `secret` with `claims`, made here with the RustCrypto crates (the
/// engine's own unit tests check its verifier against PyJWT's tokens).
fn jwt(secret: &[u8; 32], claims: &Value) -> String {
    use base64::Engine as _;
    use hmac::Mac;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let head = b64.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let body = b64.encode(serde_json::to_vec(claims).unwrap());
    let signed = format!("{head}.{body}");
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret).unwrap();
    mac.update(signed.as_bytes());
    format!("{signed}.{}", b64.encode(mac.finalize().into_bytes()))
}

#[test]
fn jwt_callers_over_http_and_tcp() {
    let secret = [7u8; 32];
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    let path = temp_file("jwt.hex", &format!("0x{hex}\n"));
    let (s, _e) = serve(Guard::new().with_jwt_secret_file(&path).unwrap());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let good = jwt(&secret, &json!({"iat": now, "sub": "node-1"}));
    let bearer = format!("Bearer {good}");
    let (status, _, body) = post(
        s.http,
        &[("Authorization", &bearer)],
        &req("whoami", json!([]), 1),
    );
    assert_eq!(
        (status, &body["result"]["identity"]),
        (200, &json!("node-1")),
        "{body}"
    );

    for bad in [
        jwt(&secret, &json!({"iat": now - 120})),
        jwt(&[8u8; 32], &json!({"iat": now})),
        jwt(&secret, &json!({"iat": now, "exp": now - 1})),
    ] {
        let bearer = format!("Bearer {bad}");
        let (status, _, body) = post(
            s.http,
            &[("Authorization", &bearer)],
            &req("ping", json!([]), 1),
        );
        assert_eq!((status, code(&body)), (401, -32040), "{body}");
    }

    // On TCP the token goes to rpc.auth; without `sub` the identity is "jwt".
    let mut c = Line::tcp(s.tcp);
    let anon = jwt(&secret, &json!({"iat": now}));
    let v = c.call(&req("rpc.auth", json!({"token": anon}), 1));
    assert_eq!(v["result"]["identity"], "jwt", "{v}");
    assert_eq!(c.call(&req("echo", json!([1]), 2))["result"], json!([1]));

    // Presented once, a token holds until its `exp`, not past it.
    let mut c = Line::tcp(s.tcp);
    let brief = jwt(&secret, &json!({"iat": now, "exp": now + 2}));
    let v = c.call(&req("rpc.auth", json!({"token": brief}), 1));
    assert_eq!(v["result"]["identity"], "jwt", "{v}");
    assert_eq!(c.call(&req("ping", json!([]), 2))["result"], "pong");
    let until = std::time::UNIX_EPOCH + std::time::Duration::from_secs(now + 2);
    if let Ok(left) = until.duration_since(std::time::SystemTime::now()) {
        std::thread::sleep(left + std::time::Duration::from_millis(100));
    }
    let v = c.call(&req("ping", json!([]), 3));
    assert_eq!(code(&v), -32040, "{v}");
    assert_eq!(
        v["error"]["message"]
            .as_str()
            .map(|m| m.contains("expired")),
        Some(true),
        "{v}"
    );
    s.stop();
    let _ = std::fs::remove_file(&path);
}
