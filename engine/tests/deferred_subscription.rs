//! Deferred subscriptions (`RegistryBuilder::deferred_subscription`) over real sockets:
//! the subscribe call answered from another thread, accepted (the id, then the
//! notifications) or rejected (the error object's bytes exactly, nothing opened);
//! dropped unanswered (-32603); accepted after its deadline (-32001, nothing opened);
//! `Sink::on_close` told of an unsubscribe and of a closed connection; the final forms a
//! relaying server writes (`close_with_error`, `close_with_raw_error`, `missed`).
//!
//! Every socket has a read timeout, so a hang fails the test instead of stalling it.

mod util;

use std::io::Write;
use std::net::TcpStream;
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use ringrpc::{
    Config, Context, Engine, Params, Registry, RpcError, ServerConfig, Sink, SinkClosed,
    Subscribing, SubscriptionConfig,
};
use serde_json::{json, Value};
use util::server::Served;

/// A newline-delimited connection (`util::line`).
type Lines = util::line::Line<TcpStream>;

/// A server whose `sub` subscription hands every `Subscribing` (with its params) to
/// the test, which answers it from its own thread.
fn served(config: Config) -> (Served, mpsc::Receiver<(Value, Subscribing)>) {
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let mut methods = Registry::builder();
    methods
        .deferred_subscription(
            "sub",
            "note",
            "unsub",
            SubscriptionConfig::default(),
            move |_ctx: &Context<'_>, p: Params<'_>, s: Subscribing| {
                let params: Value = p.parse().unwrap_or(Value::Null);
                let _ = tx.lock().unwrap().send((params, s));
            },
        )
        .unwrap()
        .method("ping", |_p: Params<'_>| Ok("pong"))
        .unwrap();
    let engine = Engine::new(methods.freeze(), config);
    (Served::start(engine, ServerConfig::default()), rx)
}

fn wait<T>(rx: &mpsc::Receiver<T>) -> T {
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the handler was not called")
}

#[test]
fn accepted_from_another_thread_the_id_comes_before_every_notification() {
    let (server, rx) = served(Config::default());
    let mut c = Lines::tcp(server.tcp);
    // A later call on the same connection waits behind the subscribe's answer.
    c.send(r#"{"jsonrpc":"2.0","method":"sub","params":["a"],"id":1}"#);
    c.send(r#"{"jsonrpc":"2.0","method":"ping","id":2}"#);
    let (params, s) = wait(&rx);
    assert_eq!(params, json!(["a"]));
    let id = s.id();
    // Accepted and pushing at once, from another thread.
    let t = std::thread::spawn(move || {
        let sink = s.accept().expect("open");
        for n in 0..200u64 {
            sink.send(&n).unwrap();
        }
        sink
    });
    let first = c.next();
    assert_eq!(first, json!({"jsonrpc":"2.0","id":1,"result":id}));
    let second = c.next();
    assert_eq!(second["id"], 2, "answers in request order: {second}");
    for n in 0..200u64 {
        let v = c.next();
        assert_eq!(
            v,
            json!({"jsonrpc":"2.0","method":"note","params":{"subscription":id,"result":n}})
        );
    }
    let sink = t.join().unwrap();
    // The unsubscribe ends it; the sink is told.
    let (told, heard) = mpsc::channel();
    sink.on_close(move |why| {
        let _ = told.send(why);
    });
    c.send(&format!(
        r#"{{"jsonrpc":"2.0","method":"unsub","params":[{id}],"id":3}}"#
    ));
    assert_eq!(c.next(), json!({"jsonrpc":"2.0","id":3,"result":true}));
    assert_eq!(wait(&heard), SinkClosed::Unsubscribed);
    assert_eq!(sink.send(&1), Err(SinkClosed::Unsubscribed));
}

#[test]
fn a_rejected_subscribe_answers_the_error_as_given_and_opens_nothing() {
    let (server, rx) = served(Config::default());
    let mut c = Lines::tcp(server.tcp);
    c.send(r#"{"jsonrpc":"2.0","method":"sub","params":["x"],"id":"r"}"#);
    let (_, s) = wait(&rx);
    let id = s.id();
    let object = br#"{"code":-32602,"message":"no such feed","data":{"feed":"x", "why":[1, 2]}}"#;
    s.relay_error(-32602, object);
    assert_eq!(
        c.line(),
        format!(
            r#"{{"jsonrpc":"2.0","id":"r","error":{}}}"#,
            String::from_utf8_lossy(object)
        )
    );
    // Nothing of that id is open.
    c.send(&format!(
        r#"{{"jsonrpc":"2.0","method":"unsub","params":[{id}],"id":2}}"#
    ));
    assert_eq!(c.next(), json!({"jsonrpc":"2.0","id":2,"result":false}));
    // A rejection with the engine's own error.
    c.send(r#"{"jsonrpc":"2.0","method":"sub","id":3}"#);
    let (_, s) = wait(&rx);
    s.reject(RpcError::invalid_params("no such feed"));
    let v = c.next();
    assert_eq!(v["id"], 3);
    assert_eq!(v["error"]["code"], -32602, "{v}");
    // Dropped unanswered: -32603.
    c.send(r#"{"jsonrpc":"2.0","method":"sub","id":4}"#);
    let (_, s) = wait(&rx);
    drop(s);
    let v = c.next();
    assert_eq!(v["id"], 4);
    assert_eq!(v["error"]["code"], -32603, "{v}");
}

#[test]
fn accepted_after_its_deadline_it_answers_minus_32001_and_opens_nothing() {
    let timeout = Duration::from_millis(100);
    let (server, rx) = served(Config::default().request_timeout(Some(timeout)));
    let mut c = Lines::tcp(server.tcp);
    c.send(r#"{"jsonrpc":"2.0","method":"sub","id":1}"#);
    let (_, s) = wait(&rx);
    let deadline = s.deadline().expect("request_timeout gives a deadline");
    // The server itself does not answer it meanwhile: the handler decides.
    while std::time::Instant::now() < deadline {
        std::thread::sleep(deadline - std::time::Instant::now());
    }
    assert_eq!(s.accept().err(), Some(SinkClosed::TimedOut));
    let v = c.next();
    assert_eq!(v["id"], 1);
    assert_eq!(v["error"]["code"], -32001, "{v}");
    // The connection goes on.
    c.send(r#"{"jsonrpc":"2.0","method":"ping","id":2}"#);
    assert_eq!(c.next()["result"], "pong");
}

#[test]
fn a_closed_connection_ends_its_sinks_and_their_on_close_runs() {
    let (server, rx) = served(Config::default());
    let mut c = Lines::tcp(server.tcp);
    c.send(r#"{"jsonrpc":"2.0","method":"sub","id":1}"#);
    let (_, s) = wait(&rx);
    let sink = s.accept().unwrap();
    let (told, heard) = mpsc::channel();
    sink.on_close(move |why| {
        let _ = told.send(why);
    });
    assert_eq!(c.next()["result"], sink.id());
    drop(c);
    assert_eq!(wait(&heard), SinkClosed::ConnectionClosed);
    // Set after the end, it runs at once.
    let (told, heard) = mpsc::channel();
    sink.on_close(move |why| {
        let _ = told.send(why);
    });
    assert_eq!(heard.try_recv(), Ok(SinkClosed::ConnectionClosed));
    // A subscribe whose client went away before it was accepted: the connection is
    // kept until the call is answered, then closed, and the sink ends with it.
    let mut c = Lines::tcp(server.tcp);
    c.send(r#"{"jsonrpc":"2.0","method":"sub","id":1}"#);
    let (_, s) = wait(&rx);
    drop(c);
    match s.accept() {
        Ok(sink) => {
            let (told, heard) = mpsc::channel();
            sink.on_close(move |why| {
                let _ = told.send(why);
            });
            assert_eq!(wait(&heard), SinkClosed::ConnectionClosed);
        }
        Err(why) => assert_eq!(why, SinkClosed::ConnectionClosed),
    }
}

#[test]
fn the_final_forms_a_relaying_server_writes() {
    let (server, rx) = served(Config::default());
    let mut c = Lines::tcp(server.tcp);
    let open = |c: &mut Lines, id: u64| -> Sink {
        c.send(&format!(r#"{{"jsonrpc":"2.0","method":"sub","id":{id}}}"#));
        let (_, s) = wait(&rx);
        let sink = s.accept().unwrap();
        assert_eq!(c.next()["result"], sink.id());
        sink
    };
    // An upstream's lagged count.
    let a = open(&mut c, 1);
    a.missed(7).unwrap();
    assert_eq!(
        c.line(),
        format!(
            r#"{{"jsonrpc":"2.0","method":"note","params":{{"subscription":{},"lagged":7}}}}"#,
            a.id()
        )
    );
    a.send_raw(br#"{"k":[1, 2]}"#).unwrap();
    assert_eq!(
        c.line(),
        format!(
            r#"{{"jsonrpc":"2.0","method":"note","params":{{"subscription":{},"result":{{"k":[1, 2]}}}}}}"#,
            a.id()
        )
    );
    // In its place among the notifications queued.
    a.send(&1).unwrap();
    a.missed(3).unwrap();
    a.send(&2).unwrap();
    for tail in [r#""result":1"#, r#""lagged":3"#, r#""result":2"#] {
        assert_eq!(
            c.line(),
            format!(
                r#"{{"jsonrpc":"2.0","method":"note","params":{{"subscription":{},{tail}}}}}"#,
                a.id()
            )
        );
    }
    // An upstream's error object, as its bytes came; nothing follows.
    let (told, heard) = mpsc::channel();
    a.on_close(move |why| {
        let _ = told.send(why);
    });
    a.close_with_raw_error(br#"{"code":5,"message":"gone", "data":null}"#);
    assert_eq!(wait(&heard), SinkClosed::Closed);
    assert_eq!(a.send(&1), Err(SinkClosed::Closed));
    assert_eq!(
        c.line(),
        format!(
            r#"{{"jsonrpc":"2.0","method":"note","params":{{"subscription":{},"error":{{"code":5,"message":"gone", "data":null}}}}}}"#,
            a.id()
        )
    );
    // The proxy's own error.
    let b = open(&mut c, 2);
    b.send(&1).unwrap();
    b.close_with_error(&RpcError::relay(
        -32000,
        "Server busy: the upstream is gone",
        Some(r#"{"reason":"upstream_unavailable"}"#),
    ));
    let v = c.next();
    assert_eq!(v["params"]["result"], 1);
    let v = c.next();
    assert_eq!(v["params"]["subscription"], b.id());
    assert_eq!(v["params"]["error"]["code"], -32000);
    assert_eq!(
        v["params"]["error"]["data"]["reason"],
        "upstream_unavailable"
    );
    // Closed plainly.
    let d = open(&mut c, 3);
    d.close();
    assert_eq!(c.next()["params"]["closed"], true);
    c.send(r#"{"jsonrpc":"2.0","method":"ping","id":9}"#);
    assert_eq!(c.next()["id"], 9, "nothing else came");
}

#[test]
fn a_deferred_subscribe_sent_as_a_notification_opens_nothing() {
    let (server, rx) = served(Config::default());
    let mut c = Lines::tcp(server.tcp);
    c.send(r#"{"jsonrpc":"2.0","method":"sub","params":["n"]}"#);
    c.send(r#"{"jsonrpc":"2.0","method":"ping","id":1}"#);
    assert_eq!(c.next(), json!({"jsonrpc":"2.0","id":1,"result":"pong"}));
    assert!(rx.try_recv().is_err(), "the handler was not called");
}

#[test]
fn over_http_a_deferred_subscribe_is_push_unsupported() {
    let (server, _rx) = served(Config::default());
    let body = r#"{"jsonrpc":"2.0","method":"sub","id":1}"#;
    let mut s = TcpStream::connect(server.http).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut s, &mut text).unwrap();
    assert!(text.contains("push_unsupported"), "{text}");
}
