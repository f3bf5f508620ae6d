//! Subscriptions through the proxy, over real sockets: ticks in order with no gap over
//! WebSocket and TCP; 50 clients with one subscription share one upstream subscription
//! (counted where it runs), other params get their own; the last unsubscribe, or
//! disconnect, unsubscribes upstream (a silent subscription too); an upstream's
//! refusal reaches the client as its error, byte for byte; a lost upstream ends its
//! subscriptions with an error and the proxy serves on; a client that never reads
//! delays nobody; a subscribe answered after its caller gave up is unsubscribed. Also
//! calls and batches over WebSocket through the proxy.
//!
//! Every socket and wait is bounded, so a hang fails the test instead of stalling it.

mod util;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ringrpc::client::{Client, Error};
use ringrpc::proxy::{Proxy, ProxyBuilder};
use ringrpc::{
    demo, Config, Context, Engine, Params, Registry, RpcError, ServerConfig, Sink, SinkClosed,
};
use serde_json::{json, Value};
use util::server::Served;

/// A newline-delimited connection (`util::line`).
type Lines = util::line::Line<TcpStream>;

const WAIT: Duration = Duration::from_secs(10);

/// Serves `proxy` as the fallback of an otherwise empty registry, with its metrics.
fn served_proxy(proxy: &Proxy, config: Config) -> Served {
    let mut methods = Registry::builder();
    proxy.install(&mut methods).unwrap();
    let engine = Engine::new(methods.freeze(), config);
    if let Some(m) = engine.metrics() {
        proxy.export_metrics(m);
    }
    Served::start(engine, ServerConfig::default())
}

/// A proxy to `url` forwarding `subscribe_ticks`, one connection per upstream.
fn ticks_proxy(url: &str, more: impl FnOnce(&mut ProxyBuilder)) -> (Proxy, Served) {
    let mut b = Proxy::builder();
    b.upstream("default", url).connections(1).subscription(
        "subscribe_ticks",
        "tick",
        "unsubscribe_ticks",
    );
    more(&mut b);
    let proxy = b.start().unwrap();
    let front = served_proxy(&proxy, Config::default());
    (proxy, front)
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

/// Waits (at most `WAIT`) until `done` holds.
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < until, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

impl Lines {
    /// Subscribes to ticks every `ms` (id 1): the subscription id.
    fn subscribe(&mut self, params: &str) -> Value {
        self.send(&format!(
            r#"{{"jsonrpc":"2.0","method":"subscribe_ticks","params":{params},"id":"s"}}"#
        ));
        let v = self.next();
        assert_eq!(v["id"], "s", "{v}");
        assert!(v.get("error").is_none(), "the subscribe was refused: {v}");
        v["result"].clone()
    }
}

/// What the counting upstream saw.
#[derive(Default)]
struct Seen {
    opened: AtomicUsize,
    closed: Mutex<Vec<SinkClosed>>,
}

/// An upstream whose `subscribe_ticks [ms]` (or `[ms, pad]`) counts every
/// subscription it opens and records why each ended; its ticks are
/// `{"n":N,"pad":"xx…"}` every `ms` (0: never — a silent subscription).
fn counting_upstream(seen: Arc<Seen>) -> Served {
    let mut methods = Registry::builder();
    methods
        .subscription(
            "subscribe_ticks",
            "tick",
            "unsubscribe_ticks",
            move |_ctx: &Context<'_>, p: Params<'_>, sink: Sink| {
                let (ms, pad): (u64, usize) = match p.parse::<(u64, usize)>() {
                    Ok(v) => v,
                    Err(_) => {
                        let [ms]: [u64; 1] = p.parse()?;
                        (ms, 0)
                    }
                };
                seen.opened.fetch_add(1, Ordering::SeqCst);
                let record = Arc::clone(&seen);
                sink.on_close(move |why| record.closed.lock().unwrap().push(why));
                if ms > 0 {
                    std::thread::spawn(move || {
                        let pad = "x".repeat(pad);
                        let mut n = 0u64;
                        while sink.send(&json!({"n": n, "pad": pad})).is_ok() {
                            n += 1;
                            std::thread::sleep(Duration::from_millis(ms));
                        }
                    });
                }
                Ok::<(), RpcError>(())
            },
        )
        .unwrap()
        .method("ping", |_p: Params<'_>| Ok("pong"))
        .unwrap();
    Served::start(
        Engine::new(methods.freeze(), Config::default()),
        ServerConfig::default(),
    )
}

/// The next notification's result, within `WAIT`.
fn next_note(sub: &mut ringrpc::client::Subscription<'_>) -> ringrpc::client::Notification {
    match sub.next_timeout(WAIT) {
        Some(Ok(n)) => n,
        other => panic!("expected a notification, got {other:?}"),
    }
}

#[test]
fn calls_and_batches_over_websocket_through_the_proxy() {
    let upstream = Served::start(demo::engine(Config::default()), ServerConfig::default());
    let (proxy, front) = ticks_proxy(&format!("tcp://{}", upstream.tcp), |_| {});
    let c = Client::connect(&format!("ws://{}/", front.http)).unwrap();
    let d: i64 = c.call("subtract", [42, 23]).unwrap();
    assert_eq!(d, 19);
    let echoed: Value = c
        .call("echo", json!([{"s": "é\n\"", "n": [1.5, -0.0]}]))
        .unwrap();
    assert_eq!(echoed, json!([{"s": "é\n\"", "n": [1.5, -0.0]}]));
    let mut batch = c.batch();
    let a = batch.call("add", [1, 2]).unwrap();
    let b = batch.call("subtract", [10, 4]).unwrap();
    let e = batch.call("no_such_method", ()).unwrap();
    let mut answers = batch.send().unwrap();
    assert_eq!(answers.get::<i64>(a).unwrap(), 3);
    assert_eq!(answers.get::<i64>(b).unwrap(), 6);
    match answers.get::<Value>(e) {
        Err(Error::Server(e)) => assert_eq!(e.code, -32601),
        other => panic!("{other:?}"),
    }
    drop(c);
    front.stop();
    drop(proxy);
    upstream.stop();
}

#[test]
fn ticks_through_the_proxy_come_in_order_without_gaps_over_websocket_and_tcp() {
    let upstream = Served::start(demo::engine(Config::default()), ServerConfig::default());
    let (proxy, front) = ticks_proxy(&format!("tcp://{}", upstream.tcp), |_| {});
    for url in [
        format!("ws://{}/", front.http),
        format!("tcp://{}", front.tcp),
    ] {
        let c = Client::connect(&url).unwrap();
        // Different intervals: each client its own upstream subscription, from tick 0.
        let ms = if url.starts_with("ws") { 1 } else { 2 };
        let mut ticks = c
            .subscribe("subscribe_ticks", [ms], "unsubscribe_ticks")
            .unwrap();
        for want in 0..300u64 {
            let n = next_note(&mut ticks);
            assert_eq!(n.missed_before(), 0, "{url}");
            assert_eq!(
                n.parse::<u64>().unwrap(),
                want,
                "{url}: a gap or reordering"
            );
        }
        // Calls share the connection meanwhile.
        let d: i64 = c.call("subtract", [5, 3]).unwrap();
        assert_eq!(d, 2);
        assert!(ticks.unsubscribe().unwrap(), "{url}");
    }
    // Over HTTP a subscription cannot be carried.
    let mut s = TcpStream::connect(front.http).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let body = r#"{"jsonrpc":"2.0","method":"subscribe_ticks","params":[1],"id":1}"#;
    write!(
        s,
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut s, &mut text).unwrap();
    assert!(text.contains("push_unsupported"), "{text}");
    front.stop();
    drop(proxy);
    upstream.stop();
}

#[test]
fn fifty_clients_share_one_upstream_subscription_and_the_last_to_go_unsubscribes_it() {
    let seen = Arc::new(Seen::default());
    let upstream = counting_upstream(Arc::clone(&seen));
    let url = format!("tcp://{}", upstream.tcp);
    let (proxy, front) = ticks_proxy(&url, |_| {});
    // 50 clients at once, half over WebSocket, each reading 50 ticks in order.
    let ready = Arc::new(std::sync::Barrier::new(51));
    let done = Arc::new(std::sync::Barrier::new(51));
    let clients: Vec<_> = (0..50)
        .map(|i| {
            let url = if i % 2 == 0 {
                format!("ws://{}/", front.http)
            } else {
                format!("tcp://{}", front.tcp)
            };
            let (ready, done) = (Arc::clone(&ready), Arc::clone(&done));
            std::thread::spawn(move || {
                let c = Client::connect(&url).unwrap();
                let mut ticks = c
                    .subscribe("subscribe_ticks", [1], "unsubscribe_ticks")
                    .unwrap();
                let first: Value = next_note(&mut ticks).parse().unwrap();
                let first = first["n"].as_u64().unwrap();
                for want in first + 1..first + 51 {
                    let note = next_note(&mut ticks);
                    assert_eq!(note.missed_before(), 0);
                    let v: Value = note.parse().unwrap();
                    assert_eq!(v["n"].as_u64().unwrap(), want, "{url}: a gap");
                }
                ready.wait();
                // Held until the test has counted.
                done.wait();
                assert!(ticks.unsubscribe().unwrap());
            })
        })
        .collect();
    ready.wait();
    assert_eq!(
        seen.opened.load(Ordering::SeqCst),
        1,
        "one upstream subscription"
    );
    let series = format!("ringrpc_proxy_subscriptions{{upstream=\"{url}\"}}");
    assert_eq!(scraped(front.http, &series), Some(1.0));
    assert_eq!(scraped(front.http, "ringrpc_proxy_subscribers"), Some(50.0));
    assert!(scraped(front.http, "ringrpc_proxy_notifications_delivered_total").unwrap() >= 2500.0);
    // Other params: another upstream subscription.
    let mut other = Lines::tcp(front.tcp);
    let id = other.subscribe("[2]");
    let v = other.next();
    assert_eq!(v["params"]["subscription"], id, "{v}");
    assert_eq!(seen.opened.load(Ordering::SeqCst), 2);
    assert_eq!(scraped(front.http, &series), Some(2.0));
    // The 50 unsubscribe: their upstream subscription goes, the other stays.
    done.wait();
    for c in clients {
        c.join().unwrap();
    }
    eventually("the shared subscription unsubscribed upstream", || {
        seen.closed.lock().unwrap().len() == 1
    });
    assert_eq!(*seen.closed.lock().unwrap(), [SinkClosed::Unsubscribed]);
    assert_eq!(scraped(front.http, &series), Some(1.0));
    // The other client's ticks go on; its disconnect counts as unsubscribing.
    let v = other.next();
    assert_eq!(v["params"]["subscription"], id, "{v}");
    drop(other);
    eventually(
        "a disconnected client's subscription unsubscribed upstream",
        || seen.closed.lock().unwrap().len() == 2,
    );
    assert_eq!(
        *seen.closed.lock().unwrap(),
        [SinkClosed::Unsubscribed, SinkClosed::Unsubscribed]
    );
    assert_eq!(scraped(front.http, &series), Some(0.0));
    assert_eq!(scraped(front.http, "ringrpc_proxy_subscribers"), Some(0.0));
    front.stop();
    drop(proxy);
    upstream.stop();
}

#[test]
fn one_of_two_clients_leaving_keeps_the_upstream_subscription_and_a_silent_one_is_cleaned_up() {
    let seen = Arc::new(Seen::default());
    let upstream = counting_upstream(Arc::clone(&seen));
    let (proxy, front) = ticks_proxy(&format!("tcp://{}", upstream.tcp), |_| {});
    let mut a = Lines::tcp(front.tcp);
    let mut b = Lines::tcp(front.tcp);
    // The same call in two spellings: one upstream subscription.
    let ida = a.subscribe("[1]");
    let idb = b.subscribe("[ 1 ]");
    assert_ne!(ida, idb, "each client its own subscription id");
    assert_eq!(seen.opened.load(Ordering::SeqCst), 1);
    a.send(&format!(
        r#"{{"jsonrpc":"2.0","method":"unsubscribe_ticks","params":[{ida}],"id":"u"}}"#
    ));
    loop {
        let v = a.next();
        if v["id"] == "u" {
            assert_eq!(v["result"], true);
            break;
        }
        assert_eq!(v["params"]["subscription"], ida, "{v}");
    }
    // B's ticks go on, consecutive: the upstream subscription stayed.
    let mut last = None;
    for _ in 0..100 {
        let v = b.next();
        assert_eq!(v["params"]["subscription"], idb, "{v}");
        let n = v["params"]["result"]["n"].as_u64().unwrap();
        if let Some(l) = last {
            assert_eq!(n, l + 1, "a gap");
        }
        last = Some(n);
    }
    assert!(seen.closed.lock().unwrap().is_empty());
    drop(b);
    eventually("unsubscribed upstream", || {
        seen.closed.lock().unwrap().len() == 1
    });
    // A subscription that never sends anything is unsubscribed when its client goes,
    // without a notification to find out by.
    let mut c = Lines::tcp(front.tcp);
    c.subscribe("[0]");
    assert_eq!(seen.opened.load(Ordering::SeqCst), 2);
    drop(c);
    eventually("the silent subscription unsubscribed upstream", || {
        seen.closed.lock().unwrap().len() == 2
    });
    assert_eq!(
        *seen.closed.lock().unwrap(),
        [SinkClosed::Unsubscribed, SinkClosed::Unsubscribed]
    );
    front.stop();
    drop(proxy);
    upstream.stop();
}

#[test]
fn an_upstream_refusal_reaches_the_client_as_its_error_byte_for_byte() {
    let upstream = Served::start(demo::engine(Config::default()), ServerConfig::default());
    let (proxy, front) = ticks_proxy(&format!("tcp://{}", upstream.tcp), |_| {});
    for params in [r#"[0]"#, r#"["x"]"#, r#"{"interval":1}"#] {
        let frame =
            format!(r#"{{"jsonrpc":"2.0","method":"subscribe_ticks","params":{params},"id":7}}"#);
        let mut direct = Lines::tcp(upstream.tcp);
        direct.send(&frame);
        let want = direct.line();
        assert!(want.contains(r#""error":"#), "{want}");
        let mut via = Lines::tcp(front.tcp);
        via.send(&frame);
        assert_eq!(via.line(), want, "{params}");
        // Nothing follows the error.
        via.send(r#"{"jsonrpc":"2.0","method":"ping","id":8}"#);
        assert_eq!(via.next(), json!({"jsonrpc":"2.0","id":8,"result":"pong"}));
    }
    front.stop();
    drop(proxy);
    upstream.stop();
}

#[test]
fn a_lost_upstream_ends_its_subscriptions_with_an_error_and_the_proxy_serves_on() {
    let upstream = Served::start(demo::engine(Config::default()), ServerConfig::default());
    let addr = upstream.tcp;
    let (proxy, front) = ticks_proxy(&format!("tcp://{addr}"), |b| {
        b.health_interval(Duration::ZERO);
    });
    let mut a = Lines::tcp(front.tcp);
    let mut b = Lines::tcp(front.tcp);
    let ida = a.subscribe("[1]");
    let idb = b.subscribe("[3]");
    a.next();
    b.next();
    upstream.stop();
    for (c, id) in [(&mut a, ida), (&mut b, idb)] {
        // Ticks already on their way, then the error that ends it.
        let end = loop {
            let v = c.next();
            assert_eq!(v["params"]["subscription"], id, "{v}");
            if v["params"].get("result").is_none() {
                break v;
            }
        };
        let e = &end["params"]["error"];
        assert_eq!(e["code"], -32000, "{end}");
        assert_eq!(e["data"]["reason"], "upstream_unavailable", "{end}");
        assert!(
            e["message"]
                .as_str()
                .unwrap()
                .contains("subscription ended"),
            "{end}"
        );
        // Nothing of it follows.
        c.send(r#"{"jsonrpc":"2.0","method":"ping","id":"p"}"#);
        assert_eq!(c.next()["id"], "p");
    }
    // Meanwhile the proxy answers, and subscribing fails plainly.
    a.send(r#"{"jsonrpc":"2.0","method":"add","params":[1,2],"id":1}"#);
    assert_eq!(a.next()["error"]["data"]["reason"], "upstream_unavailable");
    a.send(r#"{"jsonrpc":"2.0","method":"subscribe_ticks","params":[1],"id":2}"#);
    assert_eq!(a.next()["error"]["data"]["reason"], "upstream_unavailable");
    // Back at the same address: calls and subscriptions work again.
    let mut server = ringrpc::server::Server::new(demo::engine(Config::default())).unwrap();
    server.listen_tcp(addr).unwrap();
    let handle = server.handle();
    let back = std::thread::spawn(move || server.run());
    eventually("the proxy reconnected", || {
        a.send(r#"{"jsonrpc":"2.0","method":"add","params":[1,2],"id":3}"#);
        a.next()["result"] == 3
    });
    let id = a.subscribe("[1]");
    for want in 0..20u64 {
        let v = a.next();
        assert_eq!(v["params"]["subscription"], id, "{v}");
        assert_eq!(v["params"]["result"], want, "{v}");
    }
    drop((a, b));
    front.stop();
    drop(proxy);
    handle.shutdown();
    back.join().unwrap().unwrap();
}

/// How [`flaky_upstream`] treats the connections it accepts from now on.
const SERVE: u8 = 0;
/// Closed at once (counted), as an upstream that is not back yet.
const SHUT: u8 = 1;

/// What [`flaky_upstream`] is told and counts.
#[derive(Default)]
struct Flaky {
    mode: std::sync::atomic::AtomicU8,
    /// Its next `subscribe_ticks` is answered with a line that is not JSON.
    garbage: std::sync::atomic::AtomicBool,
    /// Connections closed at once (in mode `SHUT`).
    shut: AtomicUsize,
    /// The connections it serves, to be cut.
    served: Mutex<Vec<TcpStream>>,
}

/// A line upstream at `addr`: every call with an id is answered `3` (health probes
/// too), except `subscribe_ticks`, answered `"0x5"` and followed by 20 `tick`
/// notifications of it with results 0 to 19.
fn flaky_upstream(flaky: Arc<Flaky>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(s) = s else { return };
            if flaky.mode.load(Ordering::SeqCst) == SHUT {
                drop(s);
                flaky.shut.fetch_add(1, Ordering::SeqCst);
                continue;
            }
            flaky.served.lock().unwrap().push(s.try_clone().unwrap());
            let flaky = Arc::clone(&flaky);
            std::thread::spawn(move || {
                let mut r = BufReader::new(s);
                let mut line = String::new();
                while r.read_line(&mut line).is_ok_and(|n| n > 0) {
                    let call: Value = serde_json::from_str(&line).unwrap();
                    line.clear();
                    let Some(id) = call.get("id") else { continue };
                    let mut out = String::new();
                    if call["method"] != "subscribe_ticks" {
                        out = json!({"jsonrpc":"2.0","id":id,"result":3}).to_string() + "\n";
                    } else if flaky.garbage.swap(false, Ordering::SeqCst) {
                        out.push_str("garbage\n");
                    } else {
                        out = json!({"jsonrpc":"2.0","id":id,"result":"0x5"}).to_string() + "\n";
                        for n in 0..20 {
                            let params = json!({"subscription":"0x5","result":n});
                            let note = json!({"jsonrpc":"2.0","method":"tick","params":params});
                            out = out + &note.to_string() + "\n";
                        }
                    }
                    if r.get_mut().write_all(out.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[test]
fn an_upstream_back_for_calls_is_back_for_subscriptions_at_once() {
    let flaky = Arc::new(Flaky::default());
    let addr = flaky_upstream(Arc::clone(&flaky));
    let (proxy, front) = ticks_proxy(&format!("tcp://{addr}"), |b| {
        b.health_interval(Duration::ZERO);
    });
    let mut a = Lines::tcp(front.tcp);
    // Calls go on the connection of `a`'s reactor, subscriptions on the shared one:
    // both serve.
    eventually("a call answered", || {
        a.send(r#"{"jsonrpc":"2.0","method":"add","params":[1,2],"id":1}"#);
        a.next()["result"] == 3
    });
    let mut b = Lines::tcp(front.tcp);
    let id = b.subscribe("[1]");
    for want in 0..20u64 {
        let v = b.next();
        assert_eq!(v["params"]["subscription"], id, "{v}");
        assert_eq!(v["params"]["result"], want, "{v}");
    }
    drop(b);
    // The upstream goes: its answer to a subscribe drops the shared connection (which
    // subscriptions take), and it refuses every new one, so that connection backs off
    // longer each time — 50, 100, 200, 400, 800 ms, then 1.6 s after the fifth.
    flaky.mode.store(SHUT, Ordering::SeqCst);
    flaky.garbage.store(true, Ordering::SeqCst);
    a.send(r#"{"jsonrpc":"2.0","method":"subscribe_ticks","params":[2],"id":2}"#);
    let v = a.next();
    assert_eq!(v["error"]["data"]["reason"], "upstream_unavailable", "{v}");
    assert!(!flaky.garbage.load(Ordering::SeqCst), "{v}");
    eventually("five connections refused", || {
        flaky.shut.load(Ordering::SeqCst) >= 5
    });
    // Back, and the reactor's connection, cut, is made again at once: calls are
    // answered. A subscribe is too, and its ticks come, though the shared connection
    // was still to wait most of its backoff: the reactor's connection answering showed
    // the upstream serves.
    flaky.mode.store(SERVE, Ordering::SeqCst);
    for s in flaky.served.lock().unwrap().drain(..) {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
    eventually("calls answered again", || {
        a.send(r#"{"jsonrpc":"2.0","method":"add","params":[1,2],"id":3}"#);
        a.next()["result"] == 3
    });
    let id = a.subscribe("[1]");
    for want in 0..20u64 {
        let v = a.next();
        assert_eq!(v["params"]["subscription"], id, "{v}");
        assert_eq!(v["params"]["result"], want, "{v}");
    }
    drop(a);
    front.stop();
    drop(proxy);
}

#[test]
fn a_client_that_never_reads_delays_no_other() {
    let seen = Arc::new(Seen::default());
    let upstream = counting_upstream(Arc::clone(&seen));
    // Small queues, so the slow client's falls behind within the test.
    let (proxy, front) = ticks_proxy(&format!("tcp://{}", upstream.tcp), |b| {
        b.subscription_queue(16);
    });
    // 8 KiB ticks every 2 ms: the slow client's socket buffers fill within the 2,000
    // ticks the fast one reads, and the fast one (a debug build's JSON parsing) keeps up
    // on a loaded machine too (its slack, the queue, the high-water mark and its socket
    // buffers, a few hundred ticks, is twice as long as at 1 ms).
    let params = "[2,8192]";
    let mut slow = Lines::tcp(front.tcp);
    let slow_id = slow.subscribe(params);
    let mut fast = Lines::tcp(front.tcp);
    let fast_id = fast.subscribe(params);
    assert_eq!(seen.opened.load(Ordering::SeqCst), 1);
    let mut last = None;
    for _ in 0..2000 {
        let v = fast.next();
        assert_eq!(v["params"]["subscription"], fast_id, "{v}");
        let n = v["params"]["result"]["n"]
            .as_u64()
            .unwrap_or_else(|| panic!("the fast client lagged: {v}"));
        if let Some(l) = last {
            assert_eq!(n, l + 1, "a gap for the fast client");
        }
        last = Some(n);
    }
    // The slow one lost some (16 MB were sent to it; its socket buffers and queue hold
    // a few), counted in a `lagged` notification among what it finds now.
    let mut lagged = 0;
    for _ in 0..3000 {
        let v = slow.next();
        assert_eq!(v["params"]["subscription"], slow_id, "{v}");
        lagged = v["params"]["lagged"].as_u64().unwrap_or(0);
        if lagged > 0 {
            break;
        }
    }
    assert!(lagged > 0, "the slow client's queue never overflowed");
    front.stop();
    drop(proxy);
    upstream.stop();
}

#[test]
fn a_subscribe_answered_after_its_caller_gave_up_is_unsubscribed_upstream() {
    // An upstream that answers the subscribe only when told, then reports the next
    // line it reads (the proxy's unsubscribe).
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (line_tx, line_rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        let mut r = BufReader::new(s);
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let sub: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(sub["method"], "subscribe_ticks");
        go_rx.recv_timeout(WAIT).unwrap();
        let answer = json!({"jsonrpc":"2.0","id":sub["id"],"result":"0xab"});
        r.get_mut()
            .write_all(format!("{answer}\n").as_bytes())
            .unwrap();
        let mut next = String::new();
        r.read_line(&mut next).unwrap();
        let _ = line_tx.send(next);
    });
    // One upstream connection (the fake accepts one): no reactor connections of the
    // proxy's own, which could be the one accepted while the subscribe goes on the
    // upstream thread's (seen under load: the subscribe was never read).
    let mut b = Proxy::builder();
    b.upstream("default", &format!("tcp://{addr}"))
        .connections(1)
        .reactor_connections(false)
        .health_interval(Duration::ZERO)
        .timeout(Duration::from_millis(100))
        .subscription("subscribe_ticks", "tick", "unsubscribe_ticks");
    let proxy = b.start().unwrap();
    let front = served_proxy(
        &proxy,
        Config::default().request_timeout(Some(Duration::from_millis(50))),
    );
    let mut c = Lines::tcp(front.tcp);
    c.send(r#"{"jsonrpc":"2.0","method":"subscribe_ticks","params":[1],"id":1}"#);
    let v = c.next();
    assert_eq!(v["error"]["code"], -32001, "{v}");
    // The proxy's own wait for the upstream ends too; then the answer comes after all.
    std::thread::sleep(Duration::from_millis(300));
    go_tx.send(()).unwrap();
    let unsub: Value = serde_json::from_str(&line_rx.recv_timeout(WAIT).unwrap()).unwrap();
    assert_eq!(unsub["method"], "unsubscribe_ticks", "{unsub}");
    assert_eq!(unsub["params"], json!(["0xab"]), "{unsub}");
    // Nothing reached the client.
    c.send(r#"{"jsonrpc":"2.0","method":"unsubscribe_ticks","params":[1],"id":2}"#);
    assert_eq!(c.next()["id"], 2);
    front.stop();
    drop(proxy);
}

#[test]
fn an_upstreams_lagged_error_and_closed_notifications_are_relayed() {
    // A scripted upstream: subscription "0xa" for params [1], "0xb" for [2]; then,
    // once both are open, a script of notifications; then it reports the next line it
    // reads (there should be none before the test's own `ping` through the proxy).
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (line_tx, line_rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        let mut r = BufReader::new(s);
        for _ in 0..2 {
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            let sub: Value = serde_json::from_str(&line).unwrap();
            let id = if sub["params"] == json!([1]) {
                "0xa"
            } else {
                "0xb"
            };
            let answer = json!({"jsonrpc":"2.0","id":sub["id"],"result":id});
            r.get_mut()
                .write_all(format!("{answer}\n").as_bytes())
                .unwrap();
        }
        go_rx.recv_timeout(WAIT).unwrap();
        let script = concat!(
            r#"{"jsonrpc":"2.0","method":"tick","params":{"subscription":"0xa","result":{"k": [1, "x"]}}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","method":"tick","params":{"subscription":"0xa","lagged":5}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","method":"tick","params":{"subscription":"0xa","result":2}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","method":"tick","params":{"subscription":"0xa","error":{"code":-32099, "message":"feed gone","data":[1]}}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","method":"tick","params":{"subscription":"0xb","closed":true}}"#,
            "\n",
            // Of no live subscription: dropped.
            r#"{"jsonrpc":"2.0","method":"tick","params":{"subscription":"0xa","result":3}}"#,
            "\n",
        );
        r.get_mut().write_all(script.as_bytes()).unwrap();
        // What comes next is a call: ended upstream, nothing was unsubscribed.
        let mut next = String::new();
        r.read_line(&mut next).unwrap();
        let _ = line_tx.send(next.clone());
        let call: Value = serde_json::from_str(&next).unwrap();
        let answer = json!({"jsonrpc":"2.0","id":call["id"],"result":"pong"});
        r.get_mut()
            .write_all(format!("{answer}\n").as_bytes())
            .unwrap();
    });
    // One upstream connection (the script serves one), which the ping must take too:
    // no reactor connections of the proxy's own.
    let (proxy, front) = ticks_proxy(&format!("tcp://{addr}"), |b| {
        b.health_interval(Duration::ZERO).reactor_connections(false);
    });
    let mut a = Lines::tcp(front.tcp);
    let ida = a.subscribe("[1]");
    let mut b = Lines::tcp(front.tcp);
    let idb = b.subscribe("[2]");
    go_tx.send(()).unwrap();
    let note = |id: &Value, tail: &str| {
        format!(r#"{{"jsonrpc":"2.0","method":"tick","params":{{"subscription":{id},{tail}}}}}"#)
    };
    assert_eq!(a.line(), note(&ida, r#""result":{"k": [1, "x"]}"#));
    assert_eq!(a.line(), note(&ida, r#""lagged":5"#));
    assert_eq!(a.line(), note(&ida, r#""result":2"#));
    assert_eq!(
        a.line(),
        note(
            &ida,
            r#""error":{"code":-32099, "message":"feed gone","data":[1]}"#
        )
    );
    assert_eq!(b.line(), note(&idb, r#""closed":true"#));
    a.send(r#"{"jsonrpc":"2.0","method":"ping","id":9}"#);
    assert_eq!(a.next(), json!({"jsonrpc":"2.0","id":9,"result":"pong"}));
    let next: Value = serde_json::from_str(&line_rx.recv_timeout(WAIT).unwrap()).unwrap();
    assert_eq!(next["method"], "ping", "{next}");
    let series = format!("ringrpc_proxy_subscriptions{{upstream=\"tcp://{addr}\"}}");
    assert_eq!(scraped(front.http, &series), Some(0.0));
    front.stop();
    drop(proxy);
}

#[test]
fn a_subscribe_in_a_batch_is_answered_in_its_place_before_its_notifications() {
    let upstream = Served::start(demo::engine(Config::default()), ServerConfig::default());
    let (proxy, front) = ticks_proxy(&format!("tcp://{}", upstream.tcp), |_| {});
    let mut c = Lines::tcp(front.tcp);
    c.send(
        r#"[{"jsonrpc":"2.0","method":"ping","id":1},{"jsonrpc":"2.0","method":"subscribe_ticks","params":[1],"id":2},{"jsonrpc":"2.0","method":"delay","params":[50],"id":3}]"#,
    );
    let answers = c.next();
    let answers = answers.as_array().expect("the batch's answer first");
    assert_eq!(answers[0], json!({"jsonrpc":"2.0","id":1,"result":"pong"}));
    assert_eq!(answers[1]["id"], 2);
    let id = answers[1]["result"].clone();
    assert!(id.is_u64(), "{answers:?}");
    assert_eq!(answers[2], json!({"jsonrpc":"2.0","id":3,"result":null}));
    for want in 0..20u64 {
        let v = c.next();
        assert_eq!(v["params"]["subscription"], id, "{v}");
        assert_eq!(v["params"]["result"], want, "{v}");
    }
    drop(c);
    front.stop();
    drop(proxy);
    upstream.stop();
}
