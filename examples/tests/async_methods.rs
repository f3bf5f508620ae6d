//! The `async_methods` example end to end: calls answered from its tokio runtime
//! (timers, an upstream JSON-RPC server over HTTP), through a real socket.

mod common;

use std::time::{Duration, Instant};

use common::Server;
use ringrpc::client::{Client, Error, Options};
use serde_json::{json, Value};

/// Starts the example with `args`; it and a client of its HTTP address.
fn start(args: &[&str]) -> (Server, Client) {
    let mut all = vec!["--http", "127.0.0.1:0"];
    all.extend_from_slice(args);
    let (server, mut lines) = Server::example("async_methods", &all);
    let first = lines
        .next()
        .expect("the example exited before saying where it listens")
        .expect("its stdout");
    let addr = first
        .strip_prefix("listening http ")
        .unwrap_or_else(|| panic!("{first}"));
    let client = Client::connect_with(
        &format!("http://{addr}/"),
        Options::default().timeout(Duration::from_secs(20)),
    )
    .expect("connect");
    (server, client)
}

#[test]
fn calls_answered_from_tokio() {
    let (_server, c) = start(&[]);
    // A timer: 200 waits of 200 ms at once, on a server with one worker thread and a
    // runtime of two, answered together (one after another they would take 40 s).
    let started = Instant::now();
    let pending: Vec<_> = (0..200).map(|_| c.start("wait", [200]).unwrap()).collect();
    for p in pending {
        assert_eq!(p.wait::<u64>().unwrap(), 200);
    }
    let took = started.elapsed();
    eprintln!("200 x wait [200] answered in {took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    // An upstream call from the runtime.
    assert_eq!(c.call::<i64, _>("upstream_subtract", [42, 23]).unwrap(), 19);
    // Forwarded as it came, answered as the upstream answered.
    assert_eq!(c.call::<i64, _>("sum", [1, 2, 4]).unwrap(), 7);
    let echoed: Value = c.call("echo", json!({"a": [1, 2.5]})).unwrap();
    assert_eq!(echoed, json!({"a": [1, 2.5]}));
    match c.call::<Value, _>("foobar", ()) {
        Err(Error::Server(e)) => {
            assert_eq!(e.code, -32601);
            assert_eq!(e.message, "Method not found: foobar");
        }
        other => panic!("{other:?}"),
    }
    // Bad params, answered by the handler itself.
    match c.call::<Value, _>("wait", [60_001]) {
        Err(Error::Server(e)) => assert_eq!(e.code, -32602),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_unreachable_upstream_is_an_internal_error_saying_so() {
    // Port 1 on loopback: nothing listens there, so the connection is refused at once.
    let (_server, c) = start(&["--upstream", "http://127.0.0.1:1/"]);
    match c.call::<Value, _>("upstream_subtract", [1, 2]) {
        Err(Error::Server(e)) => {
            assert_eq!(e.code, -32603);
            assert!(e.message.contains("upstream call failed"), "{}", e.message);
        }
        other => panic!("{other:?}"),
    }
    // The server stays up.
    assert_eq!(c.call::<u64, _>("wait", [1]).unwrap(), 1);
}
