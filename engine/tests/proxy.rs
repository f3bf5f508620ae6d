//! The proxy over real sockets: the same answers as the upstream gives directly, ids
//! that never cross, routing, notifications, and every upstream failure answered.

mod util;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringrpc::proxy::{Proxy, ProxyBuilder};
use ringrpc::{demo, Config, Engine, Params, Registry, RpcError, ServerConfig};
use serde_json::{json, Value};
use util::server::Served;

/// Serves `proxy` as the fallback of an otherwise empty registry.
fn served_proxy(proxy: &Proxy, config: Config) -> Served {
    let mut methods = Registry::builder();
    proxy.install(&mut methods).unwrap();
    let engine = Engine::new(methods.freeze(), config);
    if let Some(m) = engine.metrics() {
        proxy.export_metrics(m);
    }
    Served::start(engine, ServerConfig::default())
}

/// The value of the sample `series` (name and labels, exactly) in a scrape of `addr`.
fn scraped(addr: SocketAddr, series: &str) -> Option<f64> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut s, &mut text).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn builder_to(upstream: &Served) -> ProxyBuilder {
    let mut b = Proxy::builder();
    b.upstream("default", &format!("tcp://{}", upstream.tcp));
    b
}

/// Sends `frame` on a fresh line connection followed by a `ping` with a marker id, and
/// returns every answer line before the marker's (none for notifications).
fn tcp_answers(addr: SocketAddr, frame: &str) -> Vec<Value> {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut r = BufReader::new(s);
    let marker = r#"{"jsonrpc":"2.0","method":"ping","id":"marker-7f3a"}"#;
    r.get_mut()
        .write_all(format!("{frame}\n{marker}\n").as_bytes())
        .unwrap();
    let mut answers = Vec::new();
    loop {
        let mut line = String::new();
        assert!(r.read_line(&mut line).unwrap() > 0, "closed after {frame}");
        let v: Value = serde_json::from_str(&line).unwrap();
        if v["id"] == "marker-7f3a" {
            return answers;
        }
        answers.push(v);
    }
}

/// Frames covering the specification's examples, the common mistakes, exotic ids,
/// notifications, errors with data, and batches of every kind.
fn corpus() -> Vec<String> {
    let mut frames: Vec<String> = [
        r#"{"jsonrpc":"2.0","method":"subtract","params":[42,23],"id":1}"#,
        r#"{"jsonrpc":"2.0","method":"subtract","params":[23,42],"id":2}"#,
        r#"{"jsonrpc":"2.0","method":"subtract","params":{"subtrahend":23,"minuend":42},"id":3}"#,
        r#"{"jsonrpc":"2.0","method":"subtract","params":{"minuend":42,"subtrahend":23},"id":4}"#,
        r#"{"jsonrpc":"2.0","method":"update","params":[1,2,3,4,5]}"#,
        r#"{"jsonrpc":"2.0","method":"foobar"}"#,
        r#"{"jsonrpc":"2.0","method":"foobar","id":"1"}"#,
        r#"{"jsonrpc":"2.0","method":"foobar,"params":"bar","baz]"#,
        r#"{"jsonrpc":"2.0","method":1,"params":"bar"}"#,
        r#"[{"jsonrpc":"2.0","method":"sum","params":[1,2,4],"id":"1"},{"jsonrpc":"2.0","method""#,
        r#"[]"#,
        r#"[1]"#,
        r#"[1,2,3]"#,
        r#"[{"jsonrpc":"2.0","method":"sum","params":[1,2,4],"id":"1"},{"jsonrpc":"2.0","method":"notify_hello","params":[7]},{"jsonrpc":"2.0","method":"subtract","params":[42,23],"id":"2"},{"foo":"boo"},{"jsonrpc":"2.0","method":"foo.get","params":{"name":"myself"},"id":"5"},{"jsonrpc":"2.0","method":"get_data","id":"9"}]"#,
        r#"[{"jsonrpc":"2.0","method":"notify_sum","params":[1,2,4]},{"jsonrpc":"2.0","method":"notify_hello","params":[7]}]"#,
        // The mistakes: no version, wrong version, result and error, bad params.
        r#"{"method":"subtract","params":[1,2],"id":1}"#,
        r#"{"jsonrpc":"1.0","method":"subtract","params":[1,2],"id":1}"#,
        r#"{"jsonrpc":"2.0","method":"subtract","params":7,"id":1}"#,
        r#"{"jsonrpc":"2.0","method":"subtract","params":{"Minuend":1,"subtrahend":2},"id":1}"#,
        r#"{"jsonrpc":"2.0","method":"subtract","params":["a",2],"id":1}"#,
        r#"{"jsonrpc":"2.0","method":"add","params":[9223372036854775807,1],"id":1}"#,
        r#"{"jsonrpc":"2.0","method":"rpc.discover","id":1}"#,
        r#"{"jsonrpc":"2.0","method":"get_data","id":{"an":"object"}}"#,
        // Ids of every kind, echoed as the server echoes them.
        r#"{"jsonrpc":"2.0","method":"ping","id":null}"#,
        r#"{"jsonrpc":"2.0","method":"ping","id":0}"#,
        r#"{"jsonrpc":"2.0","method":"ping","id":-1}"#,
        r#"{"jsonrpc":"2.0","method":"ping","id":18446744073709551615}"#,
        r#"{"jsonrpc":"2.0","method":"ping","id":-9223372036854775808}"#,
        r#"{"jsonrpc":"2.0","method":"ping","id":1.5}"#,
        r#"{"jsonrpc":"2.0","method":"ping","id":2.5e-3}"#,
        r#"{"jsonrpc":"2.0","method":"ping","id":""}"#,
        r#"{"jsonrpc":"2.0","method":"ping","id":"a\"b\\c\u00e9\ud83d\ude00"}"#,
        r#"{"jsonrpc":"2.0","method":"ping","id":"é"}"#,
        // Params and results passed through byte for byte.
        r#"{"jsonrpc":"2.0","method":"echo","params":{"s":"x\ny\t\"q\"\u0000","n":[1.0,-0.0,1e308,12345678901234567890],"e":{},"a":[[]]},"id":7}"#,
        r#"{"jsonrpc":"2.0","method":"echo","params":[  1 ,  {"k" :  "v" } ],"id":8}"#,
        r#"{"jsonrpc":"2.0","method":"echo","id":9}"#,
        r#"{"jsonrpc":"2.0","method":"sleep","params":{"ms":1},"id":10}"#,
        r#"{"jsonrpc":"2.0","method":"delay","params":[5],"id":11}"#,
        r#"{"jsonrpc":"2.0","method":"delay","params":[600001],"id":12}"#,
        r#"{"jsonrpc":"2.0","method":"notify_hello","params":[1],"id":13}"#,
        // Duplicate ids within a batch.
        r#"[{"jsonrpc":"2.0","method":"add","params":[1,1],"id":1},{"jsonrpc":"2.0","method":"add","params":[2,2],"id":1},{"jsonrpc":"2.0","method":"add","params":[3,3],"id":1}]"#,
    ]
    .map(str::to_owned)
    .into();
    // A batch of 100 calls mixing inline, pool and deferred methods.
    let elements: Vec<String> = (0..100)
        .map(|i| match i % 4 {
            0 => format!(r#"{{"jsonrpc":"2.0","method":"add","params":[{i},1],"id":{i}}}"#),
            1 => format!(r#"{{"jsonrpc":"2.0","method":"echo","params":[{i}],"id":"s{i}"}}"#),
            2 => format!(r#"{{"jsonrpc":"2.0","method":"delay","params":[1],"id":{i}}}"#),
            _ => format!(r#"{{"jsonrpc":"2.0","method":"update","params":[{i}]}}"#),
        })
        .collect();
    frames.push(format!("[{}]", elements.join(",")));
    // A large result.
    let big = "x".repeat(200_000);
    frames.push(format!(
        r#"{{"jsonrpc":"2.0","method":"echo","params":["{big}"],"id":"big"}}"#
    ));
    frames
}

#[test]
fn answers_through_the_proxy_are_the_answers_direct() {
    let upstream = Served::start(demo::engine(Config::default()), ServerConfig::default());
    for url in [
        format!("tcp://{}", upstream.tcp),
        format!("http://{}/", upstream.http),
        format!("unix://{}", upstream.unix.display()),
    ] {
        let mut b = Proxy::builder();
        b.upstream("default", &url);
        let proxy = b.start().unwrap();
        same_answers(&upstream, &proxy);
        drop(proxy);
    }
    upstream.stop();
}

fn same_answers(upstream: &Served, proxy: &Proxy) {
    let front = served_proxy(proxy, Config::default());
    for frame in corpus() {
        let direct = tcp_answers(upstream.tcp, &frame);
        let proxied = tcp_answers(front.tcp, &frame);
        assert_eq!(proxied, direct, "tcp: {frame:.300}");
        // A batch's answers come in its order, whichever were answered later.
        if let (Ok(Value::Array(sent)), Some(Value::Array(got))) =
            (serde_json::from_str::<Value>(&frame), proxied.first())
        {
            let want: Vec<&Value> = sent
                .iter()
                .filter(|e| e.get("id").is_some() || e.get("method").is_none())
                .map(|e| e.get("id").unwrap_or(&Value::Null))
                .collect();
            let got: Vec<&Value> = got.iter().map(|a| &a["id"]).collect();
            assert_eq!(got, want, "order: {frame:.300}");
        }

        let direct = util::http::post_raw(upstream.http, &[], frame.as_bytes());
        let proxied = util::http::post_raw(front.http, &[], frame.as_bytes());
        assert_eq!(proxied.status, direct.status, "http: {frame:.300}");
        assert_eq!(proxied.body, direct.body, "http: {frame:.300}");
    }
    // Over HTTP a body may span lines: the forwarded request stays one line.
    let pretty = "{\n  \"jsonrpc\": \"2.0\",\n  \"method\": \"echo\",\n  \"params\": {\n    \"a\": [1,\r\n 2]\n  },\n  \"id\": 1\n}";
    let proxied = util::http::post_raw(front.http, &[], pretty.as_bytes());
    assert_eq!(
        proxied.body,
        json!({"jsonrpc": "2.0", "id": 1, "result": {"a": [1, 2]}})
    );
    front.stop();
}

/// Each of 32 clients pipelines calls that all use id 1 (and batches of three calls
/// with id 1): every answer must carry the params its own request sent.
#[test]
fn colliding_ids_never_cross() {
    const CLIENTS: usize = 32;
    const CALLS: usize = 400;
    let upstream = Served::start(demo::engine(Config::default()), ServerConfig::default());
    let proxy = builder_to(&upstream).connections(3).start().unwrap();
    let front = served_proxy(&proxy, Config::default());
    let mismatches = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (addr, mismatches) = (front.tcp, Arc::clone(&mismatches));
            std::thread::spawn(move || {
                let s = TcpStream::connect(addr).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                let mut w = s.try_clone().unwrap();
                let writer = std::thread::spawn(move || {
                    let mut out = String::new();
                    for k in 0..CALLS {
                        if k % 10 == 9 {
                            out.push_str(&format!(
                                r#"[{{"jsonrpc":"2.0","method":"echo","params":[{c},{k},0],"id":1}},{{"jsonrpc":"2.0","method":"echo","params":[{c},{k},1],"id":1}},{{"jsonrpc":"2.0","method":"echo","params":[{c},{k},2],"id":1}}]"#
                            ));
                        } else {
                            out.push_str(&format!(
                                r#"{{"jsonrpc":"2.0","method":"echo","params":[{c},{k}],"id":1}}"#
                            ));
                        }
                        out.push('\n');
                    }
                    w.write_all(out.as_bytes()).unwrap();
                });
                let mut r = BufReader::new(s);
                for k in 0..CALLS {
                    let mut line = String::new();
                    r.read_line(&mut line).unwrap();
                    let v: Value = serde_json::from_str(&line).unwrap();
                    let ok = if k % 10 == 9 {
                        let got: Vec<Value> = v
                            .as_array()
                            .map(|a| a.iter().map(|e| e["result"].clone()).collect())
                            .unwrap_or_default();
                        got == [json!([c, k, 0]), json!([c, k, 1]), json!([c, k, 2])]
                    } else {
                        v["id"] == 1 && v["result"] == json!([c, k])
                    };
                    if !ok {
                        mismatches.fetch_add(1, Ordering::Relaxed);
                        eprintln!("client {c} call {k}: {v}");
                    }
                }
                writer.join().unwrap();
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    assert_eq!(mismatches.load(Ordering::Relaxed), 0);
    // Every forwarded call was timed: 400 lines per client, every tenth a batch of 3.
    let url = format!("tcp://{}", upstream.tcp);
    let calls = (CLIENTS * (CALLS / 10 * 9 + CALLS / 10 * 3)) as f64;
    for family in [
        "ringrpc_proxy_send_seconds",
        "ringrpc_proxy_upstream_seconds",
    ] {
        let count = scraped(front.http, &format!("{family}_count{{upstream=\"{url}\"}}"));
        assert_eq!(count, Some(calls), "{family}");
        let inf = format!("{family}_bucket{{upstream=\"{url}\",le=\"+Inf\"}}");
        assert_eq!(scraped(front.http, &inf), Some(calls), "{family}");
    }
    front.stop();
    drop(proxy);
    upstream.stop();
}

/// An engine answering every method with its own name (`a` or `b`), and counting the
/// notifications it receives (`count` answers how many).
fn named(name: &'static str, notes: Arc<AtomicUsize>) -> Engine {
    let mut m = Registry::builder();
    let seen = Arc::clone(&notes);
    m.method("count", move |_p: Params<'_>| -> Result<usize, RpcError> {
        Ok(seen.load(Ordering::SeqCst))
    })
    .unwrap();
    m.fallback(move |ctx, _p, out| {
        if ctx.id().is_none() {
            notes.fetch_add(1, Ordering::SeqCst);
        }
        out.write_str(name)
    });
    Engine::new(m.freeze(), Config::default())
}

#[test]
fn routes_choose_the_group_and_notifications_are_forwarded_unanswered() {
    let (na, nb) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let a = Served::start(named("a", Arc::clone(&na)), ServerConfig::default());
    let b = Served::start(named("b", Arc::clone(&nb)), ServerConfig::default());
    let mut builder = Proxy::builder();
    builder
        .upstream("first", &format!("tcp://{}", a.tcp))
        .upstream("b", &format!("unix://{}", b.unix.display()))
        .route("exact_b", "b")
        .route("b_*", "b")
        .connections(1);
    let proxy = builder.start().unwrap();
    let front = served_proxy(&proxy, Config::default());
    let call = |method: &str| {
        let a = tcp_answers(
            front.tcp,
            &format!(r#"{{"jsonrpc":"2.0","method":"{method}","id":1}}"#),
        );
        a[0]["result"].clone()
    };
    // No `default` group: unmatched methods go to the first group.
    assert_eq!(call("exact_b"), "b");
    assert_eq!(call("exact_bb"), "a");
    assert_eq!(call("b_anything"), "b");
    assert_eq!(call("b_"), "b");
    assert_eq!(call("c_x"), "a");
    // Notifications: forwarded, never answered (an all-notification batch: 204).
    assert!(tcp_answers(front.tcp, r#"{"jsonrpc":"2.0","method":"b_note"}"#).is_empty());
    let batch =
        r#"[{"jsonrpc":"2.0","method":"b_note","params":[1]},{"jsonrpc":"2.0","method":"a_note"}]"#;
    let http = util::http::post_raw(front.http, &[], batch.as_bytes());
    assert_eq!((http.status, http.body), (204, Value::Null));
    // The counts come through the same single connection, after the notifications.
    assert_eq!(call("exact_b"), "b");
    let count_b = tcp_answers(front.tcp, r#"{"jsonrpc":"2.0","method":"b_count","id":1}"#);
    assert_eq!(count_b[0]["result"], "b"); // routed by the proxy, answered by the fallback
    let wait = |n: &AtomicUsize, want: usize| {
        for _ in 0..500 {
            if n.load(Ordering::SeqCst) == want {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("{} notifications, want {want}", n.load(Ordering::SeqCst));
    };
    wait(&nb, 2);
    wait(&na, 1);
    front.stop();
    drop(proxy);
    a.stop();
    b.stop();
}

/// Accepts connections on a free port, serving each with `serve` on a thread of its own.
fn listen(serve: impl Fn(TcpStream) + Clone + Send + 'static) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let serve = serve.clone();
            std::thread::spawn(move || serve(conn));
        }
    });
    addr
}

/// A fake upstream: accepts connections and runs `each` on every request line.
fn fake_upstream(each: fn(&str, &mut TcpStream) -> bool) -> SocketAddr {
    listen(move |conn| {
        let mut w = conn.try_clone().unwrap();
        for line in BufReader::new(conn).lines() {
            let Ok(line) = line else { return };
            if !each(&line, &mut w) {
                return;
            }
        }
    })
}

fn error_of(v: &Value) -> (i64, &str) {
    (
        v["error"]["code"].as_i64().unwrap_or(0),
        v["error"]["data"]["reason"].as_str().unwrap_or(""),
    )
}

#[test]
fn upstream_failures_are_answered_and_the_proxy_lives() {
    let good = Served::start(demo::engine(Config::default()), ServerConfig::default());
    // Reads every request, never answers.
    let stall = fake_upstream(|_, _| true);
    // Answers every request with a line that is not JSON.
    let garbage = fake_upstream(|_, w| w.write_all(b"this is not JSON\n").is_ok());
    // Closes the connection on the first request line (the batch below arrives as one
    // sub-batch), answering none.
    let closes = fake_upstream(|_, _| false);
    // Nothing listens here.
    let refused = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut b = Proxy::builder();
    b.upstream("default", &format!("tcp://{}", good.tcp))
        .upstream("stall", &format!("tcp://{stall}"))
        .upstream("garbage", &format!("tcp://{garbage}"))
        .upstream("closes", &format!("tcp://{closes}"))
        .upstream("refused", &format!("tcp://{refused}"))
        .route("stall_*", "stall")
        .route("garbage_*", "garbage")
        .route("closes_*", "closes")
        .route("refused_*", "refused")
        .connections(1)
        .timeout(Duration::from_millis(300));
    let proxy = b.start().unwrap();
    let front = served_proxy(&proxy, Config::default());

    // A stalled upstream: its call times out, while other groups answer meanwhile.
    let stalled = {
        let addr = front.tcp;
        std::thread::spawn(move || {
            tcp_answers(addr, r#"{"jsonrpc":"2.0","method":"stall_x","id":1}"#)
        })
    };
    let ok = tcp_answers(
        front.tcp,
        r#"{"jsonrpc":"2.0","method":"add","params":[1,2],"id":2}"#,
    );
    assert_eq!(ok[0]["result"], 3);
    let stalled = stalled.join().unwrap();
    assert_eq!(
        error_of(&stalled[0]),
        (-32001, "upstream_timeout"),
        "{stalled:?}"
    );
    assert_eq!(stalled[0]["id"], 1);

    // Garbage: the connection is dropped and its call answered; again after reconnecting.
    for id in 0..3 {
        let a = tcp_answers(
            front.tcp,
            &format!(r#"{{"jsonrpc":"2.0","method":"garbage_x","id":{id}}}"#),
        );
        assert_eq!(error_of(&a[0]), (-32000, "upstream_unavailable"), "{a:?}");
        assert_eq!(a[0]["id"], id);
    }

    // A connection closed with calls in flight: each of them answered, none lost.
    let batch: Vec<String> = (0..5)
        .map(|i| format!(r#"{{"jsonrpc":"2.0","method":"closes_x","id":{i}}}"#))
        .collect();
    let a = tcp_answers(front.tcp, &format!("[{}]", batch.join(",")));
    let elements = a[0].as_array().unwrap();
    assert_eq!(elements.len(), 5);
    for e in elements {
        assert_eq!(error_of(e), (-32000, "upstream_unavailable"), "{e}");
    }

    // Refused: answered at once (the upstream is marked down), with a batch's other
    // elements answered normally.
    let a = tcp_answers(
        front.tcp,
        r#"[{"jsonrpc":"2.0","method":"refused_x","id":1},{"jsonrpc":"2.0","method":"add","params":[2,2],"id":2}]"#,
    );
    let elements = a[0].as_array().unwrap();
    assert_eq!(error_of(&elements[0]), (-32000, "upstream_unavailable"));
    assert_eq!(elements[1]["result"], 4);

    // And the proxy still serves.
    let ok = tcp_answers(
        front.tcp,
        r#"{"jsonrpc":"2.0","method":"add","params":[5,5],"id":3}"#,
    );
    assert_eq!(ok[0]["result"], 10);
    front.stop();
    drop(proxy);
    good.stop();
}

/// An upstream that goes away and comes back at the same address: calls meanwhile are
/// answered `upstream_unavailable` (none hangs), and calls after it returns succeed.
#[test]
fn a_lost_upstream_is_reconnected() {
    let upstream = Served::start(demo::engine(Config::default()), ServerConfig::default());
    let addr = upstream.tcp;
    let proxy = builder_to(&upstream).connections(1).start().unwrap();
    let front = served_proxy(&proxy, Config::default());
    let add = r#"{"jsonrpc":"2.0","method":"add","params":[1,2],"id":1}"#;
    assert_eq!(tcp_answers(front.tcp, add)[0]["result"], 3);
    upstream.stop();
    let a = tcp_answers(front.tcp, add);
    assert_eq!(error_of(&a[0]), (-32000, "upstream_unavailable"), "{a:?}");
    // Back at the same address.
    let mut server = ringrpc::server::Server::new(demo::engine(Config::default())).unwrap();
    server.listen_tcp(addr).unwrap();
    let handle = server.handle();
    let back = std::thread::spawn(move || server.run());
    let mut answered = false;
    for _ in 0..300 {
        let a = tcp_answers(front.tcp, add);
        if a[0]["result"] == 3 {
            answered = true;
            break;
        }
        assert_eq!(error_of(&a[0]), (-32000, "upstream_unavailable"), "{a:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(answered, "the proxy never reconnected");
    front.stop();
    drop(proxy);
    handle.shutdown();
    back.join().unwrap().unwrap();
}

#[test]
fn bad_setups_are_refused_with_a_reason() {
    use ringrpc::proxy::ProxyError;
    assert!(matches!(
        Proxy::builder().start(),
        Err(ProxyError::NoUpstream)
    ));
    let mut b = Proxy::builder();
    b.upstream("a", "ftp://x");
    assert!(matches!(b.start(), Err(ProxyError::Address { .. })));
    let mut b = Proxy::builder();
    b.upstream("a", "tcp://127.0.0.1:1").route("x_*", "nope");
    let e = b.start().unwrap_err();
    assert!(e.to_string().contains("nope"), "{e}");
}

/// A TCP relay in front of an upstream that the test can cut at any moment, as if the
/// upstream's host died: every connection through it is shut down (requests and
/// answers in flight are lost) and its listener closed (reconnects are refused).
struct Relay {
    addr: SocketAddr,
    cut: Arc<std::sync::atomic::AtomicBool>,
    conns: Arc<std::sync::Mutex<Vec<TcpStream>>>,
}

impl Relay {
    fn start(to: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let conns = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (c, list) = (Arc::clone(&cut), Arc::clone(&conns));
        std::thread::spawn(move || {
            while !c.load(Ordering::SeqCst) {
                let Ok((down, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                };
                down.set_nonblocking(false).unwrap();
                let up = TcpStream::connect(to).unwrap();
                let mut l = list.lock().unwrap();
                l.push(down.try_clone().unwrap());
                l.push(up.try_clone().unwrap());
                for (mut from, mut to) in [
                    (down.try_clone().unwrap(), up.try_clone().unwrap()),
                    (up, down),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
            // The listener is dropped here: connections are refused from now on.
        });
        Self { addr, cut, conns }
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for s in self.conns.lock().unwrap().iter() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        // Let the accept loop see the flag and close the listener.
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Executions of each `write` token, across upstreams.
type Ledger = Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>;

/// An upstream with `read` (idempotent: answers its params) and `write` (not
/// idempotent: records its token in `ledger`). With `hold`, every call waits (on the
/// pool) until `hold` is cleared, counting in `started` the calls that began.
fn recording(
    ledger: Ledger,
    hold: Option<(Arc<std::sync::atomic::AtomicBool>, Arc<AtomicUsize>)>,
) -> Engine {
    let wait = move || {
        if let Some((hold, started)) = &hold {
            started.fetch_add(1, Ordering::SeqCst);
            while hold.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    };
    let w2 = wait.clone();
    let mut m = Registry::builder();
    m.blocking_method("read", move |p: Params<'_>| -> Result<Value, RpcError> {
        wait();
        p.parse::<Value>()
    })
    .unwrap()
    .blocking_method("write", move |p: Params<'_>| -> Result<String, RpcError> {
        w2();
        let [token]: [String; 1] = p.parse()?;
        *ledger.lock().unwrap().entry(token.clone()).or_default() += 1;
        Ok(token)
    })
    .unwrap();
    Engine::new(m.freeze(), Config::default())
}

/// An upstream dies with calls in flight: every idempotent call is answered (failed
/// over to the other upstream), and no non-idempotent call runs twice.
#[test]
fn idempotent_calls_fail_over_and_others_never_run_twice() {
    const CLIENTS: usize = 8;
    const CHUNKS: usize = 10;
    const PER_CHUNK: usize = 20;
    let ledger: Ledger = Arc::default();
    let hold = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let started = Arc::new(AtomicUsize::new(0));
    let a = Served::start(
        recording(
            Arc::clone(&ledger),
            Some((Arc::clone(&hold), Arc::clone(&started))),
        ),
        ServerConfig::default(),
    );
    let b = Served::start(
        recording(Arc::clone(&ledger), None),
        ServerConfig::default(),
    );
    let relay = Relay::start(a.tcp);
    let mut builder = Proxy::builder();
    builder
        .upstream("default", &format!("tcp://{}", relay.addr))
        .upstream("default", &format!("tcp://{}", b.tcp))
        .idempotent("read")
        .connections(2);
    let proxy = builder.start().unwrap();
    let front = served_proxy(&proxy, Config::default());

    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let addr = front.tcp;
            std::thread::spawn(move || {
                let s = TcpStream::connect(addr).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut w = s;
                // (read answers, write answers: token → ok)
                let mut reads = Vec::new();
                let mut writes = Vec::new();
                for chunk in 0..CHUNKS {
                    let mut out = String::new();
                    for k in 0..PER_CHUNK {
                        let n = chunk * PER_CHUNK + k;
                        if n.is_multiple_of(2) {
                            out.push_str(&format!(
                                r#"{{"jsonrpc":"2.0","method":"read","params":{{"c":{c},"n":{n}}},"id":"r{n}"}}"#
                            ));
                        } else {
                            out.push_str(&format!(
                                r#"{{"jsonrpc":"2.0","method":"write","params":["t{c}-{n}"],"id":"w{n}"}}"#
                            ));
                        }
                        out.push('\n');
                    }
                    w.write_all(out.as_bytes()).unwrap();
                    for _ in 0..PER_CHUNK {
                        let mut line = String::new();
                        r.read_line(&mut line).unwrap();
                        let v: Value = serde_json::from_str(&line).unwrap();
                        let id = v["id"].as_str().unwrap().to_owned();
                        let n: usize = id[1..].parse().unwrap();
                        if id.starts_with('r') {
                            reads.push((n, v));
                        } else {
                            writes.push((format!("t{c}-{n}"), v));
                        }
                    }
                }
                (c, reads, writes)
            })
        })
        .collect();

    // Calls are held at A: cut it once some are running there (more wait in its queue
    // and on the connection).
    for _ in 0..1000 {
        if started.load(Ordering::SeqCst) >= 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(started.load(Ordering::SeqCst) >= 2, "no call reached A");
    std::thread::sleep(Duration::from_millis(50));
    relay.cut();
    hold.store(false, Ordering::SeqCst);

    let (mut failed_writes, mut ok_writes) = (0, 0);
    for client in clients {
        let (c, reads, writes) = client.join().unwrap();
        assert_eq!(reads.len() + writes.len(), CHUNKS * PER_CHUNK);
        for (n, v) in reads {
            assert_eq!(v["result"], json!({"c": c, "n": n}), "read {n}: {v}");
        }
        for (token, v) in writes {
            if v.get("result").is_some() {
                assert_eq!(v["result"], token.as_str());
                ok_writes += 1;
            } else {
                assert_eq!(error_of(&v), (-32000, "upstream_unavailable"), "{v}");
                failed_writes += 1;
            }
        }
    }
    // A runs what it had queued once released: give it time, then count.
    std::thread::sleep(Duration::from_millis(200));
    let ledger = ledger.lock().unwrap();
    let twice: Vec<_> = ledger.iter().filter(|(_, &n)| n > 1).collect();
    assert!(twice.is_empty(), "writes run twice: {twice:?}");
    assert!(
        failed_writes > 0,
        "no write was in flight at A when it died"
    );
    assert!(ok_writes > 0);
    front.stop();
    drop(proxy);
    a.stop();
    b.stop();
}

/// Reads one HTTP request off `r` and parses its body (`None`: the connection closed).
fn read_http_request(r: &mut BufReader<TcpStream>) -> Option<Value> {
    let mut length = 0;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return None;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().unwrap();
        }
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0; length];
    std::io::Read::read_exact(r, &mut body).ok()?;
    Some(serde_json::from_slice(&body).unwrap())
}

/// A fake HTTP/1.1 upstream: for each request (its number on the connection and its
/// body), `answer` gives the status line's code, the body, and whether to close.
fn fake_http(answer: fn(usize, &Value) -> (u16, String, bool)) -> SocketAddr {
    listen(move |conn| {
        let mut w = conn.try_clone().unwrap();
        let mut r = BufReader::new(conn);
        for n in 0.. {
            let Some(request) = read_http_request(&mut r) else {
                return;
            };
            let (status, reply, close) = answer(n, &request);
            let head = format!(
                "HTTP/1.1 {status} X\r\nContent-Length: {}\r\n{}\r\n",
                reply.len(),
                if close { "Connection: close\r\n" } else { "" }
            );
            if w.write_all(format!("{head}{reply}").as_bytes()).is_err() || close {
                return;
            }
        }
    })
}

#[test]
fn http_upstreams_statuses_and_closes() {
    // The first request on each connection: a 502 with an HTML page; then answers with
    // the request's id; every third answer closes the connection.
    let odd = fake_http(|n, req| {
        if n == 0 {
            return (502, "<html>bad gateway</html>".into(), false);
        }
        let body = json!({"jsonrpc": "2.0", "id": req["id"], "result": req["params"]});
        (200, body.to_string(), n % 3 == 2)
    });
    // A guarded server: its 401 carries a JSON-RPC error, relayed as it came.
    let guarded = {
        let keys =
            std::env::temp_dir().join(format!("ringrpc-proxy-keys-{}.toml", std::process::id()));
        std::fs::write(
            &keys,
            "[[key]]\nname = \"a\"\ntoken = \"t0ken\"\nallow = [\"*\"]\n",
        )
        .unwrap();
        let guard = ringrpc::guard::Guard::new().with_key_file(&keys).unwrap();
        Served::start(
            demo::engine(Config::default()).with_guard(guard),
            ServerConfig::default(),
        )
    };
    let mut b = Proxy::builder();
    b.upstream("default", &format!("http://{odd}/rpc"))
        .upstream("guarded", &format!("http://{}/", guarded.http))
        .route("g_*", "guarded")
        .connections(1);
    let proxy = b.start().unwrap();
    let front = served_proxy(&proxy, Config::default());
    let call = |method: &str, id: i64| {
        tcp_answers(
            front.tcp,
            &format!(r#"{{"jsonrpc":"2.0","method":"{method}","params":[{id}],"id":{id}}}"#),
        )
        .remove(0)
    };
    let first = call("x", 1);
    assert_eq!(
        error_of(&first),
        (-32000, "upstream_unavailable"),
        "{first}"
    );
    assert!(
        first["error"]["message"]
            .as_str()
            .unwrap()
            .contains("HTTP 502"),
        "{first}"
    );
    // The same connection goes on, through closes and reconnects (each new
    // connection's first answer is a 502 again).
    let mut ok = 0;
    for id in 2..40 {
        let a = call("x", id);
        if a.get("result").is_some() {
            assert_eq!((&a["id"], &a["result"]), (&json!(id), &json!([id])), "{a}");
            ok += 1;
        } else {
            assert_eq!(error_of(&a), (-32000, "upstream_unavailable"), "{a}");
        }
    }
    // Each connection's first request gets the 502: a third of the requests (the test's
    // calls and `tcp_answers`' marker pings, which go to the same upstream).
    assert!(ok >= 10, "{ok} answered");
    let denied = call("g_sum", 7);
    assert_eq!(denied["error"]["code"], -32040, "{denied}");
    assert_eq!(denied["id"], 7, "{denied}");
    front.stop();
    drop(proxy);
    guarded.stop();
}

/// An upstream whose `slow_read` waits until `hold` is cleared and counts its runs in
/// `runs`; `count` answers how many times it ran (and fails for negative params).
fn counting(hold: Arc<std::sync::atomic::AtomicBool>, runs: Arc<AtomicUsize>) -> Engine {
    let r2 = Arc::clone(&runs);
    let mut m = Registry::builder();
    m.blocking_method(
        "slow_read",
        move |p: Params<'_>| -> Result<Value, RpcError> {
            while hold.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
            runs.fetch_add(1, Ordering::SeqCst);
            p.parse::<Value>()
        },
    )
    .unwrap()
    .method("count", move |p: Params<'_>| -> Result<usize, RpcError> {
        let v: Value = p.parse()?;
        if v["n"].as_i64().is_some_and(|n| n < 0) {
            return Err(RpcError::invalid_params("negative"));
        }
        Ok(r2.fetch_add(1, Ordering::SeqCst) + 1)
    })
    .unwrap();
    Engine::new(m.freeze(), Config::default())
}

/// 1,000 identical calls (written differently) in flight at once: one upstream call,
/// 1,000 answers each with its own id.
#[test]
fn identical_calls_in_flight_share_one_upstream_call() {
    let hold = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let runs = Arc::new(AtomicUsize::new(0));
    let upstream = Served::start(
        counting(Arc::clone(&hold), Arc::clone(&runs)),
        ServerConfig::default(),
    );
    let mut b = builder_to(&upstream);
    b.idempotent("slow_*");
    let proxy = b.start().unwrap();
    let front = served_proxy(&proxy, Config::default());
    let forms = [
        r#"{"a":1,"b":[true,"x"]}"#,
        r#" { "b" : [ true , "\u0078" ] , "a" : 1 } "#,
        r#"{"b":[true,"x"],"a":1}"#,
    ];
    let clients: Vec<_> = (0..10)
        .map(|c| {
            let addr = front.tcp;
            std::thread::spawn(move || {
                let s = TcpStream::connect(addr).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                let mut out = String::new();
                for k in 0..100 {
                    let params = forms[k % 3];
                    out.push_str(&format!(
                        r#"{{"jsonrpc":"2.0","method":"slow_read","params":{params},"id":"{c}-{k}"}}"#
                    ));
                    out.push('\n');
                }
                let mut w = s.try_clone().unwrap();
                w.write_all(out.as_bytes()).unwrap();
                let mut r = BufReader::new(s);
                (0..100)
                    .map(|k| {
                        let mut line = String::new();
                        r.read_line(&mut line).unwrap();
                        let v: Value = serde_json::from_str(&line).unwrap();
                        assert_eq!(v["id"], format!("{c}-{k}"), "{v}");
                        assert_eq!(v["result"], json!({"a": 1, "b": [true, "x"]}), "{v}");
                    })
                    .count()
            })
        })
        .collect();
    // Release the upstream once all 1,000 calls are in flight at the proxy.
    let inflight = "ringrpc_inflight_calls";
    for _ in 0..2000 {
        if scraped(front.http, inflight) == Some(1000.0) {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(scraped(front.http, inflight), Some(1000.0));
    hold.store(false, Ordering::SeqCst);
    let answered: usize = clients.into_iter().map(|c| c.join().unwrap()).sum();
    assert_eq!(answered, 1000);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "upstream calls");
    // Once answered, the next identical call goes upstream again.
    let again = tcp_answers(
        front.tcp,
        r#"{"jsonrpc":"2.0","method":"slow_read","params":{"a":1,"b":[true,"x"]},"id":1}"#,
    );
    assert_eq!(again[0]["result"]["a"], 1);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    front.stop();
    drop(proxy);
    upstream.stop();
}

#[test]
fn cached_results_are_served_by_full_key_and_errors_are_not_cached() {
    let hold = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let runs = Arc::new(AtomicUsize::new(0));
    let upstream = Served::start(counting(hold, Arc::clone(&runs)), ServerConfig::default());
    let mut b = builder_to(&upstream);
    b.cache("count", Duration::from_secs(60))
        .cache("slow_*", Duration::from_millis(1));
    let proxy = b.start().unwrap();
    let front = served_proxy(&proxy, Config::default());
    let count = |params: &str, id: u32| {
        tcp_answers(
            front.tcp,
            &format!(r#"{{"jsonrpc":"2.0","method":"count","params":{params},"id":{id}}}"#),
        )
        .remove(0)
    };
    let first = count(r#"{"n":1,"m":"a"}"#, 1);
    assert_eq!(first["result"], 1);
    // The same call, written differently, with another id: from the cache.
    let cached = count(r#" { "m" : "\u0061" , "n" : 1 } "#, 2);
    assert_eq!((&cached["id"], &cached["result"]), (&json!(2), &json!(1)));
    // Other params: upstream.
    assert_eq!(count(r#"{"n":2,"m":"a"}"#, 3)["result"], 2);
    // Errors are not cached.
    assert_eq!(count(r#"{"n":-1}"#, 4)["error"]["code"], -32602);
    assert_eq!(count(r#"{"n":-1}"#, 5)["error"]["code"], -32602);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // A short TTL expires.
    let read = r#"{"jsonrpc":"2.0","method":"slow_read","params":[1],"id":6}"#;
    assert_eq!(tcp_answers(front.tcp, read)[0]["result"], json!([1]));
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(tcp_answers(front.tcp, read)[0]["result"], json!([1]));
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    front.stop();
    drop(proxy);
    upstream.stop();
}

/// An upstream that accepts and reads but never answers is taken out after a few
/// timeouts in a row (the circuit breaker), and stays out while its reconnections
/// fail their health probe: calls go to the group's other upstream.
#[test]
fn a_stalled_upstream_is_taken_out_and_probed_before_use() {
    let good = Served::start(demo::engine(Config::default()), ServerConfig::default());
    let stall = fake_upstream(|_, _| true);
    let mut b = Proxy::builder();
    // The marker pings `tcp_answers` sends go elsewhere: a ping left waiting on the
    // stalled upstream would keep every later call away from it (the least loaded
    // lane is chosen), and the breaker would trip on pings alone.
    // Only the upstream thread's connections: they take turns (a reactor's own pick
    // at random between equally loaded upstreams, and 1 run in 50 sent the stalled one
    // too few calls to trip its breaker). A timeout the good upstream meets on a
    // loaded machine too.
    b.upstream("default", &format!("tcp://{stall}"))
        .upstream("default", &format!("tcp://{}", good.tcp))
        .upstream("marker", &format!("tcp://{}", good.tcp))
        .route("ping", "marker")
        .connections(1)
        .reactor_connections(false)
        .timeout(Duration::from_millis(300));
    let proxy = b.start().unwrap();
    let front = served_proxy(&proxy, Config::default());
    // Both connections up first: calls sent before the stalled one's connection is
    // made all go to the other, and nothing is left to test.
    let up = format!("ringrpc_proxy_upstream_up{{upstream=\"tcp://{stall}\"}}");
    let waited = Instant::now();
    while scraped(front.http, &up) != Some(1.0) {
        assert!(waited.elapsed() < Duration::from_secs(10), "{up} never 1");
        std::thread::sleep(Duration::from_millis(5));
    }
    let add = r#"{"jsonrpc":"2.0","method":"add","params":[1,2],"id":1}"#;
    let mut timeouts = 0;
    for _ in 0..12 {
        let a = tcp_answers(front.tcp, add);
        // Timed out, or still waiting there when the breaker tripped.
        if a[0].get("error").is_some() {
            let e = error_of(&a[0]);
            assert!(
                e == (-32001, "upstream_timeout") || e == (-32000, "upstream_unavailable"),
                "{a:?}"
            );
            timeouts += 1;
        }
    }
    // At most the three timeouts that trip it, and one call stranded by the trip.
    assert!(
        (1..=4).contains(&timeouts),
        "{timeouts} failures before the breaker"
    );
    // Taken out: every call goes to the other upstream, also after its reconnection
    // (its health probe is not answered).
    for round in 0..2 {
        for _ in 0..20 {
            let a = tcp_answers(front.tcp, add);
            assert_eq!(a[0]["result"], 3, "round {round}: {a:?}");
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    front.stop();
    drop(proxy);
    good.stop();
}

/// Hedging: idempotent calls unanswered after a delay are also sent to another
/// upstream of the group, and the first answer wins; with a zero budget, none is.
#[test]
fn slow_idempotent_calls_are_hedged_within_the_budget() {
    for fraction in [1.0, 0.0] {
        let good = Served::start(demo::engine(Config::default()), ServerConfig::default());
        let stall = fake_upstream(|_, _| true);
        let mut b = Proxy::builder();
        // The marker pings `tcp_answers` sends go elsewhere: the two upstreams of
        // `default` take turns with the calls measured.
        b.upstream("default", &format!("tcp://{stall}"))
            .upstream("default", &format!("tcp://{}", good.tcp))
            .upstream("marker", &format!("tcp://{}", good.tcp))
            .route("ping", "marker")
            .idempotent("add")
            .connections(1)
            .timeout(Duration::from_millis(400))
            .hedge(Duration::from_millis(50), fraction);
        let proxy = b.start().unwrap();
        let front = served_proxy(&proxy, Config::default());
        let add = r#"{"jsonrpc":"2.0","method":"add","params":[1,2],"id":1}"#;
        let mut failed = 0;
        // Fewer calls than the breaker needs to take the stalled upstream out.
        for _ in 0..2 {
            let a = tcp_answers(front.tcp, add);
            if a[0]["result"] != 3 {
                failed += 1;
            }
        }
        let hedged = scraped(front.http, "ringrpc_proxy_hedged_total").unwrap();
        if fraction > 0.0 {
            assert_eq!(failed, 0, "hedged calls are answered by the other upstream");
            assert!(hedged >= 1.0, "{hedged}");
        } else {
            assert!(
                failed >= 1,
                "without hedging, calls sent to the stalled one time out"
            );
            assert_eq!(hedged, 0.0);
        }
        front.stop();
        drop(proxy);
        good.stop();
    }
}

/// Active health checks: an idle upstream that accepts connections but answers
/// nothing is found by its unanswered probe and taken out before any call goes to it;
/// one that answers probes (with -32601: any JSON-RPC answer will do) stays in. With
/// the checks off, the hung one stays in.
#[test]
fn idle_upstreams_are_probed_and_a_hung_one_taken_out() {
    for checks in [true, false] {
        let good = Served::start(demo::engine(Config::default()), ServerConfig::default());
        let hung = fake_upstream(|_, _| true);
        let mut b = Proxy::builder();
        // Only the upstream thread's connections, which the gauges describe and which
        // calls take in turn (a reactor's own pick at random, and sent all six calls
        // to the good one in 1 run of 64). Probes the good upstream answers in time on
        // a loaded machine too (a probe's timeout is the interval).
        b.upstream("default", &format!("tcp://{hung}"))
            .upstream("default", &format!("tcp://{}", good.tcp))
            .upstream("marker", &format!("tcp://{}", good.tcp))
            .route("ping", "marker")
            .connections(1)
            .reactor_connections(false)
            .timeout(Duration::from_millis(300))
            .health_interval(if checks {
                Duration::from_millis(400)
            } else {
                Duration::ZERO
            });
        let proxy = b.start().unwrap();
        let front = served_proxy(&proxy, Config::default());
        let up = |url: String| {
            scraped(
                front.http,
                &format!("ringrpc_proxy_upstream_up{{upstream=\"{url}\"}}"),
            )
            .unwrap()
        };
        // No call at all: only the probes can tell (without them, nothing changes).
        if checks {
            let waited = Instant::now();
            while up(format!("tcp://{hung}")) != 0.0 {
                assert!(
                    waited.elapsed() < Duration::from_secs(10),
                    "never taken out"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        } else {
            std::thread::sleep(Duration::from_millis(700));
        }
        assert_eq!(up(format!("tcp://{}", good.tcp)), 1.0, "checks {checks}");
        assert_eq!(up(format!("tcp://{hung}")), if checks { 0.0 } else { 1.0 });
        let add = r#"{"jsonrpc":"2.0","method":"add","params":[1,2],"id":1}"#;
        let answered = (0..6)
            .filter(|_| tcp_answers(front.tcp, add)[0]["result"] == 3)
            .count();
        if checks {
            assert_eq!(answered, 6, "every call goes to the upstream that serves");
        } else {
            assert!(answered < 6, "calls are sent to the hung upstream");
        }
        front.stop();
        drop(proxy);
        good.stop();
    }
}

/// Set by the test below: the flaky upstream stops answering `add`.
static STALL_ADD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Hedging after a latency quantile: once a window of answers has measured the
/// group's upstream times, calls slower than its quantile are hedged to the other
/// upstream; without hedging, the same calls time out.
#[test]
fn hedging_after_a_measured_quantile() {
    for hedge in [true, false] {
        STALL_ADD.store(false, Ordering::SeqCst);
        let good = Served::start(demo::engine(Config::default()), ServerConfig::default());
        let flaky = fake_upstream(|line, w| {
            let v: Value = serde_json::from_str(line).unwrap();
            if v["method"] == "add" && STALL_ADD.load(Ordering::SeqCst) {
                return true;
            }
            let answer = json!({"jsonrpc": "2.0", "id": v["id"], "result": 3});
            w.write_all(format!("{answer}\n").as_bytes()).is_ok()
        });
        let mut b = Proxy::builder();
        b.upstream("default", &format!("tcp://{flaky}"))
            .upstream("default", &format!("tcp://{}", good.tcp))
            .upstream("marker", &format!("tcp://{}", good.tcp))
            .route("ping", "marker")
            .idempotent("add")
            .coalesce(false)
            .connections(1)
            .health_interval(Duration::ZERO)
            .timeout(Duration::from_millis(400));
        if hedge {
            b.hedge_quantile(0.9, 1.0);
        }
        let proxy = b.start().unwrap();
        let front = served_proxy(&proxy, Config::default());
        let add = r#"{"jsonrpc":"2.0","method":"add","params":[1,2],"id":1}"#;
        // A window of fast answers from both upstreams measures the group.
        for _ in 0..40 {
            assert_eq!(tcp_answers(front.tcp, add)[0]["result"], 3);
        }
        std::thread::sleep(Duration::from_millis(1100));
        STALL_ADD.store(true, Ordering::SeqCst);
        // Eight calls: equally loaded upstreams are chosen at random, so all eight
        // miss the flaky one once in 256 runs (with four, once in 16). If the breaker
        // takes it out on the way, the rest go to the other: the counts below hold.
        let failed = (0..8)
            .filter(|_| tcp_answers(front.tcp, add)[0]["result"] != 3)
            .count();
        let hedged = scraped(front.http, "ringrpc_proxy_hedged_total").unwrap();
        if hedge {
            assert_eq!(failed, 0, "slow calls are answered by the other upstream");
            assert!(hedged >= 1.0, "{hedged}");
        } else {
            assert!(
                failed >= 1,
                "without hedging, calls to the stalled one time out"
            );
            assert_eq!(hedged, 0.0);
        }
        front.stop();
        drop(proxy);
        good.stop();
    }
}

/// A line upstream that records every request line it reads and answers each call
/// with `{"up": NAME, "params": ...}`; a batch is answered as one array, in reverse
/// order (the spec lets a server answer a batch's elements in any order).
fn recorder(name: &'static str, lines: Arc<std::sync::Mutex<Vec<String>>>) -> SocketAddr {
    listen(move |conn| {
        let mut w = conn.try_clone().unwrap();
        for line in BufReader::new(conn).lines() {
            let Ok(line) = line else { return };
            lines.lock().unwrap().push(line.clone());
            let v: Value = serde_json::from_str(&line).unwrap();
            let answer = |req: &Value| {
                req.get("id").map(|id| {
                    json!({"jsonrpc": "2.0", "id": id, "result": {"up": name, "params": req["params"]}})
                })
            };
            let out = match &v {
                Value::Array(reqs) => {
                    let mut answers: Vec<Value> = reqs.iter().filter_map(answer).collect();
                    answers.reverse();
                    (!answers.is_empty()).then_some(Value::Array(answers))
                }
                req => answer(req),
            };
            if let Some(out) = out {
                if w.write_all(format!("{out}\n").as_bytes()).is_err() {
                    return;
                }
            }
        }
    })
}

/// A client batch reaches each upstream as one batch request (a sub-batch per
/// group, notifications included), answered in any order and merged back in the
/// client's order with the client's own (here colliding) ids; `batch_max` splits
/// longer ones, and a sub-batch of one goes as a plain request.
#[test]
fn batches_go_upstream_as_sub_batches() {
    let (a_lines, b_lines) = (Arc::default(), Arc::default());
    let a = recorder("a", Arc::clone(&a_lines));
    let b = recorder("b", Arc::clone(&b_lines));
    let marker = Served::start(demo::engine(Config::default()), ServerConfig::default());
    let start = |max: usize| {
        let mut p = Proxy::builder();
        p.upstream("default", &format!("tcp://{a}"))
            .upstream("b", &format!("tcp://{b}"))
            .upstream("marker", &format!("tcp://{}", marker.tcp))
            .route("b_*", "b")
            .route("ping", "marker")
            .connections(1)
            .health_interval(Duration::ZERO)
            .batch_max(max);
        p.start().unwrap()
    };
    let proxy = start(100);
    let front = served_proxy(&proxy, Config::default());
    let batch = r#"[
        {"jsonrpc":"2.0","method":"a_1","params":[1],"id":1},
        {"jsonrpc":"2.0","method":"b_1","params":{"k":"v"},"id":"x"},
        {"jsonrpc":"2.0","method":"a_note","params":[0]},
        {"jsonrpc":"2.0","method":"a_2","params":[2],"id":1},
        {"jsonrpc":"2.0","method":"b_2","params":[3],"id":2.5},
        {"jsonrpc":"2.0","method":"a_3","id":3}
    ]"#
    .replace('\n', " ");
    let answers = tcp_answers(front.tcp, &batch);
    let got = answers[0].as_array().unwrap();
    let want = [
        (json!(1), "a", json!([1])),
        (json!("x"), "b", json!({"k": "v"})),
        (json!(1), "a", json!([2])),
        (json!(2.5), "b", json!([3])),
        (json!(3), "a", Value::Null),
    ];
    assert_eq!(got.len(), want.len(), "{got:?}");
    for (g, (id, up, params)) in got.iter().zip(want) {
        assert_eq!(g["id"], id, "{got:?}");
        assert_eq!(g["result"]["up"], up, "{got:?}");
        assert_eq!(g["result"]["params"], params, "{got:?}");
    }
    let sent = |lines: &Arc<std::sync::Mutex<Vec<String>>>| -> Vec<Value> {
        let l = std::mem::take(&mut *lines.lock().unwrap());
        l.iter().map(|s| serde_json::from_str(s).unwrap()).collect()
    };
    let to_a = sent(&a_lines);
    assert_eq!(to_a.len(), 1, "one request to a: {to_a:?}");
    let methods: Vec<&str> = to_a[0]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["method"].as_str().unwrap())
        .collect();
    assert_eq!(methods, ["a_1", "a_note", "a_2", "a_3"]);
    let to_b = sent(&b_lines);
    assert_eq!(to_b.len(), 1, "{to_b:?}");
    assert_eq!(to_b[0].as_array().unwrap().len(), 2);
    front.stop();
    drop(proxy);

    // At most 3 elements a request: 7 calls go as 3, 3 and a plain request.
    let proxy = start(3);
    let front = served_proxy(&proxy, Config::default());
    let calls: Vec<String> = (0..7)
        .map(|i| format!(r#"{{"jsonrpc":"2.0","method":"a_x","params":[{i}],"id":{i}}}"#))
        .collect();
    let answers = tcp_answers(front.tcp, &format!("[{}]", calls.join(",")));
    let got = answers[0].as_array().unwrap();
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g["id"], i, "{got:?}");
        assert_eq!(g["result"]["params"], json!([i]), "{got:?}");
    }
    let to_a = sent(&a_lines);
    let sizes: Vec<usize> = to_a
        .iter()
        .map(|r| r.as_array().map_or(0, Vec::len))
        .collect();
    assert_eq!(sizes, [3, 3, 0], "{to_a:?}");
    assert_eq!(to_a[2]["params"], json!([6]));
    front.stop();
    drop(proxy);
    marker.stop();
}

/// A sub-batch is sent whole even when the upstream thread runs while its batch is
/// still being dispatched: here another caller's call, to another upstream, is written
/// and answered between two elements of the batch (the upstream thread took that
/// lane's bytes and not the half-written sub-batch's).
#[test]
fn a_sub_batch_is_not_taken_half_written() {
    let (a_lines, m_lines) = (Arc::default(), Arc::default());
    let a = recorder("a", Arc::clone(&a_lines));
    let m = recorder("m", Arc::clone(&m_lines));
    let mut p = Proxy::builder();
    p.upstream("default", &format!("tcp://{a}"))
        .upstream("m", &format!("tcp://{m}"))
        .route("m_*", "m")
        .connections(1)
        .health_interval(Duration::ZERO)
        .batch_max(100);
    let proxy = p.start().unwrap();
    // The other caller: the proxy embedded with no I/O, on a thread of its own.
    let other = {
        let mut methods = Registry::builder();
        proxy.install(&mut methods).unwrap();
        let config = Config::default().request_timeout(Some(Duration::from_secs(5)));
        Arc::new(Engine::new(methods.freeze(), config))
    };
    let mut methods = Registry::builder();
    proxy.install(&mut methods).unwrap();
    methods
        .method("stir", move |_p: Params<'_>| -> Result<Value, RpcError> {
            let other = Arc::clone(&other);
            let answer = std::thread::spawn(move || {
                let mut out = Vec::new();
                let call = br#"{"jsonrpc":"2.0","method":"m_1","params":[9],"id":9}"#;
                let _ = other.handle(call, &mut other.scratch(), &mut out);
                out
            })
            .join()
            .unwrap();
            Ok(serde_json::from_slice::<Value>(&answer).unwrap()["result"].clone())
        })
        .unwrap();
    let front = Served::start(
        Engine::new(methods.freeze(), Config::default()),
        ServerConfig::default(),
    );
    let batch = r#"[{"jsonrpc":"2.0","method":"a_1","params":[1],"id":1},{"jsonrpc":"2.0","method":"stir","id":2},{"jsonrpc":"2.0","method":"a_2","params":[2],"id":3}]"#;
    let answers = tcp_answers(front.tcp, batch);
    assert_eq!(
        answers[0],
        json!([
            {"jsonrpc": "2.0", "id": 1, "result": {"up": "a", "params": [1]}},
            {"jsonrpc": "2.0", "id": 2, "result": {"up": "m", "params": [9]}},
            {"jsonrpc": "2.0", "id": 3, "result": {"up": "a", "params": [2]}},
        ])
    );
    // (`tcp_answers`'s closing `ping` goes to `a` too, on the reactor's own connection.)
    let to_a: Vec<Value> = std::mem::take(&mut *a_lines.lock().unwrap())
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["method"] != "ping")
        .collect();
    assert_eq!(to_a.len(), 1, "one request to a: {to_a:?}");
    assert_eq!(to_a[0].as_array().map(Vec::len), Some(2), "{to_a:?}");
    assert_eq!(m_lines.lock().unwrap().len(), 1);
    front.stop();
    drop(proxy);
}

/// A front server whose method `nested` calls (`Engine::handle`, on the reactor's
/// thread) an engine forwarding through the proxy to upstream `a` (`tune` sets the
/// proxy up), sending `call`, and answers what that got.
fn nested_front(tune: impl FnOnce(&mut ProxyBuilder), call: &'static [u8]) -> (Served, Proxy) {
    let a = recorder("a", Arc::default());
    let mut p = Proxy::builder();
    p.upstream("default", &format!("tcp://{a}"))
        .connections(1)
        .health_interval(Duration::ZERO);
    tune(&mut p);
    let proxy = p.start().unwrap();
    let other = {
        let mut methods = Registry::builder();
        proxy.install(&mut methods).unwrap();
        let config = Config::default().request_timeout(Some(Duration::from_secs(3)));
        Arc::new(Engine::new(methods.freeze(), config))
    };
    let mut methods = Registry::builder();
    proxy.install(&mut methods).unwrap();
    methods
        .method("nested", move |_p: Params<'_>| -> Result<Value, RpcError> {
            let mut out = Vec::new();
            let _ = other.handle(call, &mut other.scratch(), &mut out);
            Ok(serde_json::from_slice::<Value>(&out).unwrap())
        })
        .unwrap();
    let front = Served::start(
        Engine::new(methods.freeze(), Config::default()),
        ServerConfig::default(),
    );
    (front, proxy)
}

/// A handler that calls an engine forwarding through the proxy and waits for the
/// answer on its own (reactor) thread: the call is sent at once by the upstream
/// thread, neither held in the enclosing batch's sub-batch until the batch ends nor
/// put on the reactor's own connection until its turn ends (both wait for the handler:
/// it would be answered only by its timeout).
#[test]
fn a_call_waited_for_inside_a_batch_is_not_held_for_the_batch() {
    let call = br#"{"jsonrpc":"2.0","method":"a_9","params":[9],"id":9}"#;
    let (front, proxy) = nested_front(
        |p| {
            p.batch_max(100);
        },
        call,
    );
    let batch = r#"[{"jsonrpc":"2.0","method":"a_1","params":[1],"id":1},{"jsonrpc":"2.0","method":"nested","id":2},{"jsonrpc":"2.0","method":"a_2","params":[2],"id":3}]"#;
    let answers = tcp_answers(front.tcp, batch);
    assert_eq!(
        answers[0],
        json!([
            {"jsonrpc": "2.0", "id": 1, "result": {"up": "a", "params": [1]}},
            {"jsonrpc": "2.0", "id": 2, "result":
                {"jsonrpc": "2.0", "id": 9, "result": {"up": "a", "params": [9]}}},
            {"jsonrpc": "2.0", "id": 3, "result": {"up": "a", "params": [2]}},
        ])
    );
    // Alone, the same: not on the reactor's own connection, which is written only at
    // the end of the reactor's turn.
    let single = r#"{"jsonrpc":"2.0","method":"nested","id":4}"#;
    assert_eq!(
        tcp_answers(front.tcp, single),
        [json!({"jsonrpc": "2.0", "id": 4, "result":
            {"jsonrpc": "2.0", "id": 9, "result": {"up": "a", "params": [9]}}})]
    );
    front.stop();
    drop(proxy);
}

/// The same with coalescing: a call waited for on the reactor's thread does not join
/// an identical call in flight that waits for that thread (on the reactor's own
/// connection, written at the end of its turn; or in the enclosing batch's sub-batch).
#[test]
fn a_call_waited_for_joins_no_identical_call_waiting_for_its_thread() {
    for batch_max in [1, 100] {
        let call = br#"{"jsonrpc":"2.0","method":"a_1","params":[1],"id":9}"#;
        let (front, proxy) = nested_front(
            |p| {
                p.idempotent("a_*").batch_max(batch_max);
            },
            call,
        );
        // `a_1` first, in flight (on the reactor's connection when batches are not
        // forwarded as batches, else in the batch's sub-batch) when `nested` asks the
        // same.
        let batch = r#"[{"jsonrpc":"2.0","method":"a_1","params":[1],"id":1},{"jsonrpc":"2.0","method":"nested","id":2}]"#;
        assert_eq!(
            tcp_answers(front.tcp, batch)[0],
            json!([
                {"jsonrpc": "2.0", "id": 1, "result": {"up": "a", "params": [1]}},
                {"jsonrpc": "2.0", "id": 2, "result":
                    {"jsonrpc": "2.0", "id": 9, "result": {"up": "a", "params": [1]}}},
            ]),
            "batch_max {batch_max}"
        );
        front.stop();
        drop(proxy);
    }
}

/// Over HTTP, a sub-batch is one request: a batch answer is relayed per element, a
/// call it has no answer for is failed, and an error answering the batch as a whole
/// (an upstream refusing it) is every element's answer.
#[test]
fn http_sub_batches_are_answered_per_element() {
    let upstream = fake_http(|_, req| {
        let Some(reqs) = req.as_array() else {
            let a = json!({"jsonrpc": "2.0", "id": req["id"], "result": "single"});
            return (200, a.to_string(), false);
        };
        let first = reqs[0]["method"].as_str().unwrap_or("");
        if first.starts_with("whole") {
            let e = r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"batch too large","data":{"max":1}}}"#;
            return (400, e.to_owned(), false);
        }
        let mut answers: Vec<Value> = reqs
            .iter()
            .map(|r| json!({"jsonrpc": "2.0", "id": r["id"], "result": r["params"]}))
            .collect();
        if first.starts_with("partial") {
            answers.pop();
        }
        (200, Value::Array(answers).to_string(), false)
    });
    let mut b = Proxy::builder();
    b.upstream("default", &format!("http://{upstream}/"))
        .connections(1)
        .health_interval(Duration::ZERO)
        .timeout(Duration::from_secs(5));
    let proxy = b.start().unwrap();
    let front = served_proxy(&proxy, Config::default());
    let batch = |method: &str| {
        let calls: Vec<String> = (0..3)
            .map(|i| {
                format!(r#"{{"jsonrpc":"2.0","method":"{method}","params":[{i}],"id":"c{i}"}}"#)
            })
            .collect();
        let a = tcp_answers(front.tcp, &format!("[{}]", calls.join(",")));
        a[0].as_array().unwrap().clone()
    };
    let all = batch("all");
    for (i, a) in all.iter().enumerate() {
        assert_eq!(a["id"], format!("c{i}"));
        assert_eq!(a["result"], json!([i]), "{all:?}");
    }
    let partial = batch("partial");
    assert_eq!(partial[0]["result"], json!([0]), "{partial:?}");
    assert_eq!(partial[1]["result"], json!([1]), "{partial:?}");
    assert_eq!(
        error_of(&partial[2]),
        (-32000, "upstream_unavailable"),
        "{partial:?}"
    );
    assert_eq!(partial[2]["id"], "c2");
    let whole = batch("whole");
    for (i, a) in whole.iter().enumerate() {
        assert_eq!(a["id"], format!("c{i}"), "{whole:?}");
        assert_eq!(a["error"]["code"], -32600, "{whole:?}");
        assert_eq!(a["error"]["message"], "batch too large");
        assert_eq!(a["error"]["data"], json!({"max": 1}));
    }
    // A single call still goes (and is answered) on its own.
    let one = tcp_answers(
        front.tcp,
        r#"{"jsonrpc":"2.0","method":"one","params":[9],"id":7}"#,
    );
    assert_eq!(one[0]["result"], "single");
    assert_eq!(one[0]["id"], 7);
    front.stop();
    drop(proxy);
}

/// A line of a TCP client: sends `frame`, reads one answer line.
fn one_answer(addr: SocketAddr, frame: &str) -> Value {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut r = BufReader::new(s);
    r.get_mut()
        .write_all(format!("{frame}\n").as_bytes())
        .unwrap();
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
}

/// An upstream may pretty-print its answers (JSON allows line breaks between tokens):
/// relayed to a newline-delimited client, a result or error stays on one line, single
/// or in a batch, and the connection goes on.
#[test]
fn pretty_printed_answers_stay_one_line() {
    let upstream = fake_http(|_, req| {
        let one = |r: &Value| {
            if r["method"] == "fails" {
                json!({"jsonrpc": "2.0", "id": r["id"], "error": {"code": 7, "message": "no\nway", "data": [1, 2]}})
            } else {
                json!({"jsonrpc": "2.0", "id": r["id"], "result": {"a": [1, 2], "s": "x\ny"}})
            }
        };
        let answer = match req.as_array() {
            Some(reqs) => Value::Array(reqs.iter().map(one).collect()),
            None => one(req),
        };
        (
            200,
            serde_json::to_string_pretty(&answer)
                .unwrap()
                .replace('\n', "\r\n"),
            false,
        )
    });
    let mut b = Proxy::builder();
    b.upstream("default", &format!("http://{upstream}/"));
    let proxy = b.start().unwrap();
    let front = served_proxy(&proxy, Config::default());
    let answers = tcp_answers(
        front.tcp,
        r#"{"jsonrpc":"2.0","method":"x","id":1}
{"jsonrpc":"2.0","method":"fails","id":2}
[{"jsonrpc":"2.0","method":"x","id":3},{"jsonrpc":"2.0","method":"fails","id":4}]"#,
    );
    let ok = json!({"a": [1, 2], "s": "x\ny"});
    let failed = json!({"code": 7, "message": "no\nway", "data": [1, 2]});
    assert_eq!(answers.len(), 3, "{answers:?}");
    assert_eq!(answers[0], json!({"jsonrpc": "2.0", "id": 1, "result": ok}));
    assert_eq!(
        answers[1],
        json!({"jsonrpc": "2.0", "id": 2, "error": failed})
    );
    assert_eq!(
        answers[2],
        json!([{"jsonrpc": "2.0", "id": 3, "result": ok}, {"jsonrpc": "2.0", "id": 4, "error": failed}])
    );
    front.stop();
}

/// `Engine::handle` (no I/O) waits for each forwarded element of a batch in turn: each
/// goes upstream at once rather than in a sub-batch closed only at the batch's end.
/// The upstream is named by host name (resolved when the proxy starts).
#[test]
fn a_batch_through_engine_handle_is_forwarded() {
    let upstream = Served::start(demo::engine(Config::default()), ServerConfig::default());
    let mut b = Proxy::builder();
    b.upstream(
        "default",
        &format!("http://localhost:{}/", upstream.http.port()),
    )
    .health_interval(Duration::ZERO);
    let proxy = b.start().unwrap();
    let mut methods = Registry::builder();
    proxy.install(&mut methods).unwrap();
    let engine = Engine::new(
        methods.freeze(),
        Config::default().request_timeout(Some(Duration::from_secs(5))),
    );
    let handle = |frame: &str| {
        let mut out = Vec::new();
        let _ = engine.handle(frame.as_bytes(), &mut engine.scratch(), &mut out);
        serde_json::from_slice::<Value>(&out).unwrap()
    };
    let got = handle(r#"{"jsonrpc":"2.0","method":"subtract","params":[3,1],"id":0}"#);
    assert_eq!(got, json!({"jsonrpc": "2.0", "id": 0, "result": 2}));
    // The upstream thread idles (no call outstanding, no health checks) between calls.
    std::thread::sleep(Duration::from_millis(100));
    let got = handle(
        r#"[{"jsonrpc":"2.0","method":"subtract","params":[42,23],"id":1},{"jsonrpc":"2.0","method":"subtract","params":[2,1],"id":2}]"#,
    );
    assert_eq!(
        got,
        json!([{"jsonrpc": "2.0", "id": 1, "result": 19}, {"jsonrpc": "2.0", "id": 2, "result": 1}])
    );
    drop(proxy);
    upstream.stop();
}

/// Calls timed out by their caller's own short budget say nothing of the upstream:
/// they do not trip the circuit breaker, so another client's call in flight on the
/// same connection is answered.
#[test]
fn a_callers_short_budget_does_not_trip_the_breaker() {
    let upstream = Served::start(demo::engine(Config::default()), ServerConfig::default());
    let mut b = builder_to(&upstream);
    b.connections(1).health_interval(Duration::ZERO);
    let proxy = b.start().unwrap();
    let front = served_proxy(&proxy, Config::default());
    let victim = {
        let addr = front.tcp;
        std::thread::spawn(move || {
            one_answer(
                addr,
                r#"{"jsonrpc":"2.0","method":"delay","params":[1500],"id":"victim"}"#,
            )
        })
    };
    // The victim's call is upstream by now.
    std::thread::sleep(Duration::from_millis(200));
    let calls: Vec<String> = (1..=4)
        .map(|i| format!(r#"{{"jsonrpc":"2.0","method":"delay","params":[1000],"id":{i}}}"#))
        .collect();
    let batch = format!("[{}]", calls.join(","));
    let hurried = util::http::post_raw(front.http, &[("RPC-Timeout-Ms", "30")], batch.as_bytes());
    assert_eq!(hurried.status, 200);
    let hurried = hurried.body;
    for a in hurried.as_array().unwrap() {
        assert_eq!(a["error"]["code"], -32001, "{hurried}");
    }
    assert_eq!(
        victim.join().unwrap(),
        json!({"jsonrpc": "2.0", "id": "victim", "result": null})
    );
    front.stop();
    drop(proxy);
    upstream.stop();
}

/// A newline-delimited upstream without batch support (it refuses any batch with one
/// error, id null, which cannot be matched to calls): by default the elements of a
/// client batch go to a `tcp://` upstream each on its own, and are answered.
#[test]
fn tcp_upstreams_get_no_sub_batches_by_default() {
    let upstream = fake_upstream(|line, w| {
        let req: Value = serde_json::from_str(line).unwrap();
        let a = if req.is_array() {
            json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32600, "message": "no batches"}})
        } else {
            json!({"jsonrpc": "2.0", "id": req["id"], "result": req["method"]})
        };
        w.write_all(format!("{a}\n").as_bytes()).is_ok()
    });
    let mut b = Proxy::builder();
    b.upstream("default", &format!("tcp://{upstream}"))
        .connections(1)
        .timeout(Duration::from_secs(20));
    let proxy = b.start().unwrap();
    let front = served_proxy(&proxy, Config::default());
    let got = one_answer(
        front.tcp,
        r#"[{"jsonrpc":"2.0","method":"a","id":1},{"jsonrpc":"2.0","method":"b","id":2},{"jsonrpc":"2.0","method":"c","id":3}]"#,
    );
    assert_eq!(
        got,
        json!([
            {"jsonrpc": "2.0", "id": 1, "result": "a"},
            {"jsonrpc": "2.0", "id": 2, "result": "b"},
            {"jsonrpc": "2.0", "id": 3, "result": "c"}
        ])
    );
    front.stop();
}

/// An answer over `max_answer_bytes` fails only its own call (its id is read from the
/// answer's beginning); the connection stays, and the other calls on it are answered.
#[test]
fn one_oversized_answer_fails_only_its_own_call() {
    // Answers `big` with 8000 bytes after 300 ms, anything else after 600 ms.
    let upstream = listen(|conn| {
        for line in BufReader::new(conn.try_clone().unwrap()).lines() {
            let Ok(line) = line else { return };
            let req: Value = serde_json::from_str(&line).unwrap();
            let mut w = conn.try_clone().unwrap();
            std::thread::spawn(move || {
                let (ms, result) = match req["method"].as_str() {
                    Some("big") => (300, json!("x".repeat(8000))),
                    Some("slow") => (600, json!("ok")),
                    _ => (0, json!("ok")),
                };
                std::thread::sleep(Duration::from_millis(ms));
                let a = json!({"jsonrpc": "2.0", "id": req["id"], "result": result});
                let _ = w.write_all(format!("{a}\n").as_bytes());
            });
        }
    });
    let mut b = Proxy::builder();
    b.upstream("default", &format!("tcp://{upstream}"))
        .connections(1)
        .health_interval(Duration::ZERO)
        .max_answer_bytes(4096);
    let proxy = b.start().unwrap();
    let front = served_proxy(&proxy, Config::default());
    let victim = {
        let addr = front.tcp;
        std::thread::spawn(move || {
            one_answer(addr, r#"{"jsonrpc":"2.0","method":"slow","id":"victim"}"#)
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    let big = one_answer(front.tcp, r#"{"jsonrpc":"2.0","method":"big","id":1}"#);
    assert_eq!(error_of(&big), (-32000, "upstream_unavailable"), "{big}");
    let message = big["error"]["message"].as_str().unwrap();
    assert!(message.contains("max_answer_bytes (4096)"), "{message}");
    assert_eq!(
        victim.join().unwrap(),
        json!({"jsonrpc": "2.0", "id": "victim", "result": "ok"})
    );
    let after = one_answer(front.tcp, r#"{"jsonrpc":"2.0","method":"quick","id":2}"#);
    assert_eq!(after["result"], "ok", "{after}");
    front.stop();
}

/// Over HTTP an answer goes to the oldest request without one, but only if its id is
/// that request's: an extra response (an upstream bug, a stale answer) is refused (the
/// connection is dropped, its calls failed) rather than given to the next caller.
#[test]
fn an_http_answer_for_another_request_is_not_given_to_the_next_caller() {
    let upstream = listen(|conn| {
        let mut w = conn.try_clone().unwrap();
        let mut r = BufReader::new(conn);
        let mut previous: Option<String> = None;
        while let Some(req) = read_http_request(&mut r) {
            let reply =
                json!({"jsonrpc": "2.0", "id": req["id"], "result": req["method"]}).to_string();
            let mut out = String::new();
            // Before the answer to the request after `from_a`, `from_a`'s once more.
            for body in previous.take().iter().chain([&reply]) {
                out.push_str(&format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                ));
            }
            if req["method"] == "from_a" {
                previous = Some(reply);
            }
            if w.write_all(out.as_bytes()).is_err() {
                return;
            }
        }
    });
    let mut b = Proxy::builder();
    b.upstream("default", &format!("http://{upstream}/"))
        .connections(1)
        .health_interval(Duration::ZERO);
    let proxy = b.start().unwrap();
    let front = served_proxy(&proxy, Config::default());
    let a = one_answer(front.tcp, r#"{"jsonrpc":"2.0","method":"from_a","id":1}"#);
    assert_eq!(a["result"], "from_a");
    let b = one_answer(front.tcp, r#"{"jsonrpc":"2.0","method":"from_b","id":1}"#);
    assert_eq!(error_of(&b), (-32000, "upstream_unavailable"), "{b}");
    front.stop();
}

/// An upstream that pushes notifications (a subscription a client opened through the
/// proxy) does not lose its connection for it: the notifications are dropped (they
/// are not forwarded) and the calls sharing the connection are answered.
#[test]
fn upstream_notifications_do_not_break_the_connection() {
    let upstream = Served::start(demo::engine(Config::default()), ServerConfig::default());
    let mut b = builder_to(&upstream);
    b.connections(1).health_interval(Duration::ZERO);
    let proxy = b.start().unwrap();
    let front = served_proxy(&proxy, Config::default());
    let sub = one_answer(
        front.tcp,
        r#"{"jsonrpc":"2.0","method":"subscribe_ticks","params":[1],"id":1}"#,
    );
    assert!(sub["result"].is_u64(), "{sub}");
    // Ticks every millisecond on the shared connection meanwhile.
    let slow = one_answer(
        front.tcp,
        r#"{"jsonrpc":"2.0","method":"delay","params":[100],"id":2}"#,
    );
    assert_eq!(slow, json!({"jsonrpc": "2.0", "id": 2, "result": null}));
    for i in 0..20 {
        let frame = format!(r#"{{"jsonrpc":"2.0","method":"add","params":[{i},1],"id":3}}"#);
        assert_eq!(one_answer(front.tcp, &frame)["result"], i + 1);
    }
    front.stop();
    drop(proxy);
    upstream.stop();
}

/// Each server reactor forwards its clients' calls on a connection of its own to the
/// upstream (besides the shared ones), and `reactor_connections(false)` leaves only the
/// shared ones. The fake upstream answers each call with the number of the connection
/// it came on.
#[test]
fn each_reactor_forwards_on_a_connection_of_its_own() {
    for own in [true, false] {
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        let addr = listen(move |conn| {
            let n = counter.fetch_add(1, Ordering::SeqCst);
            let mut w = conn.try_clone().unwrap();
            for line in BufReader::new(conn).lines() {
                let Ok(line) = line else { return };
                let v: Value = serde_json::from_str(&line).unwrap();
                let answer = json!({"jsonrpc":"2.0","id":v["id"],"result":n});
                if w.write_all(format!("{answer}\n").as_bytes()).is_err() {
                    return;
                }
            }
        });
        let mut b = Proxy::builder();
        b.upstream("default", &format!("tcp://{addr}"))
            .connections(1)
            .health_interval(Duration::ZERO)
            .reactor_connections(own);
        let proxy = b.start().unwrap();
        let mut methods = Registry::builder();
        proxy.install(&mut methods).unwrap();
        let engine = Engine::new(methods.freeze(), Config::default());
        let front = Served::start(engine, ServerConfig::default().reactors(2));

        let s = TcpStream::connect(front.tcp).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut r = BufReader::new(s);
        let mut carriers = std::collections::BTreeSet::new();
        for i in 0..50 {
            let call = format!(r#"{{"jsonrpc":"2.0","method":"which","id":{i}}}"#);
            r.get_mut()
                .write_all(format!("{call}\n").as_bytes())
                .unwrap();
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            let v: Value = serde_json::from_str(&line).unwrap();
            assert_eq!(v["id"], i, "{v}");
            carriers.insert(v["result"].as_u64().unwrap());
        }
        // One client, one reactor: its calls all take one connection.
        assert_eq!(carriers.len(), 1, "{carriers:?}");
        // The shared connection, and with `own` one for each of the two reactors
        // (connected as they start; waited for, not timed).
        let want = if own { 3 } else { 1 };
        for _ in 0..1000 {
            if accepted.load(Ordering::SeqCst) >= want {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(accepted.load(Ordering::SeqCst), want, "own: {own}");
        drop(r);
        front.stop();
        drop(proxy);
    }
}
