//! `Client::subscribe`: notifications read off the client's connection, against the
//! ringrpc server (TCP, Unix, WebSocket) and against scripted servers (string ids,
//! `lagged` counts, errors and closes, stray notifications, a connection lost).

mod util;

use std::io::Write;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ringrpc::client::{Client, Error, Options};
use ringrpc::{demo, Config, Context, Engine, Params, RpcError, ServerConfig, Sink};
use serde_json::{json, Value};
use util::server::Served;

#[path = "util/peer.rs"]
mod peer;
use peer::{answer, read_request, scripted};

fn served() -> Served {
    Served::start(demo::engine(Config::default()), ServerConfig::default())
}

fn push_urls(s: &Served) -> [String; 3] {
    [
        format!("tcp://{}", s.tcp),
        format!("unix://{}", s.unix.display()),
        format!("ws://{}/", s.http),
    ]
}

const WAIT: Duration = Duration::from_secs(10);

/// The next notification's result, within `WAIT`.
fn next(sub: &mut ringrpc::client::Subscription<'_>) -> ringrpc::client::Notification {
    match sub.next_timeout(WAIT) {
        Some(Ok(n)) => n,
        other => panic!("expected a notification, got {other:?}"),
    }
}

#[test]
fn ticks_arrive_in_order_on_every_push_transport_and_unsubscribe_answers_true() {
    let server = served();
    for url in push_urls(&server) {
        let c = Client::connect(&url).unwrap();
        let mut ticks = c
            .subscribe("subscribe_ticks", [1], "unsubscribe_ticks")
            .unwrap();
        assert!(ticks.id().parse::<u64>().is_ok(), "{url}: {}", ticks.id());
        for want in 0..300u64 {
            let n = next(&mut ticks);
            assert_eq!(
                n.parse::<u64>().unwrap(),
                want,
                "{url}: a gap or reordering"
            );
            assert_eq!(n.missed_before(), 0, "{url}");
        }
        assert!(ticks.unsubscribe().unwrap(), "{url}");
        // The connection goes on serving calls, with no notification in the way.
        assert_eq!(c.call::<String, _>("ping", ()).unwrap(), "pong", "{url}");
    }
    server.stop();
}

#[test]
fn dropping_a_subscription_unsubscribes_it() {
    let server = served();
    for url in push_urls(&server) {
        let c = Client::connect(&url).unwrap();
        let mut ticks = c
            .subscribe("subscribe_ticks", [1], "unsubscribe_ticks")
            .unwrap();
        next(&mut ticks);
        let id: u64 = ticks.id().parse().unwrap();
        drop(ticks);
        // The drop's unsubscribe was written first: the server no longer holds it.
        let held: bool = c.call("unsubscribe_ticks", [id]).unwrap();
        assert!(!held, "{url}: the dropped subscription is still open");
        for i in 0..50 {
            assert_eq!(c.call::<i64, _>("add", [i, 1]).unwrap(), i + 1, "{url}");
        }
    }
    server.stop();
}

#[test]
fn calls_from_other_threads_and_subscriptions_share_one_connection() {
    let server = served();
    for url in push_urls(&server) {
        let c = Arc::new(Client::connect(&url).unwrap());
        let followers: Vec<JoinHandle<()>> = (0..2)
            .map(|_| {
                let c = Arc::clone(&c);
                std::thread::spawn(move || {
                    let mut ticks = c
                        .subscribe("subscribe_ticks", [1], "unsubscribe_ticks")
                        .unwrap();
                    for want in 0..400u64 {
                        assert_eq!(next(&mut ticks).parse::<u64>().unwrap(), want);
                    }
                })
            })
            .collect();
        let callers: Vec<JoinHandle<()>> = (0..3i64)
            .map(|t| {
                let c = Arc::clone(&c);
                std::thread::spawn(move || {
                    for i in 0..300i64 {
                        let sum: i64 = c.call("add", [t * 1000, i]).unwrap();
                        assert_eq!(sum, t * 1000 + i);
                    }
                })
            })
            .collect();
        for t in followers.into_iter().chain(callers) {
            t.join().unwrap();
        }
        assert_eq!(c.call::<String, _>("ping", ()).unwrap(), "pong", "{url}");
    }
    server.stop();
}

#[test]
fn a_subscription_whose_owner_does_not_take_its_notifications_stays_bounded_and_counts_its_losses()
{
    let server = served();
    let c = Arc::new(
        Client::connect_with(
            &format!("tcp://{}", server.tcp),
            Options::default().subscription_queue(8),
        )
        .unwrap(),
    );
    let mut ticks = c
        .subscribe("subscribe_ticks", [1], "unsubscribe_ticks")
        .unwrap();
    // Another caller reads the connection (its calls' answers come behind ticks) while
    // the subscription's owner takes nothing.
    let until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < until {
        assert_eq!(c.call::<String, _>("ping", ()).unwrap(), "pong");
    }
    let (mut last, mut lost, mut queued) = (None::<u64>, 0, 0);
    for _ in 0..100 {
        let n = next(&mut ticks);
        let v: u64 = n.parse().unwrap();
        if let Some(prev) = last {
            assert_eq!(
                v,
                prev + 1 + n.missed_before(),
                "every tick delivered or counted"
            );
        } else {
            assert_eq!(v, n.missed_before(), "the first tick is 0, or counted");
        }
        if n.missed_before() == 0 {
            queued += 1;
        }
        lost += n.missed_before();
        last = Some(v);
    }
    assert!(lost > 0, "300 ms of 1 ms ticks kept in a queue of 8");
    assert!(queued >= 8, "the 8 newest were kept");
    server.stop();
}

#[test]
fn a_subscription_the_server_closes_ends_after_its_last_notification() {
    let mut methods = demo::builder();
    methods
        .subscription(
            "three",
            "item",
            "unthree",
            |_: &Context<'_>, _: Params<'_>, sink: Sink| -> Result<(), RpcError> {
                std::thread::spawn(move || {
                    for n in 0..3 {
                        let _ = sink.send(&n);
                    }
                    sink.close();
                });
                Ok(())
            },
        )
        .unwrap();
    let server = Served::start(
        Engine::new(methods.freeze(), Config::default()),
        ServerConfig::default(),
    );
    for url in push_urls(&server) {
        let c = Client::connect(&url).unwrap();
        let mut items = c.subscribe("three", (), "unthree").unwrap();
        let got: Vec<u64> = (0..3).map(|_| next(&mut items).parse().unwrap()).collect();
        assert_eq!(got, [0, 1, 2], "{url}");
        assert!(
            items.next_timeout(WAIT).is_none(),
            "{url}: closed, not ended"
        );
        assert!(items.next().is_none(), "{url}");
        drop(items);
        assert_eq!(c.call::<String, _>("ping", ()).unwrap(), "pong", "{url}");
    }
    server.stop();
}

#[test]
fn http_clients_cannot_subscribe() {
    let server = served();
    let c = Client::connect(&format!("http://{}/", server.http)).unwrap();
    let e = c
        .subscribe("subscribe_ticks", [1], "unsubscribe_ticks")
        .unwrap_err();
    assert!(matches!(e, Error::PushUnsupported), "{e:?}");
    server.stop();
}

fn note(sub: Value, member: &str, value: Value) -> Value {
    json!({"jsonrpc": "2.0", "method": "item", "params": {"subscription": sub, member: value}})
}

#[test]
fn notifications_lagged_counts_errors_closes_and_strays_from_a_scripted_server() {
    let (addr, t) = scripted(|_, mut r| {
        // 1: a string id (with an escape: ids are compared as values); a stray
        // notification of no subscription and one of an unknown id come in between.
        let req = read_request(&mut r).unwrap();
        assert_eq!(req["method"], "sub");
        answer(
            &mut r,
            &json!({"jsonrpc":"2.0","id":req["id"],"result":"0xab"}),
        );
        let escaped = br#"{"jsonrpc":"2.0","method":"item","params":{"subscription":"0x\u0061b","result":1}}"#;
        r.get_mut()
            .write_all(&[&escaped[..], b"\n"].concat())
            .unwrap();
        answer(
            &mut r,
            &json!({"jsonrpc":"2.0","method":"news","params":[1]}),
        );
        answer(&mut r, &note(json!("0xcd"), "result", json!(99)));
        answer(&mut r, &note(json!("0xab"), "lagged", json!(5)));
        answer(&mut r, &note(json!("0xab"), "result", json!(7)));
        answer(&mut r, &note(json!("0xab"), "closed", json!(true)));
        // 2: a number id, a raw object result, then an error ends it.
        let req = read_request(&mut r).unwrap();
        answer(&mut r, &json!({"jsonrpc":"2.0","id":req["id"],"result":42}));
        answer(&mut r, &note(json!(42), "result", json!({"a": [1, 2.5]})));
        let busy = json!({"code": -32000, "message": "busy", "data": {"reason": "lagged"}});
        answer(&mut r, &note(json!(42), "error", busy));
        // 3: dropped unread: its unsubscribe comes, with its id.
        let req = read_request(&mut r).unwrap();
        answer(&mut r, &json!({"jsonrpc":"2.0","id":req["id"],"result":9}));
        answer(&mut r, &note(json!(9), "result", json!("unread")));
        let unsub = read_request(&mut r).unwrap();
        assert_eq!(unsub["method"], "unsub");
        assert_eq!(unsub["params"], json!([9]));
        answer(
            &mut r,
            &json!({"jsonrpc":"2.0","id":unsub["id"],"result":true}),
        );
        // A call after it all.
        let req = read_request(&mut r).unwrap();
        answer(
            &mut r,
            &json!({"jsonrpc":"2.0","id":req["id"],"result":"done"}),
        );
        false
    });
    let c = Client::connect(&format!("tcp://{addr}")).unwrap();

    let mut one = c.subscribe("sub", (), "unsub").unwrap();
    assert_eq!(one.id(), r#""0xab""#);
    let a = next(&mut one);
    assert_eq!((a.parse::<i64>().unwrap(), a.missed_before()), (1, 0));
    let b = next(&mut one);
    assert_eq!((b.parse::<i64>().unwrap(), b.missed_before()), (7, 5));
    assert!(one.next_timeout(WAIT).is_none(), "closed by the server");
    drop(one);

    let mut two = c.subscribe("sub", (), "unsub").unwrap();
    assert_eq!(two.id(), "42");
    assert_eq!(next(&mut two).raw_json(), br#"{"a":[1,2.5]}"#);
    match two.next_timeout(WAIT) {
        Some(Err(Error::Server(e))) => {
            assert_eq!((e.code, e.reason()), (-32000, Some("lagged")), "{e:?}");
        }
        other => panic!("expected the server's error, got {other:?}"),
    }
    assert!(two.next_timeout(WAIT).is_none(), "the error ends it");
    drop(two);

    let three = c.subscribe("sub", (), "unsub").unwrap();
    drop(three);
    assert_eq!(c.call::<String, _>("last", ()).unwrap(), "done");
    t.join().unwrap();
}

#[test]
fn a_lost_connection_ends_the_subscription_with_its_error_and_the_next_call_reconnects() {
    let (addr, t) = scripted(|n, mut r| {
        let req = read_request(&mut r).unwrap();
        if n == 0 {
            answer(&mut r, &json!({"jsonrpc":"2.0","id":req["id"],"result":1}));
            answer(&mut r, &note(json!(1), "result", json!("x")));
            return true; // closes the connection
        }
        answer(
            &mut r,
            &json!({"jsonrpc":"2.0","id":req["id"],"result":"again"}),
        );
        false
    });
    let c = Client::connect(&format!("tcp://{addr}")).unwrap();
    let mut sub = c.subscribe("sub", (), "unsub").unwrap();
    assert_eq!(next(&mut sub).parse::<String>().unwrap(), "x");
    match sub.next_timeout(WAIT) {
        Some(Err(Error::Closed)) => {}
        other => panic!("expected Closed, got {other:?}"),
    }
    assert!(sub.next().is_none());
    drop(sub);
    assert_eq!(c.call::<String, _>("hello", ()).unwrap(), "again");
    t.join().unwrap();
}

/// A subscribe call that times out is not left open on the server: when its late
/// answer is read (here by the next call), the subscription it opened is unsubscribed,
/// and the server stops pushing to a client that would drop every notification.
#[test]
fn a_subscribe_call_that_times_out_is_unsubscribed_when_its_answer_comes() {
    let (addr, t) = scripted(|_, mut r| {
        r.get_ref()
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let sub = read_request(&mut r).unwrap();
        assert_eq!(sub["method"], "sub");
        // Past the client's timeout.
        std::thread::sleep(Duration::from_millis(1300));
        answer(
            &mut r,
            &json!({"jsonrpc":"2.0","id":sub["id"],"result":"0x5"}),
        );
        answer(&mut r, &note(json!("0x5"), "result", json!(1)));
        let later = read_request(&mut r).unwrap();
        assert_eq!(later["method"], "later");
        answer(
            &mut r,
            &json!({"jsonrpc":"2.0","id":later["id"],"result":"done"}),
        );
        let unsub = read_request(&mut r).expect("no unsubscribe came for the late subscription");
        assert_eq!(unsub["method"], "unsub");
        assert_eq!(unsub["params"], json!(["0x5"]));
        answer(
            &mut r,
            &json!({"jsonrpc":"2.0","id":unsub["id"],"result":true}),
        );
        // Its answer is taken as a late one, not a stranger's: the connection goes on.
        let last = read_request(&mut r).unwrap();
        answer(
            &mut r,
            &json!({"jsonrpc":"2.0","id":last["id"],"result":"still here"}),
        );
        false
    });
    let opts = Options::default().timeout(Duration::from_secs(1));
    let c = Client::connect_with(&format!("tcp://{addr}"), opts).unwrap();
    match c.subscribe("sub", (), "unsub") {
        Err(Error::ReadTimeout) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert_eq!(c.call::<String, _>("later", ()).unwrap(), "done");
    assert_eq!(c.call::<String, _>("last", ()).unwrap(), "still here");
    t.join().unwrap();
}

/// A late subscribe answer naming a subscription already open on the connection
/// (another caller's: the server gave the id twice) closes nothing: it is not this
/// call's to close.
#[test]
fn a_late_answer_naming_an_open_subscription_does_not_close_it() {
    let (addr, t) = scripted(|_, mut r| {
        r.get_ref()
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let first = read_request(&mut r).unwrap();
        answer(
            &mut r,
            &json!({"jsonrpc":"2.0","id":first["id"],"result":"0x5"}),
        );
        let second = read_request(&mut r).unwrap();
        std::thread::sleep(Duration::from_millis(1300));
        answer(
            &mut r,
            &json!({"jsonrpc":"2.0","id":second["id"],"result":"0x5"}),
        );
        let later = read_request(&mut r).unwrap();
        answer(
            &mut r,
            &json!({"jsonrpc":"2.0","id":later["id"],"result":"done"}),
        );
        let next = read_request(&mut r).unwrap();
        assert_eq!(
            next["method"], "last",
            "the open subscription was closed: {next}"
        );
        answer(
            &mut r,
            &json!({"jsonrpc":"2.0","id":next["id"],"result":"ok"}),
        );
        answer(&mut r, &note(json!("0x5"), "result", json!(42)));
        false
    });
    let opts = Options::default().timeout(Duration::from_secs(1));
    let c = Client::connect_with(&format!("tcp://{addr}"), opts).unwrap();
    let mut open = c.subscribe("sub", (), "unsub").unwrap();
    match c.subscribe("sub", (), "unsub") {
        Err(Error::ReadTimeout) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert_eq!(c.call::<String, _>("later", ()).unwrap(), "done");
    assert_eq!(c.call::<String, _>("last", ()).unwrap(), "ok");
    assert_eq!(next(&mut open).parse::<i64>().unwrap(), 42);
    drop(open);
    t.join().unwrap();
}

/// A late subscribe answer routed while another caller holds the writer (blocked
/// writing to a server that no longer reads), whose write then times out and fails the
/// connection: the unsubscribe queued for it is dropped with the connection. (It once
/// had every writer guard's drop try to write it again, for ever: a stack overflow.)
#[test]
fn an_orphans_unsubscribe_queued_on_a_connection_that_then_fails_is_dropped() {
    let (addr, t) = scripted(|_, mut r| {
        let sub = read_request(&mut r).unwrap();
        assert_eq!(sub["method"], "sub");
        let b = read_request(&mut r).unwrap();
        assert_eq!(b["method"], "b");
        // While the client's other caller is blocked writing a call too large for the
        // socket's buffers, which is never read.
        std::thread::sleep(Duration::from_millis(1000));
        answer(
            &mut r,
            &json!({"jsonrpc":"2.0","id":sub["id"],"result":"0x5"}),
        );
        std::thread::sleep(Duration::from_millis(2000));
        false
    });
    let opts = Options::default().timeout(Duration::from_secs(2));
    let c = Client::connect_with(&format!("tcp://{addr}"), opts).unwrap();
    match c.subscribe("sub", (), "unsub") {
        Err(Error::ReadTimeout) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
    std::thread::scope(|s| {
        let b = s.spawn(|| c.call::<String, _>("b", ()));
        std::thread::sleep(Duration::from_millis(100));
        let big = c.call::<String, _>("big", ("x".repeat(16 << 20),));
        assert!(big.is_err(), "{big:?}");
        assert!(b.join().unwrap().is_err());
    });
    t.join().unwrap();
}

/// The same against the ringrpc server on every push transport (WebSocket writes the
/// unsubscribe as a masked message of its own): a subscription method slower to answer
/// than the client waits ends `Unsubscribed` once its answer is read, while the client
/// stays connected.
#[test]
fn a_late_subscription_is_unsubscribed_on_every_push_transport() {
    let (tx, ended) = std::sync::mpsc::channel();
    let mut methods = ringrpc::Registry::builder();
    methods
        .subscription(
            "slow_watch",
            "seen",
            "slow_unwatch",
            move |_ctx: &Context<'_>, _p: Params<'_>, sink: Sink| -> Result<(), RpcError> {
                // Longer than the client's timeout (it blocks this reactor meanwhile).
                std::thread::sleep(Duration::from_millis(700));
                let tx = tx.clone();
                std::thread::spawn(move || loop {
                    if let Err(why) = sink.send("x") {
                        let _ = tx.send(why);
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                });
                Ok(())
            },
        )
        .unwrap();
    methods.method("ping", |_: Params<'_>| Ok("pong")).unwrap();
    let server = Served::start(
        Engine::new(methods.freeze(), Config::default()),
        ServerConfig::default(),
    );
    for url in push_urls(&server) {
        let opts = Options::default().timeout(Duration::from_millis(500));
        let c = Client::connect_with(&url, opts).unwrap();
        match c.subscribe("slow_watch", (), "slow_unwatch") {
            Err(Error::ReadTimeout) => {}
            other => panic!("{url}: expected a timeout, got {other:?}"),
        }
        // The answer is in by now; the next call reads it.
        std::thread::sleep(Duration::from_millis(700));
        assert_eq!(c.call::<String, _>("ping", ()).unwrap(), "pong", "{url}");
        assert_eq!(
            ended.recv_timeout(WAIT),
            Ok(ringrpc::SinkClosed::Unsubscribed),
            "{url}: the late subscription was not unsubscribed"
        );
        // Its unsubscribe's answer, when read, is nobody's error.
        assert_eq!(c.call::<String, _>("ping", ()).unwrap(), "pong", "{url}");
    }
    server.stop();
}

#[test]
fn a_subscription_waiting_with_a_timeout_times_out_and_goes_on() {
    let server = served();
    let c = Client::connect(&format!("tcp://{}", server.tcp)).unwrap();
    // One tick a second: the first wait of 50 ms ends with nothing.
    let mut slow = c
        .subscribe("subscribe_ticks", [1000], "unsubscribe_ticks")
        .unwrap();
    assert!(matches!(
        slow.next_timeout(Duration::from_millis(50)),
        Some(Err(Error::ReadTimeout))
    ));
    assert_eq!(next(&mut slow).parse::<u64>().unwrap(), 0);
    assert!(slow.unsubscribe().unwrap());
    server.stop();
}

/// A client that only reads notifications still answers the server's pings (it would
/// be closed as a vanished peer otherwise): ticks every 1.5 s, pinged after 1 s of
/// silence, over 6 s.
#[test]
fn a_websocket_client_that_only_reads_notifications_answers_pings() {
    let settings = ServerConfig::default().subscriber_ping_interval(Some(Duration::from_secs(1)));
    let server = Served::start(demo::engine(Config::default()), settings);
    let c = Client::connect(&format!("ws://{}/", server.http)).unwrap();
    let mut ticks = c
        .subscribe("subscribe_ticks", [1500], "unsubscribe_ticks")
        .unwrap();
    for want in 0..4u64 {
        assert_eq!(next(&mut ticks).parse::<u64>().unwrap(), want);
    }
    assert!(ticks.unsubscribe().unwrap());
    server.stop();
}
