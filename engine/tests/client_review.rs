//! Regression tests from the review of the client: hand-offs between leader and
//! followers, a panic while leading, unbounded chunked framing, connection resets.

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ringrpc::client::{Client, Error, Options, Violation};
use serde_json::{json, Value};

#[path = "util/peer.rs"]
mod peer;
use peer::{answer, read_http, read_request};

/// A TCP server running `script` on its first accepted connection.
fn scripted(
    script: impl FnOnce(BufReader<TcpStream>) + Send + 'static,
) -> (SocketAddr, JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        script(BufReader::new(s));
    });
    (addr, t)
}

/// A call started (registered) but not yet waited for must not swallow the hand-off
/// of the reading: the follower that is actually waiting has to be promoted.
#[test]
fn a_started_call_not_yet_waited_for_does_not_swallow_the_hand_off() {
    let (read_b, b_read) = std::sync::mpsc::channel();
    let (addr, t) = scripted(move |mut r| {
        let a = read_request(&mut r).unwrap();
        let b = read_request(&mut r).unwrap();
        read_b.send(()).unwrap();
        let c = read_request(&mut r).unwrap();
        assert_eq!(
            (a["method"].as_str(), b["method"].as_str()),
            (Some("a"), Some("b"))
        );
        // Let C park as a follower, then answer the leader B, then C.
        std::thread::sleep(Duration::from_millis(100));
        answer(&mut r, &json!({"jsonrpc":"2.0","id":b["id"],"result":"b"}));
        std::thread::sleep(Duration::from_millis(200));
        answer(&mut r, &json!({"jsonrpc":"2.0","id":c["id"],"result":"c"}));
        while read_request(&mut r).is_some() {}
    });
    let opts = Options::default().timeout(Duration::from_secs(3));
    let c = Arc::new(Client::connect_with(&format!("tcp://{addr}"), opts).unwrap());
    // Registered first (slot 0), never waited for during the test.
    let pending = c.start("a", ()).unwrap();
    let leader = {
        let c = Arc::clone(&c);
        std::thread::spawn(move || c.call::<String, _>("b", ()))
    };
    // B written first (read by the server), and waiting for its answer.
    b_read.recv_timeout(Duration::from_secs(10)).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let follower = {
        let c = Arc::clone(&c);
        std::thread::spawn(move || {
            let start = Instant::now();
            (c.call::<String, _>("c", ()), start.elapsed())
        })
    };
    assert_eq!(leader.join().unwrap().unwrap(), "b");
    let (r, took) = follower.join().unwrap();
    assert_eq!(r.unwrap(), "c");
    assert!(
        took < Duration::from_secs(2),
        "the follower waited {took:?}"
    );
    drop(pending);
    drop(c);
    t.join().unwrap();
}

/// A panic in the caller's own code while it is the leader (its result closure, a
/// `Deserialize` impl) must not leave the connection without a reader forever.
#[test]
fn a_panic_while_leading_does_not_wedge_the_connection() {
    let (addr, t) = scripted(|mut r| {
        while let Some(req) = read_request(&mut r) {
            answer(&mut r, &json!({"jsonrpc":"2.0","id":req["id"],"result":7}));
        }
    });
    let opts = Options::default().timeout(Duration::from_millis(500));
    let c = Client::connect_with(&format!("tcp://{addr}"), opts).unwrap();
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        c.call_with("m", (), |_| -> Result<(), Error> {
            panic!("in the caller's closure")
        })
    }));
    std::panic::set_hook(hook);
    assert!(panicked.is_err());
    assert_eq!(c.call::<i64, _>("m", ()).unwrap(), 7);
    drop(c);
    t.join().unwrap();
}

/// A chunked body whose framing never ends (an endless chunk extension, or endless
/// trailers) is refused once it passes the response limit, not buffered until the
/// deadline.
#[test]
fn endless_chunked_framing_is_refused_at_the_size_limit() {
    for tail in [&b"1;"[..], b"0\r\n"] {
        let (addr, t) = scripted(move |mut r| {
            read_http(&mut r).unwrap();
            let s = r.get_mut();
            s.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                .unwrap();
            s.write_all(tail).unwrap();
            let filler: &[u8] = if tail == b"1;" {
                &[b'a'; 4096]
            } else {
                b"a: b\r\n"
            };
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(5) {
                if s.write_all(filler).is_err() {
                    break;
                }
            }
        });
        let opts = Options::default()
            .timeout(Duration::from_secs(3))
            .max_response_bytes(64 * 1024);
        let c = Client::connect_with(&format!("http://{addr}/"), opts).unwrap();
        let start = Instant::now();
        let r = c.call::<Value, _>("m", ());
        let took = start.elapsed();
        assert!(
            matches!(
                r,
                Err(Error::Protocol(Violation::TooLarge | Violation::BadHttp(_)))
            ),
            "{r:?}"
        );
        assert!(took < Duration::from_secs(2), "{took:?}");
        drop(c);
        t.join().unwrap();
    }
}

/// A connection reset by the server is a closed connection, as when the write side
/// sees it.
#[test]
fn a_connection_reset_mid_call_is_closed() {
    let (addr, t) = scripted(|mut r| {
        read_request(&mut r).unwrap();
        let s = r.into_inner();
        socket2::SockRef::from(&s)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(s); // RST
    });
    let c = Client::connect(&format!("tcp://{addr}")).unwrap();
    let r = c.call::<Value, _>("m", ());
    assert!(matches!(r, Err(Error::Closed)), "{r:?}");
    t.join().unwrap();
}

/// The call's timeout bounds the whole write of its request, not each write(2): a
/// server that keeps reading, slowly, must not hold the caller past it.
#[test]
fn a_slowly_reading_server_gives_a_write_timeout_at_the_deadline() {
    let (addr, t) = scripted(|mut r| {
        let mut chunk = vec![0u8; 64 * 1024];
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            match r.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    });
    let opts = Options::default().timeout(Duration::from_millis(300));
    let c = Client::connect_with(&format!("tcp://{addr}"), opts).unwrap();
    let big = "x".repeat(32 << 20);
    // Writing the params into the request buffer is not the write being timed.
    let encoding = {
        let start = Instant::now();
        serde_json::to_vec(&[&big]).unwrap();
        start.elapsed()
    };
    let start = Instant::now();
    let r = c.call::<Value, _>("m", [&big]);
    let took = start.elapsed().saturating_sub(encoding);
    assert!(
        matches!(r, Err(Error::WriteTimeout)),
        "{r:?} after {took:?}"
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
    drop(c);
    t.join().unwrap();
}

/// A TCP server running each script on one accepted connection, in turn.
fn scripted_each(
    scripts: Vec<Box<dyn FnOnce(BufReader<TcpStream>) + Send>>,
) -> (SocketAddr, JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        for script in scripts {
            let (s, _) = l.accept().unwrap();
            script(BufReader::new(s));
        }
    });
    (addr, t)
}

/// Answers every request with its id as the result, until the client closes.
fn echo_ids(mut r: BufReader<TcpStream>) {
    while let Some(req) = read_request(&mut r) {
        answer(
            &mut r,
            &json!({"jsonrpc":"2.0","id":req["id"],"result":req["id"]}),
        );
    }
}

/// A server may close a keep-alive connection once it has been idle: the next call,
/// even one that is not idempotent, goes out on a new connection instead of failing
/// with `Closed` (nothing was sent to a live server).
#[test]
fn an_idle_connection_closed_by_the_server_is_replaced_before_writing() {
    let (addr, t) = scripted_each(vec![
        Box::new(|mut r| {
            let req = read_request(&mut r).unwrap();
            answer(&mut r, &json!({"jsonrpc":"2.0","id":req["id"],"result":1}));
            // Idle: closed (FIN).
        }),
        Box::new(echo_ids),
    ]);
    let c = Client::connect(&format!("tcp://{addr}")).unwrap();
    assert_eq!(c.call::<i64, _>("m", ()).unwrap(), 1);
    std::thread::sleep(Duration::from_millis(300));
    let r = c.call::<u64, _>("m", ());
    // Answered by `echo_ids` on the second connection (ids start at random above 2³²).
    assert!(matches!(r, Ok(id) if id >= 1 << 32), "{r:?}");
    drop(c);
    t.join().unwrap();
}

/// A write that fails with a reset before the kernel took any of the request cannot
/// have reached the server: the request is sent again on a new connection.
#[test]
fn a_request_refused_whole_by_a_reset_connection_is_sent_on_a_new_one() {
    let (reset_tx, reset) = std::sync::mpsc::channel();
    let (addr, t) = scripted_each(vec![
        Box::new(move |mut r| {
            let req = read_request(&mut r).unwrap();
            answer(&mut r, &json!({"jsonrpc":"2.0","id":req["id"],"result":1}));
            let s = r.into_inner();
            socket2::SockRef::from(&s)
                .set_linger(Some(Duration::ZERO))
                .unwrap();
            drop(s); // RST
            reset_tx.send(()).unwrap();
        }),
        Box::new(echo_ids),
    ]);
    let c = Client::connect(&format!("tcp://{addr}")).unwrap();
    assert_eq!(c.call::<i64, _>("m", ()).unwrap(), 1);
    // Reset (not slept for: a preempted script resets late), and long enough for the
    // reset to arrive, too short for the idle check (if this thread is late, the idle
    // check reconnects first: the call goes on a new connection too).
    reset.recv_timeout(Duration::from_secs(10)).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let r = c.call::<u64, _>("m", ());
    // Answered by `echo_ids` on the second connection (ids start at random above 2³²).
    assert!(matches!(r, Ok(id) if id >= 1 << 32), "{r:?}");
    drop(c);
    t.join().unwrap();
}

/// A TCP server that accepts every connection and never reads, for `hold`.
fn stalling_server(hold: Duration) -> (SocketAddr, JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let start = Instant::now();
        let mut held = Vec::new();
        while start.elapsed() < hold {
            match l.accept() {
                Ok((s, _)) => held.push(s),
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    });
    (addr, t)
}

/// One deadline bounds every phase of a call: a caller that first waits for another
/// caller's (stalled) write, then finds the connection dropped and reconnects, and
/// then writes, still returns at its own deadline, not at the other's deadline plus a
/// whole timeout of its own. (In a debug build, encoding 32 MiB of params takes
/// longer than the timeout: then it is the wait for the writer that is cut short.)
#[test]
fn waiting_for_the_writer_and_reconnecting_count_against_the_call_deadline() {
    let (addr, t) = stalling_server(Duration::from_secs(5));
    let timeout = Duration::from_secs(1);
    let opts = Options::default().timeout(timeout);
    let c = Arc::new(Client::connect_with(&format!("tcp://{addr}"), opts).unwrap());
    // 8 MiB: larger than what the kernel buffers for a peer that never reads (our send buffer,
    // at most tcp_wmem's 4 MiB, plus its receive buffer, which is autotuned only as the
    // peer reads), so the write stalls. Already JSON, so that writing it into the request
    // is a copy: encoding 8 MiB of string in a debug build on a busy machine took long
    // enough to count against the deadline measured below.
    let big: Arc<Box<serde_json::value::RawValue>> = Arc::new(
        serde_json::value::RawValue::from_string(format!("[\"{}\"]", "x".repeat(8 << 20))).unwrap(),
    );
    let first = {
        let (c, big) = (Arc::clone(&c), Arc::clone(&big));
        std::thread::spawn(move || c.call::<Value, _>("m", &*big))
    };
    std::thread::sleep(Duration::from_millis(100));
    let start = Instant::now();
    let r = c.call::<Value, _>("m", &*big);
    let took = start.elapsed();
    assert!(
        matches!(
            r,
            Err(Error::WriteTimeout | Error::ReadTimeout | Error::ConnectTimeout)
        ),
        "{r:?} after {took:?}"
    );
    assert!(took < timeout * 3 / 2, "{took:?}");
    let r = first.join().unwrap();
    assert!(matches!(r, Err(Error::WriteTimeout)), "{r:?}");
    drop(c);
    t.join().unwrap();
}

/// A reconnect is bounded by the call's deadline too, and so is waiting for another
/// caller's reconnect: a server whose accept queue is full (SYNs dropped) does not hold
/// calls for the connect timeout.
#[test]
fn reconnecting_counts_against_the_call_deadline() {
    // Backlog 0: once one connection waits to be accepted, further SYNs are dropped.
    let l = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    l.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
        .unwrap();
    l.listen(0).unwrap();
    let l: TcpListener = l.into();
    let addr = l.local_addr().unwrap();
    let timeout = Duration::from_millis(500);
    let opts = Options::default()
        .timeout(timeout)
        .connect_timeout(Duration::from_secs(5));
    let c = Arc::new(Client::connect_with(&format!("tcp://{addr}"), opts).unwrap());
    let (first, _) = l.accept().unwrap();
    // Fills the accept queue.
    let _queued = TcpStream::connect(addr).unwrap();
    drop(first);
    std::thread::sleep(Duration::from_millis(200));
    let other = {
        let c = Arc::clone(&c);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            let start = Instant::now();
            (c.call::<Value, _>("m", ()), start.elapsed())
        })
    };
    let start = Instant::now();
    let r = c.call::<Value, _>("m", ());
    let took = start.elapsed();
    assert!(
        matches!(r, Err(Error::ConnectTimeout)),
        "{r:?} after {took:?}"
    );
    // Within twice the deadline (a loaded machine's slack), far from the connect
    // timeout's 5 s.
    assert!(took < timeout * 2, "{took:?}");
    let (r, took) = other.join().unwrap();
    assert!(
        matches!(r, Err(Error::ConnectTimeout)),
        "{r:?} after {took:?}"
    );
    assert!(took < timeout * 2, "{took:?}");
}

/// A large chunked response in many small chunks and many writes is decoded as it
/// arrives, correctly. (On loopback the reads grow as decoding falls behind, so the old
/// decode-from-scratch cost stayed within 2×; the unit tests in `client/http.rs`
/// check that progress is kept across reads.)
#[test]
fn a_large_chunked_response_in_many_small_chunks_decodes() {
    const LEN: usize = 16 << 20;
    let (addr, t) = scripted(|mut r| {
        let req = read_http(&mut r).unwrap();
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{},"result":"{}"}}"#,
            req["id"],
            "x".repeat(LEN)
        );
        let s = r.get_mut();
        s.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            .unwrap();
        for chunk in body.as_bytes().chunks(4096) {
            let mut wire = format!("{:x}\r\n", chunk.len()).into_bytes();
            wire.extend_from_slice(chunk);
            wire.extend_from_slice(b"\r\n");
            if s.write_all(&wire).is_err() {
                return;
            }
        }
        let _ = s.write_all(b"0\r\n\r\n");
        read_http(&mut r);
    });
    let opts = Options::default()
        .timeout(Duration::from_secs(20))
        .max_response_bytes(32 << 20);
    let c = Client::connect_with(&format!("http://{addr}/"), opts).unwrap();
    let start = Instant::now();
    let r = c.call::<String, _>("m", ());
    let took = start.elapsed();
    match r {
        Ok(s) => assert!(s.len() == LEN && s.bytes().all(|b| b == b'x')),
        Err(e) => panic!("{e:?} after {took:?}"),
    }
    assert!(took < Duration::from_secs(10), "{took:?}");
    drop(c);
    t.join().unwrap();
}

/// A panic in the caller's own code while it parses a response the leader handed to
/// it must still free its slot: a slot lost for good would leave a call in flight for
/// ever (so, among other things, the idle connection would never be checked again).
#[test]
fn a_panic_while_parsing_a_handed_response_frees_the_slot() {
    let (read_a, a_read) = std::sync::mpsc::channel();
    let (addr, t) = scripted_each(vec![
        Box::new(move |mut r| {
            let a = read_request(&mut r).unwrap();
            read_a.send(()).unwrap();
            let b = read_request(&mut r).unwrap();
            // Let B park as a follower; its answer goes through the leader A.
            std::thread::sleep(Duration::from_millis(100));
            answer(&mut r, &json!({"jsonrpc":"2.0","id":b["id"],"result":"b"}));
            std::thread::sleep(Duration::from_millis(100));
            answer(&mut r, &json!({"jsonrpc":"2.0","id":a["id"],"result":"a"}));
            // Then idle: closed.
        }),
        Box::new(echo_ids),
    ]);
    let c = Arc::new(Client::connect(&format!("tcp://{addr}")).unwrap());
    let leader = {
        let c = Arc::clone(&c);
        std::thread::spawn(move || c.call::<String, _>("a", ()))
    };
    // A written first (read by the server), and waiting for its answer.
    a_read.recv_timeout(Duration::from_secs(10)).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let follower = {
        let c = Arc::clone(&c);
        std::thread::spawn(move || {
            c.call_with("b", (), |_| -> Result<(), Error> {
                panic!("in the follower's closure")
            })
        })
    };
    assert_eq!(leader.join().unwrap().unwrap(), "a");
    assert!(follower.join().is_err());
    std::thread::sleep(Duration::from_millis(300));
    let r = c.call::<Value, _>("c", ());
    assert!(matches!(r, Ok(Value::Number(_))), "{r:?}");
    drop(c);
    t.join().unwrap();
}
