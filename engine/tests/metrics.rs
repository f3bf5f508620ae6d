//! Metrics over real sockets, read back with a real Prometheus parser (the Python
//! `prometheus_client` package's): exact counts after a known mix of calls on TCP and
//! HTTP, bounded method labels, gauges, events, and the separate metrics listener.
//!
//! Needs `python3` with `prometheus_client` (`pip install prometheus_client`; `.ci/run`
//! installs it).

mod util;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringrpc::dedup::Dedup;
use ringrpc::guard::Guard;
use ringrpc::server::Server;
use ringrpc::{demo, Config, Engine, ServerConfig};
use serde_json::{json, Value};
use util::http::post;
use util::server::Served;

const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// One sample as the parser read it.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Every sample of a scrape, by (name, labels).
struct Scrape(Vec<Sample>);

impl Scrape {
    /// The value of the series `name{labels}` (labels given must match exactly).
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let want: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.0
            .iter()
            .find(|s| s.name == name && s.labels == want)
            .map(|s| s.value)
    }

    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels)
            .unwrap_or_else(|| panic!("no series {name}{labels:?} in {:#?}", self.0))
    }

    /// The set of series (name and labels) of the scrape.
    fn series(&self) -> BTreeSet<String> {
        self.0
            .iter()
            .map(|s| format!("{}{:?}", s.name, s.labels))
            .collect()
    }
}

/// Parses `text` with `prometheus_client.parser` in a child Python.
fn parse(text: &str) -> Scrape {
    const SCRIPT: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = []
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        out.append({"name": s.name, "labels": s.labels, "value": s.value, "type": family.type})
print(json.dumps(out))
"#;
    let mut child = Command::new("python3")
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("this test needs python3 (with prometheus_client: pip install prometheus_client)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "prometheus_client could not parse the scrape (pip install prometheus_client): {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let samples: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let samples: Vec<Sample> = samples
        .into_iter()
        .map(|s| Sample {
            name: s["name"].as_str().unwrap().to_owned(),
            labels: serde_json::from_value(s["labels"].clone()).unwrap(),
            value: s["value"].as_f64().unwrap(),
        })
        .collect();
    let scrape = Scrape(samples);
    // The parser keeps duplicates; the format forbids them.
    assert_eq!(
        scrape.series().len(),
        scrape.0.len(),
        "a series twice in\n{text}"
    );
    scrape
}

/// `GET path` on `addr`: the status, the `Content-Type` and the body.
fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let mut hs = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut hs);
    let Ok(httparse::Status::Complete(at)) = resp.parse(&raw) else {
        panic!("not an HTTP response: {}", String::from_utf8_lossy(&raw));
    };
    let content_type = resp
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-type"))
        .map(|h| String::from_utf8_lossy(h.value).into_owned())
        .unwrap_or_default();
    let body = String::from_utf8(raw[at..].to_vec()).unwrap();
    (resp.code.unwrap(), content_type, body)
}

fn scrape(addr: SocketAddr) -> Scrape {
    let (status, content_type, body) = get(addr, "/metrics");
    assert_eq!(status, 200, "{body}");
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    parse(&body)
}

/// Scrapes until `ok` holds (the server notices closed connections on its own time).
fn scrape_until(addr: SocketAddr, what: &str, ok: impl Fn(&Scrape) -> bool) -> Scrape {
    let deadline = Instant::now() + IO_TIMEOUT;
    loop {
        let s = scrape(addr);
        if ok(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "never saw {what}: {:#?}", s.0);
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A newline connection that counts the bytes it sends and receives.
struct Tcp {
    r: BufReader<TcpStream>,
    sent: usize,
    received: usize,
}

impl Tcp {
    fn connect(addr: SocketAddr) -> Self {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        Self {
            r: BufReader::new(s),
            sent: 0,
            received: 0,
        }
    }

    /// Sends `lines` in one write, then reads `answers` answer lines.
    fn pipeline(&mut self, lines: &[String], answers: usize) -> Vec<Value> {
        let mut bytes = Vec::new();
        for l in lines {
            bytes.extend_from_slice(l.as_bytes());
            bytes.push(b'\n');
        }
        self.r.get_mut().write_all(&bytes).unwrap();
        self.sent += bytes.len();
        (0..answers)
            .map(|_| {
                let mut line = String::new();
                self.r.read_line(&mut line).unwrap();
                self.received += line.len();
                serde_json::from_str(&line).unwrap()
            })
            .collect()
    }
}

fn call(method: &str, params: Value, id: u64) -> String {
    json!({"jsonrpc": "2.0", "method": method, "params": params, "id": id}).to_string()
}

#[test]
fn a_known_mix_is_counted_exactly() {
    let served = Served::start(demo::engine(Config::default()), ServerConfig::default());
    let before = scrape(served.http);

    let mut tcp = Tcp::connect(served.tcp);
    let adds: Vec<String> = (0..1000).map(|i| call("add", json!([i, 1]), i)).collect();
    let answers = tcp.pipeline(&adds, 1000);
    assert!(answers.iter().all(|a| a["result"].is_i64()));

    let mut bad: Vec<String> = (0..3).map(|i| call("add", json!(["x"]), i)).collect();
    bad.extend((0..5).map(|i| call("nope", json!([]), i)));
    bad.push("{bad json".to_owned());
    bad.push("[1,".to_owned());
    bad.push(r#"{"jsonrpc":"2.0","id":1}"#.to_owned());
    let answers = tcp.pipeline(&bad, bad.len());
    let codes: Vec<i64> = answers
        .iter()
        .map(|a| a["error"]["code"].as_i64().unwrap())
        .collect();
    let mut want = vec![-32602; 3];
    want.extend([-32601; 5]);
    want.extend([-32700, -32700, -32600]);
    assert_eq!(codes, want);

    // Blocking calls, counted when the pool answers them.
    let sleeps: Vec<String> = (0..3).map(|i| call("sleep", json!({"ms": 2}), i)).collect();
    tcp.pipeline(&sleeps, 3);

    // Two batches over HTTP: 10 calls; 2 calls and a notification.
    let batch: Vec<Value> = (0..10)
        .map(|i| json!({"jsonrpc": "2.0", "method": "add", "params": [i, i], "id": i}))
        .collect();
    assert_eq!(post(served.http, &[], &json!(batch)).status, 200);
    let batch = json!([
        {"jsonrpc": "2.0", "method": "add", "params": [1, 1], "id": "a"},
        {"jsonrpc": "2.0", "method": "notify_sum", "params": [1, 2]},
        {"jsonrpc": "2.0", "method": "add", "params": [2, 2], "id": "b"},
    ]);
    assert_eq!(post(served.http, &[], &batch).status, 200);
    // A deferred method, answered from another thread.
    let delayed = post(
        served.http,
        &[],
        &json!({"jsonrpc": "2.0", "method": "delay", "params": [1], "id": 1}),
    );
    assert!(delayed.body.get("result").is_some(), "{}", delayed.body);

    let series_before = scrape(served.http).series();
    // 10,000 names nobody registered: counted, never a new series.
    let unknown: Vec<String> = (0..10_000)
        .map(|i| call(&format!("random_{i}_{:x}", i * 7919), json!([]), i))
        .collect();
    tcp.pipeline(&unknown, unknown.len());
    let (sent, received) = (tcp.sent, tcp.received);
    drop(tcp);

    let s = scrape_until(served.http, "the TCP connection closed", |s| {
        s.get("ringrpc_connections", &[("transport", "tcp")]) == Some(0.0)
    });
    let req = |m: &str, t: &str, c: &str| {
        s.value(
            "ringrpc_requests_total",
            &[("method", m), ("transport", t), ("code", c)],
        )
    };
    assert_eq!(req("add", "tcp", "0"), 1000.0);
    assert_eq!(req("add", "tcp", "-32602"), 3.0);
    assert_eq!(req("unknown", "tcp", "-32601"), 10_005.0);
    assert_eq!(req("unknown", "tcp", "-32700"), 2.0);
    assert_eq!(req("unknown", "tcp", "-32600"), 1.0);
    assert_eq!(req("sleep", "tcp", "0"), 3.0);
    assert_eq!(req("add", "http", "0"), 12.0);
    assert_eq!(req("notify_sum", "http", "0"), 1.0);
    assert_eq!(req("delay", "http", "0"), 1.0);
    let requests: f64 =
        s.0.iter()
            .filter(|x| x.name == "ringrpc_requests_total")
            .map(|x| x.value)
            .sum();
    assert_eq!(requests, 1000.0 + 3.0 + 10_005.0 + 3.0 + 3.0 + 13.0 + 1.0);

    // The duration histogram: counts match, buckets are cumulative, sums are sane.
    let count = s.value(
        "ringrpc_request_duration_seconds_count",
        &[("method", "add")],
    );
    assert_eq!(count, 1015.0);
    let inf = s.value(
        "ringrpc_request_duration_seconds_bucket",
        &[("method", "add"), ("le", "+Inf")],
    );
    assert_eq!(inf, count);
    let mut buckets: Vec<(f64, f64)> =
        s.0.iter()
            .filter(|x| {
                x.name == "ringrpc_request_duration_seconds_bucket"
                    && x.labels.get("method").map(String::as_str) == Some("add")
            })
            .map(|x| (x.labels["le"].parse::<f64>().unwrap(), x.value))
            .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert_eq!(buckets.len(), 23);
    assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1), "{buckets:?}");
    assert_eq!(buckets[0].0, 1e-6);
    assert_eq!(buckets[21].0, 10.0);
    let sum = s.value("ringrpc_request_duration_seconds_sum", &[("method", "add")]);
    assert!(sum > 0.0 && sum < 10.0, "{sum}");
    // Each sleep took its 2 ms at least, from read to answer.
    let slept = s.value(
        "ringrpc_request_duration_seconds_sum",
        &[("method", "sleep")],
    );
    assert!(slept >= 0.006, "{slept}");
    let fast = s.value(
        "ringrpc_request_duration_seconds_bucket",
        &[("method", "sleep"), ("le", "0.001")],
    );
    assert_eq!(fast, 0.0, "a 2 ms sleep is not under 1 ms");

    assert_eq!(s.value("ringrpc_batch_size_count", &[]), 2.0);
    assert_eq!(s.value("ringrpc_batch_size_sum", &[]), 13.0);
    assert_eq!(s.value("ringrpc_batch_size_bucket", &[("le", "2.0")]), 0.0);
    assert_eq!(s.value("ringrpc_batch_size_bucket", &[("le", "4.0")]), 1.0);
    assert_eq!(s.value("ringrpc_batch_size_bucket", &[("le", "16.0")]), 2.0);

    // Every byte of the TCP connection, both ways.
    let bytes = |name: &str| s.value(name, &[("transport", "tcp")]);
    assert_eq!(bytes("ringrpc_bytes_received_total"), sent as f64);
    assert_eq!(bytes("ringrpc_bytes_sent_total"), received as f64);
    assert!(s.value("ringrpc_bytes_received_total", &[("transport", "http")]) > 0.0);

    // The scrape's own connection is open while it is answered.
    assert_eq!(
        s.value("ringrpc_connections", &[("transport", "http")]),
        1.0
    );
    assert_eq!(s.value("ringrpc_inflight_calls", &[]), 0.0);
    assert_eq!(s.value("ringrpc_pool_queue_depth", &[]), 0.0);
    for event in [
        "ringrpc_auth_failures_total",
        "ringrpc_rate_limited_total",
        "ringrpc_dedup_replays_total",
        "ringrpc_deadline_exceeded_total",
    ] {
        assert_eq!(s.value(event, &[]), 0.0, "{event}");
    }
    for process in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ] {
        assert!(s.value(process, &[]) > 0.0, "{process}");
    }

    // The unknown names added no series: the ones after are the ones before (the
    // counters' values aside).
    let after = s.series();
    let new: Vec<&String> = after.difference(&series_before).collect();
    assert!(new.is_empty(), "new series: {new:?}");
    assert!(before.series().len() < series_before.len());
    served.stop();
}

#[test]
fn gauges_follow_calls_in_flight_and_the_pool_queue() {
    let settings = ServerConfig::default().workers(1);
    let served = Served::start(demo::engine(Config::default()), settings);
    // One worker: the first sleep runs, the next two wait in the queue.
    let conns: Vec<Tcp> = (0..3)
        .map(|i| {
            let mut c = Tcp::connect(served.tcp);
            let line = format!("{}\n", call("sleep", json!({"ms": 1500}), i));
            c.r.get_mut().write_all(line.as_bytes()).unwrap();
            // In order, so the first is the one running.
            std::thread::sleep(Duration::from_millis(50));
            c
        })
        .collect();
    let s = scrape_until(served.http, "3 in flight, 2 queued", |s| {
        s.get("ringrpc_inflight_calls", &[]) == Some(3.0)
            && s.get("ringrpc_pool_queue_depth", &[]) == Some(2.0)
    });
    assert_eq!(s.value("ringrpc_connections", &[("transport", "tcp")]), 3.0);
    drop(conns);
    // Closing the connections gives their calls up: none stays in flight.
    scrape_until(served.http, "nothing in flight", |s| {
        s.get("ringrpc_inflight_calls", &[]) == Some(0.0)
            && s.get("ringrpc_connections", &[("transport", "tcp")]) == Some(0.0)
    });
    served.stop();
}

#[test]
fn refusals_replays_and_deadlines_are_counted() {
    // Authentication: a missing token over HTTP (401), a call before rpc.auth on TCP.
    let keys = r#"
[[key]]
name = "ops"
token = "s3cret"
allow = ["*"]
"#;
    let engine =
        demo::engine(Config::default()).with_guard(Guard::new().with_keys_toml(keys).unwrap());
    let served = Served::start(engine, ServerConfig::default());
    assert_eq!(
        post(
            served.http,
            &[],
            &json!({"jsonrpc": "2.0", "method": "ping", "id": 1})
        )
        .status,
        401
    );
    let mut tcp = Tcp::connect(served.tcp);
    let a = tcp.pipeline(&[call("ping", json!([]), 1)], 1);
    assert_eq!(a[0]["error"]["code"], json!(-32040));
    let bad = tcp.pipeline(&[call("rpc.auth", json!({"token": "wrong"}), 2)], 1);
    assert_eq!(bad[0]["error"]["code"], json!(-32040));
    // The metrics path is no JSON-RPC call: no token asked (serve it apart, with
    // `listen_metrics`, where callers must not see it).
    let s = scrape(served.http);
    assert_eq!(s.value("ringrpc_auth_failures_total", &[]), 3.0);
    assert_eq!(
        s.value(
            "ringrpc_requests_total",
            &[("method", "ping"), ("transport", "tcp"), ("code", "-32040")]
        ),
        1.0
    );
    served.stop();

    // Rate limits: each batch element.
    let engine = demo::engine(Config::default())
        .with_guard(Guard::new().with_peer_rate_limit("1:2").unwrap());
    let served = Served::start(engine, ServerConfig::default());
    let batch: Vec<Value> = (0..5)
        .map(|i| json!({"jsonrpc": "2.0", "method": "ping", "id": i}))
        .collect();
    let mut tcp = Tcp::connect(served.tcp);
    tcp.pipeline(&[json!(batch).to_string()], 1);
    // The scrape itself is not charged: it is no JSON-RPC call.
    let s = scrape(served.http);
    assert_eq!(s.value("ringrpc_rate_limited_total", &[]), 3.0);
    assert_eq!(
        s.value(
            "ringrpc_requests_total",
            &[("method", "ping"), ("transport", "tcp"), ("code", "-32005")]
        ),
        3.0
    );
    served.stop();

    // De-duplication replays, and deadlines.
    let config = Config::default().request_timeout(Some(Duration::from_millis(100)));
    let engine = demo::engine(config).with_dedup(Dedup::memory(1 << 20, Duration::from_secs(60)));
    let served = Served::start(engine, ServerConfig::default());
    let incr = json!({"jsonrpc": "2.0", "method": "incr", "params": [1], "id": 1});
    let key = [("Idempotency-Key", "k-1")];
    let first = post(served.http, &key, &incr);
    let again = post(served.http, &key, &incr);
    assert_eq!(first.body["result"], again.body["result"]);
    let mut tcp = Tcp::connect(served.tcp);
    let late = tcp.pipeline(&[call("sleep", json!({"ms": 400}), 9)], 1);
    assert_eq!(late[0]["error"]["code"], json!(-32001));
    let s = scrape(served.http);
    assert_eq!(s.value("ringrpc_dedup_replays_total", &[]), 1.0);
    assert_eq!(s.value("ringrpc_deadline_exceeded_total", &[]), 1.0);
    assert_eq!(
        s.value(
            "ringrpc_requests_total",
            &[
                ("method", "sleep"),
                ("transport", "tcp"),
                ("code", "-32001")
            ]
        ),
        1.0
    );
    assert_eq!(
        s.value(
            "ringrpc_requests_total",
            &[("method", "incr"), ("transport", "http"), ("code", "0")]
        ),
        2.0
    );
    served.stop();
}

/// A batch element answered by the pool whose answer the batch's `max_response_bytes`
/// cut to -32002 is counted as -32002, what the client got, not as its handler's
/// result.
#[test]
fn a_pool_answer_cut_for_size_is_counted_as_cut() {
    let mut b = ringrpc::Registry::builder();
    b.blocking_method(
        "big",
        |_: ringrpc::Params<'_>| -> Result<String, ringrpc::RpcError> { Ok("x".repeat(150)) },
    )
    .unwrap();
    let engine = Engine::new(b.freeze(), Config::default().max_response_bytes(400));
    let served = Served::start(engine, ServerConfig::default());
    let batch: Vec<Value> = (1..=3)
        .map(|i| json!({"jsonrpc": "2.0", "method": "big", "id": i}))
        .collect();
    let mut tcp = Tcp::connect(served.tcp);
    let answer = tcp.pipeline(&[json!(batch).to_string()], 1);
    let elements = answer[0].as_array().expect("a batch answer");
    let cut = elements
        .iter()
        .filter(|a| a["error"]["code"] == json!(-32002))
        .count();
    assert!(cut >= 1, "{answer:?}");
    let s = scrape(served.http);
    let count = |code: &str| {
        s.value(
            "ringrpc_requests_total",
            &[("method", "big"), ("transport", "tcp"), ("code", code)],
        )
    };
    assert_eq!(count("-32002"), cut as f64);
    assert_eq!(count("0"), (3 - cut) as f64);
    served.stop();
}

/// HTTP requests refused before any call (404, 405) and connections refused at
/// `max_connections` are counted.
#[test]
fn refused_http_requests_and_connections_are_counted() {
    let settings = ServerConfig::default().max_connections(2);
    let served = Served::start(demo::engine(Config::default()), settings);
    assert_eq!(get(served.http, "/nope").0, 404);
    assert_eq!(get(served.http, "/").0, 405);
    // Two open, the third refused: accepted and closed at once.
    let mut held: Vec<Tcp> = (1..=2).map(|_| Tcp::connect(served.tcp)).collect();
    for (i, t) in held.iter_mut().enumerate() {
        let a = t.pipeline(&[call("ping", json!([]), i as u64)], 1);
        assert_eq!(a[0]["result"], "pong");
    }
    let mut third = TcpStream::connect(served.tcp).unwrap();
    third.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let mut rest = Vec::new();
    assert_eq!(
        third.read_to_end(&mut rest).unwrap_or(0),
        0,
        "refused: closed"
    );
    drop(held);
    // The scrape's own connection is let in once the server has seen the two close.
    let deadline = Instant::now() + IO_TIMEOUT;
    let s = loop {
        if let Some(s) = try_scrape(served.http) {
            break s;
        }
        assert!(Instant::now() < deadline, "no scrape let in");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(s.value("ringrpc_http_refused_total", &[]), 2.0);
    assert_eq!(s.value("ringrpc_connections_refused_total", &[]), 1.0);
    served.stop();
}

/// A scrape, or `None` if the connection was refused.
fn try_scrape(addr: SocketAddr) -> Option<Scrape> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(IO_TIMEOUT)).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8(raw).ok()?;
    let (_, body) = text.split_once("\r\n\r\n")?;
    text.starts_with("HTTP/1.1 200").then(|| parse(body))
}

#[test]
fn a_metrics_listener_serves_metrics_only() {
    let engine = Arc::new(demo::engine(Config::default()));
    let mut server = Server::with_config(Arc::clone(&engine), ServerConfig::default()).unwrap();
    let tcp = server.listen_tcp("127.0.0.1:0").unwrap();
    let metrics = server.listen_metrics("127.0.0.1:0").unwrap();
    let handle = server.handle();
    let thread = std::thread::spawn(move || server.run());

    let mut c = Tcp::connect(tcp);
    c.pipeline(&[call("ping", json!([]), 1)], 1);
    let s = scrape(metrics);
    assert_eq!(
        s.value(
            "ringrpc_requests_total",
            &[("method", "ping"), ("transport", "tcp"), ("code", "0")]
        ),
        1.0
    );
    // The same registry, for a host to serve on its own endpoint.
    let text = engine.metrics().unwrap().render();
    assert!(text.contains(r#"ringrpc_requests_total{method="ping",transport="tcp",code="0"} 1"#));
    assert_eq!(get(metrics, "/health").0, 200);
    // No JSON-RPC there.
    let mut s = TcpStream::connect(metrics).unwrap();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let body = r#"{"jsonrpc":"2.0","method":"ping","id":1}"#;
    write!(
        s,
        "POST / HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 404 "), "{answer}");
    handle.shutdown();
    thread.join().unwrap().unwrap();

    // Metrics off: nothing served, and no listener for them.
    let engine = demo::engine(Config::default()).without_metrics();
    assert!(engine.metrics().is_none());
    let mut server = Server::with_config(engine, ServerConfig::default()).unwrap();
    assert!(server.listen_metrics("127.0.0.1:0").is_err());
    let http = server.listen_http("127.0.0.1:0").unwrap();
    let handle = server.handle();
    let thread = std::thread::spawn(move || server.run());
    assert_eq!(get(http, "/metrics").0, 404);
    handle.shutdown();
    thread.join().unwrap().unwrap();
}

#[test]
fn embedded_engines_count_per_transport_and_alone() {
    let a = Engine::new(demo::registry(), Config::default());
    let b = Engine::new(demo::registry(), Config::default());
    let (mut scratch, mut out) = (a.scratch(), Vec::new());
    for _ in 0..5 {
        out.clear();
        let _ = a.handle(
            br#"{"jsonrpc":"2.0","method":"ping","id":1}"#,
            &mut scratch,
            &mut out,
        );
    }
    out.clear();
    let _ = b.handle(
        br#"{"jsonrpc":"2.0","method":"ping","id":1}"#,
        &mut scratch,
        &mut out,
    );
    let s = parse(&a.metrics().unwrap().render());
    let ping = [("method", "ping"), ("transport", "embedded"), ("code", "0")];
    assert_eq!(s.value("ringrpc_requests_total", &ping), 5.0);
    let s = parse(&b.metrics().unwrap().render());
    assert_eq!(s.value("ringrpc_requests_total", &ping), 1.0);
}

#[test]
fn embedded_lines_are_counted_per_buffer_with_their_frame_errors() {
    // `handle_lines` times a buffer's calls together, as the server times a read;
    // every call is still counted once, and a line over the limit as a -32600.
    let engine = Engine::new(demo::registry(), Config::default().max_request_bytes(64));
    let (mut scratch, mut out) = (engine.scratch(), Vec::new());
    let mut decoder = engine.decoder();
    let ping = r#"{"jsonrpc":"2.0","method":"ping","id":1}"#;
    let long = format!(
        r#"{{"jsonrpc":"2.0","method":"echo","params":["{}"],"id":2}}"#,
        "x".repeat(80)
    );
    let mut buf = bytes::BytesMut::from(format!("{ping}\n{ping}\n{long}\n{ping}\n").as_bytes());
    let replies = engine.handle_lines(&mut buf, &mut decoder, &mut scratch, &mut out);
    assert_eq!(replies, 4);
    let mut buf = bytes::BytesMut::from(format!("{ping}\n").as_bytes());
    assert_eq!(
        engine.handle_lines(&mut buf, &mut decoder, &mut scratch, &mut out),
        1
    );
    let s = parse(&engine.metrics().unwrap().render());
    let ping = [("method", "ping"), ("transport", "embedded"), ("code", "0")];
    assert_eq!(s.value("ringrpc_requests_total", &ping), 4.0);
    let refused = [
        ("method", "unknown"),
        ("transport", "embedded"),
        ("code", "-32600"),
    ];
    assert_eq!(s.value("ringrpc_requests_total", &refused), 1.0);
    let count = s.value(
        "ringrpc_request_duration_seconds_count",
        &[("method", "ping")],
    );
    assert_eq!(count, 4.0);
}
