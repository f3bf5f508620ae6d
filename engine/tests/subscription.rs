//! Subscriptions over real sockets: ticks in order with no gaps (TCP, Unix, WebSocket
//! with Python's `websockets`), unsubscribing, 1000 subscriptions on one connection,
//! the subscription id answered before the first notification, a subscriber that never
//! reads (bounded: the oldest dropped and counted exactly, or the subscription ended),
//! and a closing connection ending its subscriptions.
//!
//! Every socket has timeouts, so a hang fails the test instead of stalling it.

mod util;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ringrpc::{
    demo, Config, Context, Engine, Lagging, Params, Registry, RpcError, ServerConfig, Sink,
    SinkClosed, SubscriptionConfig,
};
use serde_json::{json, Value};
use util::server::Served;

fn served() -> Served {
    Served::start(demo::engine(Config::default()), ServerConfig::default())
}

/// A newline-delimited connection that reads whatever comes, line by line.
struct Lines<S: Read + Write> {
    r: BufReader<S>,
}

impl<S: Read + Write> Lines<S> {
    fn send(&mut self, v: &Value) {
        let mut line = serde_json::to_vec(v).unwrap();
        line.push(b'\n');
        self.r.get_mut().write_all(&line).unwrap();
    }

    fn next(&mut self) -> Value {
        let mut line = String::new();
        assert!(self.r.read_line(&mut line).unwrap() > 0, "closed");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    }

    /// The answer to call `id`, and the notifications read before it.
    fn answer(&mut self, id: &Value) -> (Value, Vec<Value>) {
        let mut notes = Vec::new();
        loop {
            let v = self.next();
            if v.get("method").is_some() {
                notes.push(v);
            } else {
                assert_eq!(&v["id"], id, "answers come in request order: {v}");
                return (v, notes);
            }
        }
    }
}

fn tcp(addr: std::net::SocketAddr) -> Lines<TcpStream> {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    Lines {
        r: BufReader::new(s),
    }
}

fn call(method: &str, params: Value, id: u64) -> Value {
    json!({"jsonrpc": "2.0", "method": method, "params": params, "id": id})
}

/// Reads `count` ticks of subscription `sub` (other lines must be ticks of it too) and
/// checks they are 0, 1, 2, … with no gap.
fn ticks_in_order<S: Read + Write>(c: &mut Lines<S>, sub: &Value, count: u64) {
    for n in 0..count {
        let v = c.next();
        assert_eq!(v["method"], "tick", "{v}");
        assert_eq!(&v["params"]["subscription"], sub, "{v}");
        assert_eq!(v["params"]["result"], n, "a gap or a reordering: {v}");
        assert!(v.get("id").is_none(), "a notification has no id: {v}");
    }
}

#[test]
fn ticks_arrive_in_order_on_tcp_and_unix_and_stop_when_unsubscribed() {
    let server = served();
    let mut t = tcp(server.tcp);
    let u = UnixStream::connect(&server.unix).unwrap();
    u.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut u = Lines {
        r: BufReader::new(u),
    };
    t.send(&call("subscribe_ticks", json!([1]), 1));
    u.send(&call("subscribe_ticks", json!([1]), 1));
    let (a, early) = t.answer(&json!(1));
    assert!(early.is_empty(), "a notification before the id: {early:?}");
    let (b, _) = u.answer(&json!(1));
    let (ta, ub) = (a["result"].clone(), b["result"].clone());
    assert!(ta.is_u64() && ub.is_u64() && ta != ub, "{a} {b}");
    // 1 ms ticks for a second: every one, in order.
    ticks_in_order(&mut t, &ta, 1000);
    ticks_in_order(&mut u, &ub, 1000);
    // Another connection's id, or an unknown one, is not this connection's.
    t.send(&call("unsubscribe_ticks", json!([ub]), 2));
    let (no, _) = t.answer(&json!(2));
    assert_eq!(no["result"], false);
    t.send(&call("unsubscribe_ticks", json!([ta]), 3));
    let (yes, _) = t.answer(&json!(3));
    assert_eq!(yes["result"], true);
    // Nothing of it after the answer: a ping 50 ms later comes next.
    std::thread::sleep(Duration::from_millis(50));
    t.send(&call("ping", json!([]), 4));
    let (pong, stragglers) = t.answer(&json!(4));
    assert_eq!(pong["result"], "pong");
    assert!(
        stragglers.is_empty(),
        "ticks after unsubscribing: {stragglers:?}"
    );
    // The Unix subscription went on meanwhile.
    let v = u.next();
    assert_eq!(v["params"]["subscription"], ub);
    // Bad params are the subscribe call's error; no subscription is made.
    t.send(&call("subscribe_ticks", json!([0]), 5));
    let (bad, _) = t.answer(&json!(5));
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
    server.stop();
}

#[test]
fn the_id_comes_before_the_first_tick_behind_a_slow_call() {
    let server = served();
    let mut t = tcp(server.tcp);
    // Pipelined: the subscribe call's answer waits for the slow call's, and its ticks
    // (due every millisecond meanwhile) wait for it.
    t.send(&call("delay", json!([150]), 1));
    t.send(&call("subscribe_ticks", json!([1]), 2));
    let (slow, before) = t.answer(&json!(1));
    assert_eq!(slow["result"], Value::Null);
    assert!(before.is_empty(), "{before:?}");
    let (sub, before) = t.answer(&json!(2));
    assert!(
        before.is_empty(),
        "ticks before their subscription's id: {before:?}"
    );
    ticks_in_order(&mut t, &sub["result"], 20);
    server.stop();
}

#[test]
fn a_thousand_subscriptions_on_one_connection() {
    let server = served();
    let mut t = tcp(server.tcp);
    let subscribe: Vec<Value> = (0..1000)
        .map(|i| call("subscribe_ticks", json!([20]), i))
        .collect();
    t.send(&Value::Array(subscribe));
    // The batch's answer first: no tick passes the ids it answers.
    let mut seen: std::collections::HashMap<u64, u64> = Default::default();
    let batch = t.next();
    assert!(
        batch.is_array(),
        "a tick before the batch that subscribed: {batch}"
    );
    let ids: Vec<u64> = batch
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["result"].as_u64().unwrap())
        .collect();
    assert_eq!(ids.len(), 1000);
    // Each subscription's ticks in order with no gap, for five rounds each.
    while seen.len() < 1000 || seen.values().any(|&n| n < 5) {
        let v = t.next();
        let sub = v["params"]["subscription"].as_u64().unwrap();
        let n = v["params"]["result"].as_u64().unwrap();
        let next = seen.entry(sub).or_insert(0);
        assert_eq!(n, *next, "subscription {sub}: a gap");
        *next += 1;
    }
    assert!(seen.keys().all(|k| ids.contains(k)));
    let unsubscribe: Vec<Value> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| call("unsubscribe_ticks", json!([id]), i as u64))
        .collect();
    t.send(&Value::Array(unsubscribe));
    let answers = loop {
        let v = t.next();
        if v.is_array() {
            break v;
        }
    };
    assert!(answers
        .as_array()
        .unwrap()
        .iter()
        .all(|a| a["result"] == true));
    server.stop();
}

/// Pushes `count` notifications as fast as it can on a subscription the client does
/// not read, counting those accepted.
fn flood(count: u64, sent: Arc<AtomicU64>, ended: mpsc::Sender<Option<SinkClosed>>) -> Engine {
    let mut methods = demo::builder();
    let payload = "p".repeat(100);
    let config = |lagging| SubscriptionConfig {
        capacity: 64,
        lagging,
        ..SubscriptionConfig::default()
    };
    for (name, lagging) in [
        ("flood", Lagging::DropOldest),
        ("flood_or_end", Lagging::Close),
    ] {
        let (sent, ended, payload) = (Arc::clone(&sent), ended.clone(), payload.clone());
        methods
            .subscription_with(
                name,
                "data",
                &format!("un{name}"),
                config(lagging),
                move |_ctx: &Context<'_>, _p: Params<'_>, sink: Sink| {
                    let (sent, ended, payload) =
                        (Arc::clone(&sent), ended.clone(), payload.clone());
                    std::thread::spawn(move || {
                        let mut why = None;
                        for n in 0..count {
                            match sink.send(&json!([n, payload])) {
                                Ok(()) => {
                                    sent.fetch_add(1, Ordering::SeqCst);
                                }
                                Err(e) => {
                                    why = Some(e);
                                    break;
                                }
                            }
                        }
                        let _ = ended.send(why);
                    });
                    Ok(())
                },
            )
            .unwrap();
    }
    Engine::new(methods.freeze(), Config::default())
}

#[test]
fn a_subscriber_that_never_reads_is_bounded_and_told_what_it_lost() {
    const COUNT: u64 = 500_000;
    let sent = Arc::new(AtomicU64::new(0));
    let (tx, ended) = mpsc::channel();
    let server = Served::start(flood(COUNT, Arc::clone(&sent), tx), ServerConfig::default());
    let mut slow = tcp(server.tcp);
    slow.send(&call("flood", json!([]), 1));
    // The producer finishes without waiting for the reader.
    let why = ended.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(why, None, "every send accepted under DropOldest");
    assert_eq!(sent.load(Ordering::SeqCst), COUNT);
    // Others are served meanwhile.
    let mut other = tcp(server.tcp);
    other.send(&call("ping", json!([]), 1));
    assert_eq!(other.answer(&json!(1)).0["result"], "pong");
    // Now read everything: notifications in order, and `lagged` notes that account
    // exactly for the ones dropped; what was held for the reader stayed small.
    let (sub, _) = slow.answer(&json!(1));
    let sub = sub["result"].clone();
    let (mut delivered, mut lagged, mut bytes, mut last) = (0u64, 0u64, 0usize, None);
    while delivered + lagged < COUNT {
        let v = slow.next();
        bytes += v.to_string().len();
        assert_eq!(v["params"]["subscription"], sub);
        if let Some(n) = v["params"]["lagged"].as_u64() {
            lagged += n;
            continue;
        }
        let n = v["params"]["result"][0].as_u64().unwrap();
        assert!(
            last.is_none_or(|l| n > l),
            "out of order: {n} after {last:?}"
        );
        last = Some(n);
        delivered += 1;
    }
    eprintln!("{delivered} delivered, {lagged} dropped and counted, {bytes} bytes");
    assert_eq!(delivered + lagged, COUNT);
    assert!(lagged > 0, "a reader that never read lost nothing?");
    assert_eq!(
        last,
        Some(COUNT - 1),
        "the newest is kept, the oldest dropped"
    );
    // Socket buffers, the output's high-water mark and 64 queued: a few MB, of the
    // ~65 MB sent.
    assert!(
        bytes < 16 << 20,
        "{bytes} bytes held for a reader that did not read (of {} sent)",
        COUNT * 130
    );
    server.stop();
}

#[test]
fn a_slow_subscriber_can_be_ended_instead() {
    let sent = Arc::new(AtomicU64::new(0));
    let (tx, ended) = mpsc::channel();
    let server = Served::start(
        flood(200_000, Arc::clone(&sent), tx),
        ServerConfig::default(),
    );
    let mut slow = tcp(server.tcp);
    slow.send(&call("flood_or_end", json!([]), 1));
    let why = ended.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(why, Some(SinkClosed::Lagged));
    let (sub, _) = slow.answer(&json!(1));
    let sub = sub["result"].clone();
    let mut delivered = 0;
    let error = loop {
        let v = slow.next();
        assert_eq!(v["params"]["subscription"], sub);
        if v["params"].get("error").is_some() {
            break v;
        }
        delivered += 1;
    };
    assert_eq!(
        delivered,
        sent.load(Ordering::SeqCst),
        "every accepted send delivered"
    );
    assert_eq!(
        error["params"]["error"]["data"]["reason"], "lagged",
        "{error}"
    );
    // Nothing follows the error.
    slow.send(&call("ping", json!([]), 2));
    let (pong, after) = slow.answer(&json!(2));
    assert_eq!(pong["result"], "pong");
    assert!(after.is_empty(), "{after:?}");
    server.stop();
}

#[test]
fn closing_the_connection_ends_its_subscriptions() {
    let (tx, ended) = mpsc::channel();
    let mut methods = Registry::builder();
    methods
        .subscription(
            "watch",
            "seen",
            "unwatch",
            move |_ctx: &Context<'_>, _p: Params<'_>, sink: Sink| -> Result<(), RpcError> {
                let tx = tx.clone();
                std::thread::spawn(move || loop {
                    if let Err(why) = sink.send("x") {
                        let _ = tx.send(why);
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                });
                Ok(())
            },
        )
        .unwrap();
    let engine = Engine::new(methods.freeze(), Config::default());
    let server = Served::start(engine, ServerConfig::default());
    let mut t = tcp(server.tcp);
    t.send(&call("watch", json!([]), 1));
    let _ = t.answer(&json!(1));
    let _ = t.next();
    let started = Instant::now();
    drop(t);
    assert_eq!(
        ended.recv_timeout(Duration::from_secs(10)),
        Ok(SinkClosed::ConnectionClosed)
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    // Unsubscribing ends it with its own reason.
    let mut t = tcp(server.tcp);
    t.send(&call("watch", json!([]), 1));
    let (sub, _) = t.answer(&json!(1));
    t.send(&call("unwatch", json!([sub["result"]]), 2));
    let (yes, _) = t.answer(&json!(2));
    assert_eq!(yes["result"], true);
    assert_eq!(
        ended.recv_timeout(Duration::from_secs(10)),
        Ok(SinkClosed::Unsubscribed)
    );
    server.stop();
}

const PY_SUBSCRIBER: &str = r#"
import asyncio, json, sys, websockets

async def main(url):
    async with websockets.connect(url) as ws:
        await ws.send('{"jsonrpc":"2.0","method":"subscribe_ticks","params":[1],"id":1}')
        sub = json.loads(await ws.recv())["result"]
        ticks = [json.loads(await ws.recv()) for _ in range(500)]
        await ws.send(json.dumps({"jsonrpc": "2.0", "method": "unsubscribe_ticks", "params": [sub], "id": 2}))
        while True:
            m = json.loads(await ws.recv())
            if m.get("id") == 2:
                break
        await ws.send('{"jsonrpc":"2.0","method":"ping","id":3}')
        after = json.loads(await ws.recv())
    print(json.dumps({"sub": sub, "ns": [t["params"]["result"] for t in ticks],
                      "subs": sorted({t["params"]["subscription"] for t in ticks}),
                      "unsub": m, "after": after}))

asyncio.run(asyncio.wait_for(main(sys.argv[1]), 60))
"#;

#[test]
fn python_websockets_subscriber() {
    let server = served();
    let url = format!("ws://{}/", server.http);
    let got = util::python::run("websockets", PY_SUBSCRIBER, &url);
    let ns: Vec<u64> = (0..500).collect();
    assert_eq!(got["ns"], json!(ns));
    assert_eq!(got["subs"], json!([got["sub"]]));
    assert_eq!(got["unsub"]["result"], true);
    assert_eq!(
        got["after"]["result"], "pong",
        "no tick after unsubscribing"
    );
    server.stop();
}

/// A connection that only listens to its subscriptions is not idle: the idle timeout
/// closes a quiet connection, not a subscriber's.
#[test]
fn a_listening_subscriber_is_not_idle() {
    let settings = ServerConfig::default().idle_timeout(Some(Duration::from_millis(500)));
    let server = Served::start(demo::engine(Config::default()), settings);
    let mut quiet = tcp(server.tcp);
    quiet.send(&call("ping", json!([]), 1));
    let _ = quiet.answer(&json!(1));
    let mut listener = tcp(server.tcp);
    listener.send(&call("subscribe_ticks", json!([100]), 1));
    let (sub, _) = listener.answer(&json!(1));
    // Two and a half seconds: the idle sweep (every second) ran at least twice.
    ticks_in_order(&mut listener, &sub["result"], 25);
    let mut b = [0u8; 1];
    assert_eq!(
        quiet.r.get_mut().read(&mut b).unwrap_or(0),
        0,
        "the quiet one was closed"
    );
    server.stop();
}

/// The kernel's keepalive timer on the server's side of `peer` (its local port), as
/// `ss` shows it: `timer:(keepalive,…)`, or `None`.
fn keepalive_timer(server_port: u16, client_port: u16) -> Option<String> {
    let out = std::process::Command::new("ss")
        .args(["-tnoH", "state", "established"])
        .arg(format!(
            "( sport = :{server_port} and dport = :{client_port} )"
        ))
        .output()
        .expect("ss (iproute2) is installed");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.contains("keepalive").then_some(text)
}

#[test]
fn a_tcp_subscriber_gets_keepalive_probes_and_a_plain_connection_does_not() {
    let settings = ServerConfig::default().subscriber_ping_interval(Some(Duration::from_secs(5)));
    let server = Served::start(demo::engine(Config::default()), settings);
    let mut plain = tcp(server.tcp);
    let mut sub = tcp(server.tcp);
    let port = |c: &Lines<TcpStream>| c.r.get_ref().local_addr().unwrap().port();
    sub.send(&call("subscribe_ticks", json!([60000]), 1));
    plain.send(&call("ping", json!([]), 1));
    sub.answer(&json!(1));
    plain.answer(&json!(1));
    // The server turns keepalive on within its once-a-second check.
    let deadline = Instant::now() + Duration::from_secs(10);
    while keepalive_timer(server.tcp.port(), port(&sub)).is_none() {
        assert!(
            Instant::now() < deadline,
            "no keepalive timer on the subscriber's socket"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let shown = keepalive_timer(server.tcp.port(), port(&sub)).unwrap_or_default();
    assert!(shown.contains("timer:(keepalive,"), "{shown}");
    assert_eq!(keepalive_timer(server.tcp.port(), port(&plain)), None);
    server.stop();
}
