//! The server over real sockets, newline-delimited transports (TCP and Unix).

mod util;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use ringrpc::server::Server;
use ringrpc::{demo, Config, ServerConfig};
use serde_json::{json, Value};
use util::server::Served;
use util::Setup;

/// A demo server with `setup`.
struct Running(Served);

impl Running {
    fn start(setup: Setup) -> Self {
        Self(Served::start(demo::engine(setup.0), setup.1))
    }

    fn tcp(&self) -> TcpStream {
        let s = TcpStream::connect(self.0.tcp).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s
    }

    fn stop(self) {
        self.0.stop();
    }
}

impl std::ops::Deref for Running {
    type Target = Served;
    fn deref(&self) -> &Served {
        &self.0
    }
}

/// Sends `lines` and reads `n` reply lines.
fn exchange<S: Read + Write>(s: S, lines: &[&str], n: usize) -> Vec<Value> {
    let mut r = BufReader::new(s);
    for l in lines {
        r.get_mut().write_all(l.as_bytes()).unwrap();
        r.get_mut().write_all(b"\n").unwrap();
    }
    let mut out = Vec::new();
    for _ in 0..n {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        out.push(serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}")));
    }
    out
}

/// The section 7 examples: a line and its answer (`None`: none; a number: that code).
fn spec_cases() -> Vec<(&'static str, Option<Value>)> {
    vec![
        (
            r#"{"jsonrpc": "2.0", "method": "subtract", "params": [42, 23], "id": 1}"#,
            Some(json!({"jsonrpc":"2.0","id":1,"result":19})),
        ),
        (
            r#"{"jsonrpc": "2.0", "method": "subtract", "params": {"subtrahend": 23, "minuend": 42}, "id": 3}"#,
            Some(json!({"jsonrpc":"2.0","id":3,"result":19})),
        ),
        (
            r#"{"jsonrpc": "2.0", "method": "update", "params": [1,2,3,4,5]}"#,
            None,
        ),
        (
            r#"{"jsonrpc": "2.0", "method": "foobar", "id": "1"}"#,
            Some(json!(-32601)),
        ),
        (
            r#"{"jsonrpc": "2.0", "method": "foobar, "params": "bar", "baz]"#,
            Some(json!(-32700)),
        ),
        (
            r#"{"jsonrpc": "2.0", "method": 1, "params": "bar"}"#,
            Some(json!(-32600)),
        ),
        ("[]", Some(json!(-32600))),
        (
            r#"[{"jsonrpc": "2.0", "method": "notify_sum", "params": [1,2,4]},{"jsonrpc": "2.0", "method": "notify_hello", "params": [7]}]"#,
            None,
        ),
        (
            r#"{"jsonrpc": "2.0", "method": "get_data", "id": 9}"#,
            Some(json!({"jsonrpc":"2.0","id":9,"result":["hello",5]})),
        ),
    ]
}

fn check(got: &Value, want: &Value) {
    match want {
        Value::Number(code) => {
            assert_eq!(&got["error"]["code"], &Value::Number(code.clone()), "{got}")
        }
        _ => assert_eq!(got, want),
    }
}

#[test]
fn spec_examples_over_tcp_and_unix() {
    let server = Running::start(Setup::default());
    let cases = spec_cases();
    let lines: Vec<&str> = cases.iter().map(|c| c.0).collect();
    let wants: Vec<&Value> = cases.iter().filter_map(|c| c.1.as_ref()).collect();
    // Pipelined on one connection; answers come back in request order.
    let got = exchange(server.tcp(), &lines, wants.len());
    for (g, w) in got.iter().zip(&wants) {
        check(g, w);
    }
    let unix = UnixStream::connect(&server.unix).unwrap();
    unix.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let got = exchange(unix, &lines, wants.len());
    for (g, w) in got.iter().zip(&wants) {
        check(g, w);
    }
    server.stop();
}

#[test]
fn blocking_batch_runs_on_the_pool_and_keeps_order() {
    let server = Running::start(Setup::default().workers(2));
    let batch: Vec<String> = (0..8)
        .map(|i| format!(r#"{{"jsonrpc":"2.0","method":"sleep","params":{{"ms":50}},"id":{i}}}"#))
        .collect();
    let batch = format!(
        "[{},{{\"jsonrpc\":\"2.0\",\"method\":\"ping\",\"id\":\"p\"}}]",
        batch.join(",")
    );
    let lines = [
        batch.as_str(),
        r#"{"jsonrpc":"2.0","method":"ping","id":"after"}"#,
    ];
    let got = exchange(server.tcp(), &lines, 2);
    let arr = got[0].as_array().unwrap();
    assert_eq!(arr.len(), 9);
    let mut ids: Vec<String> = arr.iter().map(|r| r["id"].to_string()).collect();
    ids.sort();
    assert_eq!(ids.len(), 9);
    assert!(arr.iter().all(|r| r.get("error").is_none()), "{}", got[0]);
    // The ping after the batch waits its turn.
    assert_eq!(got[1]["id"], "after");
    server.stop();
}

#[test]
fn request_timeout_and_busy() {
    let server = Running::start(
        Setup::default()
            .workers(1)
            .queue_capacity(1)
            .request_timeout(Some(Duration::from_millis(200))),
    );
    let lines = [
        r#"{"jsonrpc":"2.0","method":"sleep","params":{"ms":1000},"id":1}"#,
        r#"{"jsonrpc":"2.0","method":"sleep","params":{"ms":1000},"id":2}"#,
        r#"{"jsonrpc":"2.0","method":"sleep","params":{"ms":1000},"id":3}"#,
        r#"{"jsonrpc":"2.0","method":"ping","id":4}"#,
    ];
    let got = exchange(server.tcp(), &lines, 4);
    assert_eq!(got[0]["id"], 1);
    assert_eq!(got[0]["error"]["code"], -32001, "{}", got[0]);
    // One waits in the queue (then times out too), the third finds it full.
    let codes: Vec<i64> = got[1..3]
        .iter()
        .map(|g| g["error"]["code"].as_i64().unwrap())
        .collect();
    assert!(codes.contains(&-32000), "{codes:?}");
    assert_eq!(got[3]["result"], "pong");
    server.stop();
}

#[test]
fn many_connections_pipelined() {
    let server = Running::start(Setup::default());
    let threads: Vec<_> = (0..20)
        .map(|c| {
            let s = server.tcp();
            std::thread::spawn(move || {
                let mut req = String::new();
                for i in 0..100 {
                    req.push_str(&format!(
                        "{{\"jsonrpc\":\"2.0\",\"method\":\"add\",\"params\":[{c},{i}],\"id\":{i}}}\n"
                    ));
                }
                let mut r = BufReader::new(s);
                r.get_mut().write_all(req.as_bytes()).unwrap();
                for i in 0..100 {
                    let mut line = String::new();
                    r.read_line(&mut line).unwrap();
                    let v: Value = serde_json::from_str(&line).unwrap();
                    assert_eq!(v["id"], i);
                    assert_eq!(v["result"], c + i);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    server.stop();
}

#[test]
fn oversized_request_and_vanishing_clients() {
    let server = Running::start(Setup::default().max_request_bytes(1024));
    // A client that disappears mid-request and mid-batch.
    for partial in [
        r#"{"jsonrpc":"2.0","method":"ping","#,
        r#"[{"jsonrpc":"2.0","method":"sleep","params":{"ms":100},"id":1},"#,
    ] {
        let mut s = server.tcp();
        s.write_all(partial.as_bytes()).unwrap();
        drop(s);
    }
    let mut s = server.tcp();
    s.write_all(b"[{\"jsonrpc\":\"2.0\",\"method\":\"sleep\",\"params\":{\"ms\":100},\"id\":1}]\n")
        .unwrap();
    drop(s);
    let big = format!(
        r#"{{"jsonrpc":"2.0","method":"echo","params":["{}"],"id":1}}"#,
        "x".repeat(5000)
    );
    let got = exchange(
        server.tcp(),
        &[&big, r#"{"jsonrpc":"2.0","method":"ping","id":2}"#],
        2,
    );
    assert_eq!(got[0]["error"]["code"], -32600);
    assert!(got[0]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("1024"));
    assert_eq!(got[1]["result"], "pong");
    server.stop();
}

#[test]
fn last_line_without_newline_is_answered_at_end_of_stream() {
    let server = Running::start(Setup::default());
    let mut s = server.tcp();
    s.write_all(br#"{"jsonrpc":"2.0","method":"ping","id":1}"#)
        .unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut all = String::new();
    s.read_to_string(&mut all).unwrap();
    let v: Value = serde_json::from_str(all.trim_end()).unwrap();
    assert_eq!(v["result"], "pong");
    server.stop();
}

#[test]
fn several_reactors_share_the_listeners() {
    let server = Running::start(Setup::default().reactors(3).max_connections(40));
    let threads: Vec<_> = (0..30)
        .map(|c| {
            let s = server.tcp();
            std::thread::spawn(move || {
                let lines: Vec<String> = (0..20)
                    .map(|i| {
                        format!(r#"{{"jsonrpc":"2.0","method":"add","params":[{c},{i}],"id":{i}}}"#)
                    })
                    .collect();
                let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
                let got = exchange(s, &lines, 20);
                for (i, g) in got.iter().enumerate() {
                    assert_eq!(g["id"], i);
                    assert_eq!(g["result"], c + i);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // A blocking call on the shared pool from another reactor's connection, then a
    // graceful shutdown that stops every reactor.
    let got = exchange(
        server.tcp(),
        &[r#"{"jsonrpc":"2.0","method":"sleep","params":{"ms":10},"id":"s"}"#],
        1,
    );
    assert_eq!(got[0]["id"], "s");
    server.stop();
}

#[test]
fn slow_senders_are_timed_out() {
    let settings = ServerConfig::default().request_read_timeout(Some(Duration::from_millis(300)));
    let mut server = Server::with_config(demo::engine(Config::default()), settings).unwrap();
    let tcp = server.listen_tcp("127.0.0.1:0").unwrap();
    let http = server.listen_http("127.0.0.1:0").unwrap();
    let handle = server.handle();
    let thread = std::thread::spawn(move || server.run());
    let connect = |a| {
        let s = TcpStream::connect(a).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    };
    // Half a line, then nothing: closed once the request is older than the limit.
    let mut line = connect(tcp);
    line.write_all(br#"{"jsonrpc":"2.0","method":"ping""#)
        .unwrap();
    // Half an HTTP head: 408, then closed.
    let mut head = connect(http);
    head.write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Le")
        .unwrap();
    // A prompt client on the same server is unaffected.
    let ping = r#"{"jsonrpc":"2.0","method":"ping","id":1}"#;
    assert_eq!(exchange(connect(tcp), &[ping], 1)[0]["result"], "pong");
    let mut rest = Vec::new();
    line.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
    let mut rest = String::new();
    head.read_to_string(&mut rest).unwrap();
    assert!(
        rest.starts_with("HTTP/1.1 408 Request Timeout\r\n"),
        "{rest}"
    );
    handle.shutdown();
    thread.join().unwrap().unwrap();
}

/// A request trickled a byte at a time is timed out from its first byte, not from its
/// latest: the server closes the connection while the client is still sending (the
/// clock used to start again with every read, so a trickle was never timed out).
#[test]
fn a_trickled_request_is_timed_out_from_its_first_byte() {
    let settings = ServerConfig::default().request_read_timeout(Some(Duration::from_millis(300)));
    let s = Served::start(demo::engine(Config::default()), settings);
    let (tcp, http) = (s.tcp, s.http);
    // Writes `head`, then a byte every 50 ms, 100 of them (5 s); whether the server
    // stopped taking them before the end, and what it answered.
    let trickle = |addr, head: &'static [u8]| {
        std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(head).unwrap();
            let mut cut = false;
            for _ in 0..100 {
                std::thread::sleep(Duration::from_millis(50));
                if s.write_all(b" ").is_err() {
                    cut = true;
                    break;
                }
            }
            let mut answer = Vec::new();
            let _ = s.read_to_end(&mut answer);
            (cut, String::from_utf8_lossy(&answer).into_owned())
        })
    };
    let line = trickle(tcp, br#"{"jsonrpc":"2.0","method":"ping","id":1"#);
    let body = trickle(
        http,
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{",
    );
    let (cut, answer) = line.join().unwrap();
    assert!(
        cut,
        "a line trickled for 5 s was not cut off (answer {answer:?})"
    );
    let (cut, answer) = body.join().unwrap();
    assert!(
        cut,
        "an HTTP body trickled for 5 s was not cut off (answer {answer:?})"
    );
    assert!(
        answer.starts_with("HTTP/1.1 408 Request Timeout\r\n"),
        "{answer}"
    );
    s.stop();
}

/// A peer that stops reading while it is owed answers is dropped after the idle
/// timeout: what it is owed is bounded, but was held for ever, with the connection.
#[test]
fn a_peer_that_stops_reading_is_dropped_after_the_idle_timeout() {
    let settings = ServerConfig::default()
        .idle_timeout(Some(Duration::from_millis(500)))
        .write_high_water(64 * 1024);
    let served = Served::start(demo::engine(Config::default()), settings);
    let s = TcpStream::connect(served.tcp).unwrap();
    // Requests with 16 KB answers, far more than the sockets' buffers and the high
    // water mark hold, and never a read.
    let mut w = s.try_clone().unwrap();
    w.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    let writer = std::thread::spawn(move || {
        let big = "x".repeat(16 * 1024);
        let req = format!(
            "{{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":[\"{big}\"],\"id\":1}}\n"
        );
        let mut sent = 0;
        for _ in 0..2_000 {
            if w.write_all(req.as_bytes()).is_err() {
                break;
            }
            sent += 1;
        }
        sent
    });
    std::thread::sleep(Duration::from_secs(3));
    // Dropped: what was already in the sockets' buffers, then the end (or a reset).
    // Kept, reading would get answers for ever, then time out.
    let mut r = s;
    r.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = Vec::new();
    let end = r.read_to_end(&mut got);
    assert!(
        !matches!(&end, Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)),
        "the connection was kept: {end:?} after {} bytes",
        got.len()
    );
    let sent = writer.join().unwrap();
    let answers = got.iter().filter(|&&b| b == b'\n').count();
    assert!(answers < sent, "{answers} answers to {sent} requests");
    served.stop();
}

#[test]
fn a_client_streaming_mid_line_is_not_a_slow_sender() {
    // Every read ends mid-request, but each request arrives well within the limit.
    let server =
        Running::start(Setup::default().request_read_timeout(Some(Duration::from_millis(300))));
    let mut s = server.tcp();
    let req = |i: usize| format!("{{\"jsonrpc\":\"2.0\",\"method\":\"ping\",\"id\":{i}}}\n");
    let n = 40;
    let first = req(0);
    s.write_all(&first.as_bytes()[..10]).unwrap();
    let mut pending = first.as_bytes()[10..].to_vec();
    for i in 1..n {
        let next = req(i);
        pending.extend_from_slice(&next.as_bytes()[..10]);
        s.write_all(&pending).unwrap();
        pending = next.as_bytes()[10..].to_vec();
        std::thread::sleep(Duration::from_millis(20));
    }
    s.write_all(&pending).unwrap();
    let mut r = BufReader::new(s);
    for i in 0..n {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
        assert_eq!(v["id"], i);
    }
    server.stop();
}

#[test]
fn a_refusal_reaches_a_client_still_sending() {
    // 413 for a body over the limit, then close: the answer must not be destroyed by a
    // reset caused by the unread rest of the body.
    let mut server = Server::new(demo::engine(Config::default().max_request_bytes(1024))).unwrap();
    let http = server.listen_http("127.0.0.1:0").unwrap();
    let handle = server.handle();
    let thread = std::thread::spawn(move || server.run());
    for _ in 0..10 {
        let mut s = TcpStream::connect(http).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let body = vec![b' '; 200 * 1024];
        let head = format!(
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let mut w = s.try_clone().unwrap();
        let writer = std::thread::spawn(move || {
            let _ = w.write_all(head.as_bytes());
            let _ = w.write_all(&body);
        });
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 413 "), "{text:?}");
        writer.join().unwrap();
    }
    handle.shutdown();
    thread.join().unwrap().unwrap();
}

#[test]
fn max_connections_refuses_cleanly() {
    let server = Running::start(Setup::default().max_connections(2));
    let a = server.tcp();
    let b = server.tcp();
    // Both are served.
    let ping = r#"{"jsonrpc":"2.0","method":"ping","id":1}"#;
    assert_eq!(exchange(&a, &[ping], 1)[0]["result"], "pong");
    assert_eq!(exchange(&b, &[ping], 1)[0]["result"], "pong");
    // The third is closed at once.
    let mut c = server.tcp();
    let _ = c.write_all(ping.as_bytes());
    let _ = c.write_all(b"\n");
    let mut buf = [0u8; 16];
    assert!(matches!(c.read(&mut buf), Ok(0) | Err(_)));
    // The others are unaffected.
    assert_eq!(exchange(&a, &[ping], 1)[0]["result"], "pong");
    drop((a, b));
    server.stop();
}

#[test]
fn graceful_shutdown_answers_calls_in_flight() {
    let server = Running::start(Setup::default().workers(2));
    let mut s = server.tcp();
    s.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"sleep\",\"params\":{\"ms\":800},\"id\":1}\n{\"jsonrpc\":\"2.0\",\"method\":\"ping\",\"id\":2}\n")
        .unwrap();
    // Read by then, on a loaded machine too (a line not read when the shutdown begins
    // is never read); the sleep still runs.
    std::thread::sleep(Duration::from_millis(300));
    server.handle.shutdown();
    let mut r = BufReader::new(s);
    let mut all = String::new();
    r.read_to_string(&mut all).unwrap();
    let lines: Vec<Value> = all
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{all}");
    assert_eq!(lines[0]["id"], 1);
    assert!(lines[0].get("result").is_some());
    assert_eq!(lines[1]["result"], "pong");
    server.stop();
}
