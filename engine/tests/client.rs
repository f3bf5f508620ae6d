//! The client against the ringrpc server over TCP, Unix sockets and HTTP, and against
//! small scripted servers that misbehave on purpose (reverse order, closing mid-call,
//! never answering, broken JSON, dropping the first connection of a retried call).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ringrpc::client::{Client, Error, Options, Retry, Violation};
use ringrpc::server::{Server, ServerHandle};
use ringrpc::{demo, Config};
use serde::Deserialize;
use serde_json::{json, Value};

#[path = "util/peer.rs"]
mod peer;
use peer::{answer, read_http, read_request, scripted};

/// The ringrpc demo server on all three transports.
struct Running {
    urls: [String; 4],
    handle: ServerHandle,
    thread: Option<JoinHandle<std::io::Result<()>>>,
}

impl Running {
    fn start() -> Self {
        let mut server = Server::new(demo::engine(Config::default())).unwrap();
        let tcp = server.listen_tcp("127.0.0.1:0").unwrap();
        let http = server.listen_http("127.0.0.1:0").unwrap();
        let unix: PathBuf = std::env::temp_dir().join(format!(
            "ringrpc-client-{}-{}.sock",
            std::process::id(),
            tcp.port()
        ));
        server.listen_unix(&unix).unwrap();
        let handle = server.handle();
        let thread = Some(std::thread::spawn(move || server.run()));
        Self {
            urls: [
                format!("tcp://{tcp}"),
                format!("unix://{}", unix.display()),
                format!("http://{http}/"),
                format!("ws://{http}/"),
            ],
            handle,
            thread,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.handle.shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn server_code(e: Error) -> i32 {
    match e {
        Error::Server(e) => e.code,
        other => panic!("expected a server error, got {other:?}"),
    }
}

#[derive(serde::Serialize)]
struct Named {
    subtrahend: i64,
    minuend: i64,
}

#[test]
fn section_7_examples_as_client_calls_on_every_transport() {
    let server = Running::start();
    for url in &server.urls {
        let c = Client::connect(url).unwrap();
        // rpc call with positional parameters
        assert_eq!(c.call::<i64, _>("subtract", [42, 23]).unwrap(), 19, "{url}");
        assert_eq!(c.call::<i64, _>("subtract", [23, 42]).unwrap(), -19);
        // rpc call with named parameters, either order
        let named = Named {
            subtrahend: 23,
            minuend: 42,
        };
        assert_eq!(c.call::<i64, _>("subtract", &named).unwrap(), 19);
        let named = json!({"minuend": 42, "subtrahend": 23});
        assert_eq!(c.call::<i64, _>("subtract", &named).unwrap(), 19);
        // notifications
        c.notify("update", [1, 2, 3, 4, 5]).unwrap();
        c.notify("foobar", ()).unwrap();
        // a non-existent method
        assert_eq!(
            server_code(c.call::<Value, _>("foobar", ()).unwrap_err()),
            -32601
        );
        // invalid params are the server's -32602, with its message
        match c.call::<i64, _>("subtract", json!(["a", 1])).unwrap_err() {
            Error::Server(e) => {
                assert_eq!(e.code, -32602);
                assert!(e.message.contains("invalid type"), "{}", e.message);
            }
            other => panic!("{other:?}"),
        }
        // the mixed batch (the invalid element cannot be written by a typed client)
        let mut b = c.batch();
        let sum = b.call("sum", [1, 2, 4]).unwrap();
        b.notify("notify_hello", [7]).unwrap();
        let sub = b.call("subtract", [42, 23]).unwrap();
        let missing = b.call("foo.get", json!({"name": "myself"})).unwrap();
        let data = b.call("get_data", ()).unwrap();
        let mut r = b.send().unwrap();
        assert_eq!(r.len(), 4);
        assert_eq!(r.get::<i64>(sum).unwrap(), 7);
        assert_eq!(r.get::<i64>(sub).unwrap(), 19);
        assert_eq!(server_code(r.get::<Value>(missing).unwrap_err()), -32601);
        assert_eq!(r.get::<Value>(data).unwrap(), json!(["hello", 5]));
        assert_eq!(
            r.get::<(String, u8)>(data).unwrap(),
            ("hello".to_owned(), 5)
        );
        // the all-notification batch: nothing comes back, and the connection stays usable
        let mut b = c.batch();
        b.notify("notify_sum", [1, 2, 4]).unwrap();
        b.notify("notify_hello", [7]).unwrap();
        assert!(b.send().unwrap().is_empty());
        assert_eq!(c.call::<String, _>("ping", ()).unwrap(), "pong");
        // borrowed results and raw JSON
        let n = c
            .call_with("echo", json!({"s": "a\"b", "n": [1.0, 2]}), |r| {
                #[derive(Deserialize)]
                struct Echo<'a> {
                    #[serde(borrow)]
                    s: std::borrow::Cow<'a, str>,
                }
                let e: Echo<'_> = r.parse()?;
                assert_eq!(e.s, "a\"b");
                Ok(r.raw_json().into_owned())
            })
            .unwrap();
        // On TCP and Unix sockets the client's budget rides in object params as their
        // first member (`Options::send_deadline`), and `echo` sends it back.
        let n = String::from_utf8(n).unwrap();
        let sent = match n.strip_prefix(r#"{"_meta":{"timeoutMs":"#) {
            Some(rest) if !url.starts_with("http") => {
                let (ms, rest) = rest.split_once("},").unwrap();
                assert!(ms.parse::<u64>().unwrap() <= 30_000, "{n}");
                format!("{{{rest}")
            }
            _ => n,
        };
        assert_eq!(sent, r#"{"n":[1.0,2],"s":"a\"b"}"#, "{url}");
        assert!(matches!(c.call::<i64, _>("add", 5), Err(Error::Encode(_))));
        assert!(matches!(
            c.call::<String, _>("add", [1, 2]),
            Err(Error::Decode(_))
        ));
    }
}

#[test]
fn many_threads_pipeline_on_one_connection() {
    let server = Running::start();
    for url in &server.urls {
        let c = Arc::new(Client::connect(url).unwrap());
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let c = Arc::clone(&c);
                std::thread::spawn(move || {
                    for i in 0..300i64 {
                        assert_eq!(c.call::<i64, _>("add", [t, i]).unwrap(), t + i);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // One thread, 64 calls in flight, collected in reverse.
        let pending: Vec<_> = (0..64i64)
            .map(|i| (i, c.start("add", [i, i]).unwrap()))
            .collect();
        for (i, p) in pending.into_iter().rev() {
            assert_eq!(p.wait::<i64>().unwrap(), 2 * i, "{url}");
        }
        // A started call dropped unanswered does not disturb the next ones.
        drop(c.start("sleep", json!({"ms": 50})).unwrap());
        assert_eq!(c.call::<i64, _>("add", [1, 1]).unwrap(), 2);
    }
}

#[test]
fn answers_in_reverse_order_are_matched_by_id() {
    const N: usize = 16;
    let (addr, t) = scripted(|_, mut r| {
        let reqs: Vec<Value> = (0..N).map(|_| read_request(&mut r).unwrap()).collect();
        for req in reqs.iter().rev() {
            let p = &req["params"];
            let sum = p[0].as_i64().unwrap() + p[1].as_i64().unwrap();
            answer(
                &mut r,
                &json!({"jsonrpc":"2.0","id":req["id"],"result":sum}),
            );
        }
        // Then a batch, answered back to front.
        let batch = read_request(&mut r).unwrap();
        let replies: Vec<Value> = batch
            .as_array()
            .unwrap()
            .iter()
            .rev()
            .filter(|e| e.get("id").is_some())
            .map(|e| json!({"jsonrpc":"2.0","id":e["id"],"result":e["params"][0]}))
            .collect();
        answer(&mut r, &Value::Array(replies));
        false
    });
    let c = Arc::new(Client::connect(&format!("tcp://{addr}")).unwrap());
    let threads: Vec<_> = (0..N as i64)
        .map(|i| {
            let c = Arc::clone(&c);
            std::thread::spawn(move || c.call::<i64, _>("add", [i, 1000]).unwrap())
        })
        .collect();
    for (i, t) in threads.into_iter().enumerate() {
        assert_eq!(t.join().unwrap(), i as i64 + 1000);
    }
    let mut b = c.batch();
    let keys: Vec<_> = (0..5).map(|i| b.call("id", [i * 10]).unwrap()).collect();
    b.notify("note", [0]).unwrap();
    let mut r = b.send().unwrap();
    for (i, k) in keys.into_iter().enumerate() {
        assert_eq!(r.get::<i64>(k).unwrap(), i as i64 * 10);
    }
    t.join().unwrap();
}

#[test]
fn a_server_that_closes_mid_call_fails_the_call_and_the_next_call_reconnects() {
    let (addr, t) = scripted(|n, mut r| {
        let req = read_request(&mut r).unwrap();
        if n == 0 {
            return true; // drop the connection without answering
        }
        answer(
            &mut r,
            &json!({"jsonrpc":"2.0","id":req["id"],"result":"again"}),
        );
        false
    });
    let c = Client::connect(&format!("tcp://{addr}")).unwrap();
    assert!(matches!(c.call::<String, _>("x", ()), Err(Error::Closed)));
    assert_eq!(c.call::<String, _>("x", ()).unwrap(), "again");
    t.join().unwrap();
}

#[test]
fn a_server_that_never_answers_times_out() {
    let (addr, _t) = scripted(|_, mut r| {
        while read_request(&mut r).is_some() {}
        false
    });
    let opts = Options::default().timeout(Duration::from_millis(200));
    let c = Arc::new(Client::connect_with(&format!("tcp://{addr}"), opts).unwrap());
    let start = Instant::now();
    // A leader and a follower both time out on their own deadlines.
    let other = {
        let c = Arc::clone(&c);
        std::thread::spawn(move || c.call::<Value, _>("slow", ()))
    };
    assert!(matches!(
        c.call::<Value, _>("slow", ()),
        Err(Error::ReadTimeout)
    ));
    assert!(matches!(other.join().unwrap(), Err(Error::ReadTimeout)));
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_secs(2),
        "{took:?}"
    );
}

#[test]
fn idempotent_retries_resend_the_same_id_on_a_new_connection() {
    let ids = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&ids);
    let (addr, t) = scripted(move |n, mut r| {
        let req = read_request(&mut r).unwrap();
        seen.lock().unwrap().push(req["id"].clone());
        if n < 2 {
            return true; // the first two connections drop the call
        }
        answer(&mut r, &json!({"jsonrpc":"2.0","id":req["id"],"result":42}));
        false
    });
    let retry = Retry::default()
        .max_attempts(5)
        .initial_backoff(Duration::from_millis(5));
    let c =
        Client::connect_with(&format!("tcp://{addr}"), Options::default().retry(retry)).unwrap();
    assert_eq!(c.call_idempotent::<i64, _>("get", ()).unwrap(), 42);
    let ids = ids.lock().unwrap().clone();
    assert_eq!(ids.len(), 3);
    assert!(ids.iter().all(|id| id == &ids[0] && id.is_u64()), "{ids:?}");
    t.join().unwrap();
}

#[test]
fn non_idempotent_calls_are_not_retried_and_retries_stop_at_the_cap() {
    let count = Arc::new(Mutex::new(0));
    let seen = Arc::clone(&count);
    let (addr, _t) = scripted(move |_, mut r| {
        if read_request(&mut r).is_some() {
            *seen.lock().unwrap() += 1;
        }
        true // never answers: always drops
    });
    let retry = Retry::default()
        .max_attempts(3)
        .initial_backoff(Duration::from_millis(1));
    let c =
        Client::connect_with(&format!("tcp://{addr}"), Options::default().retry(retry)).unwrap();
    assert!(matches!(c.call::<i64, _>("m", ()), Err(Error::Closed)));
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(*count.lock().unwrap(), 1);
    assert!(matches!(
        c.call_idempotent::<i64, _>("m", ()),
        Err(Error::Closed)
    ));
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(*count.lock().unwrap(), 4);
    // The total-time cap stops retries before the attempt cap.
    let retry = Retry::default()
        .max_attempts(100)
        .initial_backoff(Duration::from_millis(20))
        .max_elapsed(Duration::from_millis(100));
    let c =
        Client::connect_with(&format!("tcp://{addr}"), Options::default().retry(retry)).unwrap();
    let start = Instant::now();
    assert!(c.call_idempotent::<i64, _>("m", ()).is_err());
    assert!(start.elapsed() < Duration::from_secs(1));
    assert!(*count.lock().unwrap() < 4 + 10);
}

/// An error with a `null` id on a stream names no request: after a notification (whose
/// error it may be: a line over the server's limit) it is not given to the one call
/// waiting, and with several calls waiting it fails none of them; each gets its own
/// answer.
#[test]
fn an_error_with_a_null_id_is_given_to_no_call_it_may_not_be_for() {
    let null_error =
        json!({"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request"}});
    let (addr, t) = scripted(move |_, mut r| {
        // A notification, then a call: the notification's error, then the call's answer.
        let _note = read_request(&mut r).unwrap();
        let call = read_request(&mut r).unwrap();
        answer(&mut r, &null_error);
        answer(&mut r, &json!({"jsonrpc":"2.0","id":call["id"],"result":1}));
        // Two calls waiting, and an error no one can be told apart for.
        let (a, b) = (read_request(&mut r).unwrap(), read_request(&mut r).unwrap());
        answer(&mut r, &null_error);
        for req in [a, b] {
            let n = if req["method"] == "two" { 2 } else { 3 };
            answer(&mut r, &json!({"jsonrpc":"2.0","id":req["id"],"result":n}));
        }
        false
    });
    let c = Arc::new(Client::connect(&format!("tcp://{addr}")).unwrap());
    c.notify("note", [0]).unwrap();
    assert_eq!(c.call::<i64, _>("one", ()).unwrap(), 1);
    let c2 = Arc::clone(&c);
    let first = std::thread::spawn(move || c2.call::<i64, _>("two", ()).unwrap());
    // (The server reads both before answering either.)
    let second = c.call::<i64, _>("three", ()).unwrap();
    assert_eq!((first.join().unwrap(), second), (2, 3));
    t.join().unwrap();
}

#[test]
fn protocol_violations_are_reported_as_such() {
    let cases: Vec<(&'static str, Violation)> = vec![
        ("{not json", Violation::BadJson),
        (
            r#"{"jsonrpc":"2.0","id":999999,"result":1}"#,
            Violation::UnknownId,
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"result":1,"error":{"code":1,"message":"m"}}"#,
            Violation::BothResultAndError,
        ),
        (
            r#"{"jsonrpc":"2.0","id":1}"#,
            Violation::NeitherResultNorError,
        ),
        (
            r#"{"jsonrpc":"1.0","id":1,"result":1}"#,
            Violation::WrongVersion,
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":"x"}}"#,
            Violation::BadErrorObject,
        ),
        (
            r#"[{"jsonrpc":"2.0","id":1,"result":1}]"#,
            Violation::Mismatched,
        ),
        (r#"7"#, Violation::NotAResponse),
    ];
    for (reply, want) in cases {
        let (addr, t) = scripted(move |_, mut r| {
            let req = read_request(&mut r).unwrap();
            // `"id":1` stands for the call's own id (the client's ids start at random).
            let reply = reply.replace(r#""id":1"#, &format!(r#""id":{}"#, req["id"]));
            r.get_mut().write_all(reply.as_bytes()).unwrap();
            r.get_mut().write_all(b"\n").unwrap();
            let _ = read_request(&mut r);
            false
        });
        let c = Client::connect(&format!("tcp://{addr}")).unwrap();
        match c.call::<Value, _>("m", ()) {
            Err(Error::Protocol(v)) => assert_eq!(v, want, "{reply}"),
            other => panic!("{reply}: {other:?}"),
        }
        drop(c);
        t.join().unwrap();
    }
}

#[test]
fn server_errors_carry_code_message_and_raw_data() {
    let (addr, t) = scripted(|_, mut r| {
        for data in [
            r#","data":{"b":[1, 2.50],"a":"\u00e9"}"#,
            "",
            r#","data":"s""#,
        ] {
            let req = read_request(&mut r).unwrap();
            let line = format!(
                r#"{{"jsonrpc":"2.0","id":{},"error":{{"code":-7,"message":"no \"way\""{data}}}}}"#,
                req["id"]
            );
            r.get_mut().write_all(line.as_bytes()).unwrap();
            r.get_mut().write_all(b"\n").unwrap();
        }
        // An id-less error is given to the one call waiting.
        read_request(&mut r).unwrap();
        answer(
            &mut r,
            &json!({"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"bad"}}),
        );
        false
    });
    let c = Client::connect(&format!("tcp://{addr}")).unwrap();
    let datas = [
        Some(r#"{"b":[1, 2.50],"a":"\u00e9"}"#.to_owned()),
        None,
        Some(r#""s""#.to_owned()),
    ];
    for data in datas {
        match c.call::<Value, _>("m", ()).unwrap_err() {
            Error::Server(e) => {
                assert_eq!((e.code, e.message.as_str()), (-7, "no \"way\""));
                assert_eq!(e.data, data);
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        server_code(c.call::<Value, _>("m", ()).unwrap_err()),
        -32600
    );
    t.join().unwrap();
}

#[test]
fn connect_failures_are_distinct() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    assert!(matches!(
        Client::connect(&format!("tcp://{addr}")),
        Err(Error::Connect(_))
    ));
    assert!(matches!(
        Client::connect("unix:///nonexistent/ringrpc.sock"),
        Err(Error::Connect(_))
    ));
    assert!(matches!(Client::connect("ftp://x"), Err(Error::Address(_))));
    // A listener whose accept queue is full drops further SYNs: connecting times out.
    let l = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    l.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
        .unwrap();
    l.listen(0).unwrap();
    let addr = l.local_addr().unwrap().as_socket().unwrap();
    let opts = Options::default().connect_timeout(Duration::from_millis(100));
    let mut held = Vec::new();
    let outcome = loop {
        match Client::connect_with(&format!("tcp://{addr}"), opts.clone()) {
            Ok(c) if held.len() < 16 => held.push(c),
            other => break other,
        }
    };
    assert!(matches!(outcome, Err(Error::ConnectTimeout)), "{outcome:?}");
}

#[test]
fn a_server_that_stops_reading_gives_a_write_timeout() {
    let (addr, _t) = scripted(|_, r| {
        std::thread::sleep(Duration::from_secs(3));
        drop(r);
        false
    });
    let opts = Options::default().timeout(Duration::from_millis(200));
    let c = Client::connect_with(&format!("tcp://{addr}"), opts).unwrap();
    let big = vec![0u8; 1 << 20];
    let mut last = None;
    for _ in 0..64 {
        match c.start("m", [&big]) {
            Ok(p) => std::mem::forget(p),
            Err(e) => {
                last = Some(e);
                break;
            }
        }
    }
    assert!(matches!(last, Some(Error::WriteTimeout)), "{last:?}");
}

#[test]
fn http_answers_chunked_statuses_and_close() {
    let (addr, t) = scripted(|_, mut r| {
        let req = read_http(&mut r).unwrap();
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{},"result":"chunked"}}"#,
            req["id"]
        );
        let (a, b) = body.split_at(10);
        let resp = format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
            a.len(),
            b.len()
        );
        r.get_mut().write_all(resp.as_bytes()).unwrap();
        read_http(&mut r).unwrap();
        r.get_mut()
            .write_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy")
            .unwrap();
        let req = read_http(&mut r).unwrap();
        let body = format!(r#"{{"jsonrpc":"2.0","id":{},"result":"last"}}"#, req["id"]);
        let resp = format!(
            "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        r.get_mut().write_all(resp.as_bytes()).unwrap();
        true
    });
    let c = Client::connect(&format!("http://{addr}/rpc")).unwrap();
    assert_eq!(c.call::<String, _>("a", ()).unwrap(), "chunked");
    assert!(matches!(
        c.call::<String, _>("b", ()),
        Err(Error::Protocol(Violation::HttpStatus(503)))
    ));
    assert_eq!(c.call::<String, _>("c", ()).unwrap(), "last");
    drop(t);
}

/// Over WebSocket: a refused handshake is the server's status; a server's ping is
/// answered (before the next request); a server that breaks the framing fails the call.
#[test]
fn websocket_handshakes_pings_and_violations() {
    let server = Running::start();
    let http = server.urls[2]
        .trim_start_matches("http://")
        .trim_end_matches('/');
    assert!(matches!(
        Client::connect(&format!("ws://{http}/elsewhere")),
        Err(Error::Protocol(Violation::HttpStatus(404)))
    ));
    // A scripted server: answers the handshake, pings, then answers the first call,
    // checks that the pong came before the second request, and answers with a frame
    // it must not send (masked) to the third.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            s.read_exact(&mut b).unwrap();
            head.push(b[0]);
        }
        let head = String::from_utf8(head).unwrap();
        let key = head
            .lines()
            .find_map(|l| l.strip_prefix("Sec-WebSocket-Key: "))
            .unwrap()
            .to_owned();
        let accept = {
            use sha1::Digest;
            let mut h = sha1::Sha1::new();
            h.update(key.as_bytes());
            h.update(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.encode(h.finalize())
        };
        write!(
            s,
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Accept: {accept}\r\n\r\n"
        )
        .unwrap();
        // A ping right away, then read frames: (opcode, unmasked payload).
        s.write_all(&[0x89, 0x02, b'h', b'i']).unwrap();
        let mut frames = Vec::new();
        let read_frame = |s: &mut TcpStream| {
            let mut h = [0u8; 2];
            s.read_exact(&mut h).unwrap();
            assert_eq!(h[1] & 0x80, 0x80, "a client's frames are masked");
            let len = match h[1] & 0x7f {
                126 => {
                    let mut l = [0u8; 2];
                    s.read_exact(&mut l).unwrap();
                    usize::from(u16::from_be_bytes(l))
                }
                n => usize::from(n),
            };
            let mut mask = [0u8; 4];
            s.read_exact(&mut mask).unwrap();
            let mut p = vec![0u8; len];
            s.read_exact(&mut p).unwrap();
            p.iter_mut()
                .enumerate()
                .for_each(|(i, b)| *b ^= mask[i % 4]);
            (h[0] & 0x0f, p)
        };
        for answer in [r#"{"jsonrpc":"2.0","id":ID,"result":1}"#, ""] {
            let (op, p) = read_frame(&mut s);
            let (op, p) = if op == 0xA {
                frames.push((op, p));
                read_frame(&mut s)
            } else {
                (op, p)
            };
            assert_eq!(op, 1);
            let v: Value = serde_json::from_slice(&p).unwrap();
            let id = v["id"].to_string();
            if answer.is_empty() {
                // Masked: a server must not.
                s.write_all(&[0x81, 0x82, 0, 0, 0, 0, b'{', b'}']).unwrap();
            } else {
                let a = answer.replace("ID", &id);
                s.write_all(&[0x81, a.len() as u8]).unwrap();
                s.write_all(a.as_bytes()).unwrap();
            }
        }
        frames
    });
    let c = Client::connect(&format!("ws://{addr}/")).unwrap();
    assert_eq!(c.call::<i64, _>("one", ()).unwrap(), 1);
    let e = c.call::<i64, _>("two", ()).unwrap_err();
    assert!(
        matches!(e, Error::Protocol(Violation::WebSocket(_))),
        "{e:?}"
    );
    let pongs = server.join().unwrap();
    assert_eq!(pongs, vec![(0xA, b"hi".to_vec())], "the ping answered");
}
