//! The server over real sockets, HTTP/1.1 (and, for the load test, newline TCP).
//!
//! Every socket has read and write timeouts and every server is stopped with a bounded
//! wait, so a hang fails the test instead of stalling it. Responses are parsed with
//! httparse, honouring `Content-Length` (and no body for 1xx and 204).
//!
//! The curl and Python `requests` tests need `curl` and `python3` with `requests` on the
//! PATH; when missing they fail with the install line instead of skipping.

mod util;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ringrpc::server::{Server, ServerHandle};
use ringrpc::{demo, Config, Engine, Params, RpcError, ServerConfig};
use serde_json::{json, Value};
use util::{check_reply, show, Setup};

/// The longest any single socket read or write may block.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------
// A server on a thread
// ---------------------------------------------------------------------------------------

struct Running {
    http: SocketAddr,
    tcp: SocketAddr,
    handle: ServerHandle,
    thread: Option<JoinHandle<std::io::Result<()>>>,
}

impl Running {
    fn start(setup: Setup) -> Self {
        Self::with_engine(demo::engine(setup.0), setup.1)
    }

    fn with_engine(engine: Engine, settings: ServerConfig) -> Self {
        let mut server = Server::with_config(engine, settings).unwrap();
        let http = server.listen_http("127.0.0.1:0").unwrap();
        let tcp = server.listen_tcp("127.0.0.1:0").unwrap();
        let handle = server.handle();
        let thread = Some(std::thread::spawn(move || server.run()));
        Self {
            http,
            tcp,
            handle,
            thread,
        }
    }

    fn client(&self) -> Client {
        Client::connect(self.http)
    }

    /// Shuts down and waits (at most 10 s) for `run()` to return `Ok`.
    fn stop(mut self) {
        self.handle.shutdown();
        self.join();
    }

    /// Waits (at most 10 s) for `run()` to return `Ok`.
    fn join(&mut self) {
        let t = self.thread.take().expect("joined twice");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !t.is_finished() {
            assert!(
                Instant::now() < deadline,
                "the server's run() did not return within 10 s of shutdown"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        t.join().unwrap().unwrap();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.handle.shutdown();
    }
}

// ---------------------------------------------------------------------------------------
// A minimal HTTP client
// ---------------------------------------------------------------------------------------

#[derive(Debug)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// A 200 JSON-RPC reply: checks status, Content-Type and shape; returns the JSON.
    fn rpc(&self) -> Value {
        assert_eq!(self.status, 200, "{self}");
        assert_eq!(
            self.header("Content-Type"),
            Some("application/json"),
            "{self}"
        );
        check_reply(&self.body).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A 204 for a POST with nothing to answer.
    fn no_content(&self) {
        assert_eq!(self.status, 204, "{self}");
        assert!(self.body.is_empty(), "{self}");
        assert_eq!(
            self.header("Content-Length"),
            None,
            "204 must not carry a length: {self}"
        );
    }
}

impl std::fmt::Display for Resp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {:?} {}", self.status, self.headers, show(&self.body))
    }
}

/// One response off the front of `buf`, with the bytes it took; `None` if incomplete.
fn parse_response(buf: &[u8]) -> Option<(Resp, usize)> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut res = httparse::Response::new(&mut headers);
    let status = res
        .parse(buf)
        .unwrap_or_else(|e| panic!("malformed response ({e}): {}", show(buf)));
    let httparse::Status::Complete(head) = status else {
        return None;
    };
    let status = res.code.unwrap();
    let headers: Vec<(String, String)> = res
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_owned(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect();
    let len = if status < 200 || status == 204 || status == 304 {
        0
    } else {
        let cl = headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("Content-Length"))
            .unwrap_or_else(|| panic!("response without Content-Length: {}", show(buf)));
        cl.1.parse::<usize>().unwrap()
    };
    if buf.len() < head + len {
        return None;
    }
    let body = buf[head..head + len].to_vec();
    Some((
        Resp {
            status,
            headers,
            body,
        },
        head + len,
    ))
}

struct Client {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    fn connect(addr: SocketAddr) -> Self {
        Self::from_stream(TcpStream::connect(addr).unwrap())
    }

    fn from_stream(s: TcpStream) -> Self {
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        s.set_nodelay(true).unwrap();
        Self { s, buf: Vec::new() }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).unwrap();
    }

    /// Writes `bytes` `step` bytes at a time, pausing 1 ms every `pause_every` writes so
    /// the server sees many small reads.
    fn trickle(&mut self, bytes: &[u8], step: usize, pause_every: usize) {
        for (i, piece) in bytes.chunks(step).enumerate() {
            self.s.write_all(piece).unwrap();
            if i % pause_every == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Reads one whole response.
    fn read(&mut self) -> Resp {
        loop {
            if let Some((r, n)) = parse_response(&self.buf) {
                self.buf.drain(..n);
                return r;
            }
            let mut tmp = [0u8; 16 * 1024];
            match self.s.read(&mut tmp) {
                Ok(0) => panic!(
                    "the server closed the connection before a whole response; have {}",
                    show(&self.buf)
                ),
                Ok(n) => self.buf.extend_from_slice(&tmp[..n]),
                Err(e) => panic!("reading a response: {e}; have {}", show(&self.buf)),
            }
        }
    }

    fn call(&mut self, request: &[u8]) -> Resp {
        self.send(request);
        self.read()
    }

    /// The server closes the connection with nothing more to read.
    fn assert_closed(&mut self) {
        assert!(self.buf.is_empty(), "unexpected bytes: {}", show(&self.buf));
        let mut tmp = [0u8; 4096];
        match self.s.read(&mut tmp) {
            Ok(0) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
            Ok(n) => panic!("expected the server to close; got {}", show(&tmp[..n])),
            Err(e) => panic!("expected the server to close the connection: {e}"),
        }
    }
}

/// Closes `s` with a TCP reset (SO_LINGER 0) instead of a FIN.
fn reset(s: TcpStream) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket and a correctly sized `linger`.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            std::ptr::from_ref(&l).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0);
    drop(s);
}

// ---------------------------------------------------------------------------------------
// Requests and expectations
// ---------------------------------------------------------------------------------------

/// `POST /` with `Content-Type: application/json`, a length and extra header lines
/// (each ending in CRLF).
fn post_with(headers: &str, body: &str) -> Vec<u8> {
    format!(
        "POST / HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{headers}\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// `req` with its request line replaced by `line`.
fn replace_first_line(req: &[u8], line: &str) -> Vec<u8> {
    let at = req.iter().position(|&b| b == b'\r').unwrap();
    [line.as_bytes(), &req[at..]].concat()
}

/// The length of `req`'s head, the empty line included.
fn head_len(req: &[u8]) -> usize {
    req.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4
}

fn post(body: &str) -> Vec<u8> {
    post_with("", body)
}

fn ping(id: impl std::fmt::Display) -> Vec<u8> {
    post(&format!(r#"{{"jsonrpc":"2.0","method":"ping","id":{id}}}"#))
}

fn sleep_call(ms: u64, id: impl std::fmt::Display) -> String {
    format!(r#"{{"jsonrpc":"2.0","method":"sleep","params":{{"ms":{ms}}},"id":{id}}}"#)
}

/// `body` in chunked framing, `piece` bytes a chunk, with chunk extensions (plain, in
/// upper-case hex, quoted with whitespace before `;`) and a trailer section.
fn chunked(body: &[u8], piece: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, data) in body.chunks(piece).enumerate() {
        let line = match k % 3 {
            0 => format!("{:x}\r\n", data.len()),
            1 => format!("{:X};ext{k}=v\r\n", data.len()),
            _ => format!("{:x} ; name=\"quoted value\";flag\r\n", data.len()),
        };
        out.extend_from_slice(line.as_bytes());
        out.extend_from_slice(data);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0;last=yes\r\nX-Trailer: one\r\nX-Checksum: 1234\r\n\r\n");
    out
}

fn post_chunked(body: &[u8], piece: usize) -> Vec<u8> {
    let mut out = b"POST / HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    out.extend_from_slice(&chunked(body, piece));
    out
}

/// An expected response: `{"id", "result"}` or `{"id", "code"}`.
fn ok(id: Value, result: Value) -> Value {
    json!({"id": id, "result": result})
}

fn err(id: Value, code: i64) -> Value {
    json!({"id": id, "code": code})
}

fn matches(got: &Value, want: &Value) -> bool {
    if got["id"] != want["id"] {
        return false;
    }
    match want.get("result") {
        Some(r) => got.get("result") == Some(r),
        None => got.get("error").is_some_and(|e| e["code"] == want["code"]),
    }
}

fn check_one(got: &Value, want: &Value) {
    assert!(
        got.is_object() && matches(got, want),
        "got {got}, want {want}"
    );
}

/// A batch answer: one element per expectation, matched by id, in any order.
fn check_batch(got: &Value, wants: &[Value]) {
    let mut left: Vec<&Value> = got
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {got}"))
        .iter()
        .collect();
    assert_eq!(left.len(), wants.len(), "got {got}, want {wants:?}");
    for w in wants {
        let i = left
            .iter()
            .position(|g| matches(g, w))
            .unwrap_or_else(|| panic!("no answer matching {w} in {got}"));
        left.remove(i);
    }
}

enum Want {
    NoContent,
    One(Value),
    Batch(Vec<Value>),
}

fn check(resp: &Resp, want: &Want, what: &str) {
    match want {
        Want::NoContent => resp.no_content(),
        Want::One(w) => {
            let got = resp.rpc();
            assert!(
                got.is_object() && matches(&got, w),
                "{what}: got {got}, want {w}"
            );
        }
        Want::Batch(ws) => check_batch(&resp.rpc(), ws),
    }
}

// ---------------------------------------------------------------------------------------
// 1. The specification's section 7 examples
// ---------------------------------------------------------------------------------------

fn spec_cases() -> Vec<(&'static str, Want)> {
    use Want::*;
    let s = |v: &str| json!(v);
    vec![
        (r#"{"jsonrpc": "2.0", "method": "subtract", "params": [42, 23], "id": 1}"#, One(ok(json!(1), json!(19)))),
        (r#"{"jsonrpc": "2.0", "method": "subtract", "params": [23, 42], "id": 2}"#, One(ok(json!(2), json!(-19)))),
        (r#"{"jsonrpc": "2.0", "method": "subtract", "params": {"subtrahend": 23, "minuend": 42}, "id": 3}"#, One(ok(json!(3), json!(19)))),
        (r#"{"jsonrpc": "2.0", "method": "subtract", "params": {"minuend": 42, "subtrahend": 23}, "id": 4}"#, One(ok(json!(4), json!(19)))),
        (r#"{"jsonrpc": "2.0", "method": "update", "params": [1,2,3,4,5]}"#, NoContent),
        (r#"{"jsonrpc": "2.0", "method": "foobar"}"#, NoContent),
        (r#"{"jsonrpc": "2.0", "method": "foobar", "id": "1"}"#, One(err(s("1"), -32601))),
        (r#"{"jsonrpc": "2.0", "method": "foobar, "params": "bar", "baz]"#, One(err(Value::Null, -32700))),
        (r#"{"jsonrpc": "2.0", "method": 1, "params": "bar"}"#, One(err(Value::Null, -32600))),
        (
            "[\n  {\"jsonrpc\": \"2.0\", \"method\": \"sum\", \"params\": [1,2,4], \"id\": \"1\"},\n  {\"jsonrpc\": \"2.0\", \"method\"\n]",
            One(err(Value::Null, -32700)),
        ),
        ("[]", One(err(Value::Null, -32600))),
        ("[1]", Batch(vec![err(Value::Null, -32600)])),
        ("[1,2,3]", Batch(vec![err(Value::Null, -32600); 3])),
        (
            r#"[
        {"jsonrpc": "2.0", "method": "sum", "params": [1,2,4], "id": "1"},
        {"jsonrpc": "2.0", "method": "notify_hello", "params": [7]},
        {"jsonrpc": "2.0", "method": "subtract", "params": [42,23], "id": "2"},
        {"foo": "boo"},
        {"jsonrpc": "2.0", "method": "foo.get", "params": {"name": "myself"}, "id": "5"},
        {"jsonrpc": "2.0", "method": "get_data", "id": "9"}
    ]"#,
            Batch(vec![
                ok(s("1"), json!(7)),
                ok(s("2"), json!(19)),
                err(Value::Null, -32600),
                err(s("5"), -32601),
                ok(s("9"), json!(["hello", 5])),
            ]),
        ),
        (
            r#"[
        {"jsonrpc": "2.0", "method": "notify_sum", "params": [1,2,4]},
        {"jsonrpc": "2.0", "method": "notify_hello", "params": [7]}
    ]"#,
            NoContent,
        ),
    ]
}

#[test]
fn spec_examples_over_http() {
    let server = Running::start(Setup::default());
    let cases = spec_cases();
    // One request at a time on one keep-alive connection.
    let mut c = server.client();
    for (body, want) in &cases {
        let r = c.call(&post(body));
        check(&r, want, body);
        if !matches!(want, Want::NoContent) {
            assert_eq!(r.header("Connection"), Some("keep-alive"), "{r}");
        }
    }
    // All pipelined on another: the answers come back in request order, and a 204
    // carries no stray body (the next response would not parse).
    let mut c = server.client();
    let all: Vec<u8> = cases.iter().flat_map(|(b, _)| post(b)).collect();
    c.send(&all);
    for (body, want) in &cases {
        check(&c.read(), want, body);
    }
    // Each on its own connection, with `Connection: close`.
    for (body, want) in &cases {
        let mut c = server.client();
        let r = c.call(&post_with("Connection: close\r\n", body));
        check(&r, want, body);
        assert_eq!(r.header("Connection"), Some("close"), "{r}");
        c.assert_closed();
    }
    server.stop();
}

// ---------------------------------------------------------------------------------------
// 2. Keep-alive and closing
// ---------------------------------------------------------------------------------------

#[test]
fn keep_alive_and_connection_close() {
    let server = Running::start(Setup::default());

    // HTTP/1.1: several requests, health checks included, on one connection.
    let mut c = server.client();
    for i in 0..5 {
        let r = c.call(&ping(i));
        check_one(&r.rpc(), &ok(json!(i), json!("pong")));
        assert_eq!(r.header("Connection"), Some("keep-alive"), "{r}");
        let h = c.call(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n");
        assert_eq!(h.status, 200, "{h}");
        assert_eq!(
            serde_json::from_slice::<Value>(&h.body).unwrap(),
            json!({"status":"ok"})
        );
    }
    // `Connection: close` is honoured: answered, then closed.
    let r = c.call(&post_with(
        "Connection: close\r\n",
        r#"{"jsonrpc":"2.0","method":"ping","id":"last"}"#,
    ));
    check_one(&r.rpc(), &ok(json!("last"), json!("pong")));
    assert_eq!(r.header("Connection"), Some("close"), "{r}");
    c.assert_closed();

    // A request pipelined after the closing one is not answered.
    let mut c = server.client();
    let mut two = post_with(
        "Connection: close\r\n",
        r#"{"jsonrpc":"2.0","method":"ping","id":1}"#,
    );
    two.extend_from_slice(&ping(2));
    c.send(&two);
    check_one(&c.read().rpc(), &ok(json!(1), json!("pong")));
    c.assert_closed();

    // `Connection: close` on a notification: 204, then closed.
    let mut c = server.client();
    let r = c.call(&post_with(
        "Connection: close\r\n",
        r#"{"jsonrpc":"2.0","method":"update","params":[1]}"#,
    ));
    r.no_content();
    assert_eq!(r.header("Connection"), Some("close"), "{r}");
    c.assert_closed();

    // HTTP/1.0 without keep-alive closes after one answer.
    let body = r#"{"jsonrpc":"2.0","method":"add","params":[2,3],"id":10}"#;
    let req10 = format!(
        "POST / HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut c = server.client();
    let r = c.call(req10.as_bytes());
    check_one(&r.rpc(), &ok(json!(10), json!(5)));
    assert_eq!(r.header("Connection"), Some("close"), "{r}");
    c.assert_closed();

    // HTTP/1.0 with `Connection: keep-alive` stays open.
    let req10ka = format!(
        "POST / HTTP/1.0\r\nConnection: keep-alive\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut c = server.client();
    for _ in 0..3 {
        let r = c.call(req10ka.as_bytes());
        check_one(&r.rpc(), &ok(json!(10), json!(5)));
        assert_eq!(r.header("Connection"), Some("keep-alive"), "{r}");
    }

    // HTTP/1.0 on a blocking call: answered when the pool is done, then closed.
    let sleep = sleep_call(30, 11);
    let req10 = format!(
        "POST / HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{sleep}",
        sleep.len()
    );
    let mut c = server.client();
    let r = c.call(req10.as_bytes());
    check_one(&r.rpc(), &ok(json!(11), Value::Null));
    c.assert_closed();

    // `Connection: close` pipelined behind a blocking call: both answered, in order,
    // then closed; the request after it is ignored.
    let mut c = server.client();
    let mut reqs = post(&sleep_call(50, 1));
    reqs.extend(post_with(
        "Connection: close\r\n",
        r#"{"jsonrpc":"2.0","method":"ping","id":2}"#,
    ));
    reqs.extend(ping(3));
    c.send(&reqs);
    check_one(&c.read().rpc(), &ok(json!(1), Value::Null));
    let r = c.read();
    check_one(&r.rpc(), &ok(json!(2), json!("pong")));
    assert_eq!(r.header("Connection"), Some("close"), "{r}");
    c.assert_closed();

    // A client that half-closes after pipelining still gets every answer, then EOF.
    let mut c = server.client();
    let mut reqs = post(&sleep_call(50, 1));
    reqs.extend(ping(2));
    c.send(&reqs);
    c.s.shutdown(std::net::Shutdown::Write).unwrap();
    check_one(&c.read().rpc(), &ok(json!(1), Value::Null));
    check_one(&c.read().rpc(), &ok(json!(2), json!("pong")));
    c.assert_closed();
    server.stop();
}

// ---------------------------------------------------------------------------------------
// 3. Pipelining
// ---------------------------------------------------------------------------------------

#[test]
fn fifty_pipelined_requests_answer_in_order() {
    let server = Running::start(Setup::default().workers(2));
    let mut reqs: Vec<u8> = Vec::new();
    let mut wants: Vec<Want> = Vec::new();
    for i in 0..50i64 {
        match i {
            // A blocking call on the worker pool in the middle.
            20 => {
                reqs.extend(post(&sleep_call(50, i)));
                wants.push(Want::One(ok(json!(i), Value::Null)));
            }
            // A notification (204) and a health check queued behind it.
            22 => {
                reqs.extend(post(r#"{"jsonrpc":"2.0","method":"update","params":[1]}"#));
                wants.push(Want::NoContent);
            }
            24 => {
                reqs.extend_from_slice(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n");
                wants.push(Want::One(Value::Null)); // checked below
            }
            // A refusal queued behind it too (404; the body is skipped).
            26 => {
                reqs.extend(replace_first_line(
                    &post(r#"{"jsonrpc":"2.0","method":"ping","id":26}"#),
                    "POST /x HTTP/1.1",
                ));
                wants.push(Want::One(Value::Null)); // checked below
            }
            // A batch with a blocking element.
            30 => {
                reqs.extend(post(&format!(
                    r#"[{},{{"jsonrpc":"2.0","method":"add","params":[30,1],"id":"30b"}}]"#,
                    sleep_call(20, "\"30a\"")
                )));
                wants.push(Want::Batch(vec![
                    ok(json!("30a"), Value::Null),
                    ok(json!("30b"), json!(31)),
                ]));
            }
            _ if i % 3 == 0 => {
                reqs.extend(post(&format!(
                    r#"{{"jsonrpc":"2.0","method":"add","params":[{i},1],"id":{i}}}"#
                )));
                wants.push(Want::One(ok(json!(i), json!(i + 1))));
            }
            _ => {
                reqs.extend(ping(i));
                wants.push(Want::One(ok(json!(i), json!("pong"))));
            }
        }
    }
    let mut c = server.client();
    c.send(&reqs);
    for (i, want) in wants.iter().enumerate() {
        let r = c.read();
        match i {
            24 => {
                assert_eq!(r.status, 200, "{r}");
                assert_eq!(r.body, br#"{"status":"ok"}"#, "{r}");
            }
            26 => assert_eq!(r.status, 404, "{r}"),
            _ => check(&r, want, &format!("request {i}")),
        }
    }
    // Still usable afterwards.
    check_one(&c.call(&ping(99)).rpc(), &ok(json!(99), json!("pong")));
    server.stop();
}

#[test]
fn blocking_notifications_get_no_content() {
    let server = Running::start(Setup::default().workers(2));
    let mut c = server.client();
    let note = r#"{"jsonrpc":"2.0","method":"sleep","params":{"ms":20}}"#;
    let mut reqs = post(note);
    reqs.extend(post(&format!("[{note},{note}]")));
    reqs.extend(post(&format!(
        r#"[{note},{{"jsonrpc":"2.0","method":"update"}}]"#
    )));
    reqs.extend(ping(1));
    c.send(&reqs);
    for _ in 0..3 {
        c.read().no_content();
    }
    check_one(&c.read().rpc(), &ok(json!(1), json!("pong")));
    server.stop();
}

// ---------------------------------------------------------------------------------------
// 4. Chunked bodies
// ---------------------------------------------------------------------------------------

#[test]
fn chunked_bodies_in_tiny_writes() {
    let server = Running::start(Setup::default());
    let batch = r#"[{"jsonrpc": "2.0", "method": "sum", "params": [1,2,4], "id": "1"},
        {"jsonrpc": "2.0", "method": "notify_hello", "params": [7]},
        {"jsonrpc": "2.0", "method": "subtract", "params": {"minuend": 42, "subtrahend": 23}, "id": "2"},
        {"jsonrpc": "2.0", "method": "get_data", "id": "9"}]"#;
    let want = Want::Batch(vec![
        ok(json!("1"), json!(7)),
        ok(json!("2"), json!(19)),
        ok(json!("9"), json!(["hello", 5])),
    ]);
    let mut c = server.client();
    // Chunks of 13 bytes, written 3 bytes at a time.
    c.trickle(&post_chunked(batch.as_bytes(), 13), 3, 4);
    check(&c.read(), &want, "chunked batch, 3-byte writes");
    // Byte by byte, one-byte chunks.
    let call = r#"{"jsonrpc":"2.0","method":"add","params":[20,22],"id":"one"}"#;
    c.trickle(&post_chunked(call.as_bytes(), 1), 1, 8);
    check_one(&c.read().rpc(), &ok(json!("one"), json!(42)));
    // One chunk holding everything, then a Content-Length request in the same write.
    let mut two = post_chunked(call.as_bytes(), 1000);
    two.extend(ping("\"after\""));
    c.send(&two);
    check_one(&c.read().rpc(), &ok(json!("one"), json!(42)));
    check_one(&c.read().rpc(), &ok(json!("after"), json!("pong")));
    // A chunked all-notification body: 204.
    c.trickle(
        &post_chunked(br#"[{"jsonrpc":"2.0","method":"update"},{"jsonrpc":"2.0","method":"notify_sum","params":[1]}]"#, 7),
        5,
        2,
    );
    c.read().no_content();
    check_one(&c.call(&ping(1)).rpc(), &ok(json!(1), json!("pong")));
    server.stop();
}

// ---------------------------------------------------------------------------------------
// 5. Expect: 100-continue
// ---------------------------------------------------------------------------------------

fn require_curl() {
    let ok = Command::new("curl")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "this test needs `curl` on the PATH (Debian/Ubuntu: apt-get install -y curl)"
    );
}

#[test]
fn expect_100_continue_with_curl() {
    require_curl();
    let server = Running::start(Setup::default());
    let pad = "x".repeat(3000);
    let body = format!(r#"{{"jsonrpc":"2.0","method":"echo","params":["{pad}"],"id":"curl"}}"#);
    assert!(body.len() > 3000);
    let file = std::env::temp_dir().join(format!(
        "ringrpc-http-test-{}-{}.json",
        std::process::id(),
        server.http.port()
    ));
    std::fs::write(&file, &body).unwrap();
    let out = Command::new("curl")
        .args(["-sS", "-v", "--http1.1", "--max-time", "10"])
        .args(["--expect100-timeout", "5"])
        .args(["-H", "Content-Type: application/json"])
        .args(["-H", "Expect: 100-continue"])
        .arg("--data-binary")
        .arg(format!("@{}", file.display()))
        .arg(format!("http://{}/", server.http))
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "curl failed: {stderr}");
    let cont = stderr
        .find("< HTTP/1.1 100 Continue")
        .unwrap_or_else(|| panic!("no 100 Continue in curl -v output:\n{stderr}"));
    let okay = stderr
        .find("< HTTP/1.1 200 OK")
        .unwrap_or_else(|| panic!("no 200 OK in curl -v output:\n{stderr}"));
    assert!(cont < okay, "{stderr}");
    let got = check_reply(&out.stdout).unwrap();
    assert_eq!(got, json!({"jsonrpc":"2.0","id":"curl","result":[pad]}));
    server.stop();
}

#[test]
fn expect_100_continue_raw() {
    let server = Running::start(Setup::default().max_request_bytes(1024));
    let body = r#"{"jsonrpc":"2.0","method":"subtract","params":[42,23],"id":7}"#;
    let head = format!(
        "POST / HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut c = server.client();
    // The head alone: 100 before any body byte is sent.
    c.send(head.as_bytes());
    let r = c.read();
    assert_eq!(r.status, 100, "{r}");
    c.send(body.as_bytes());
    check_one(&c.read().rpc(), &ok(json!(7), json!(19)));
    // Head and body at once: 100 then 200, still in one keep-alive connection.
    c.send(format!("{head}{body}").as_bytes());
    assert_eq!(c.read().status, 100);
    check_one(&c.read().rpc(), &ok(json!(7), json!(19)));
    // Chunked with 100-continue.
    let mut req = b"POST / HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    c.send(&req);
    assert_eq!(c.read().status, 100);
    c.trickle(&chunked(body.as_bytes(), 10), 4, 2);
    check_one(&c.read().rpc(), &ok(json!(7), json!(19)));
    // Refused head (body over the limit): 413 without 100, then closed.
    req = b"POST / HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: 5000\r\n\r\n".to_vec();
    let r = c.call(&req);
    assert_eq!(r.status, 413, "{r}");
    c.assert_closed();
    check_one(
        &server.client().call(&ping(1)).rpc(),
        &ok(json!(1), json!("pong")),
    );
    server.stop();
}

// ---------------------------------------------------------------------------------------
// 6. Python requests as a third-party client
// ---------------------------------------------------------------------------------------

const PY_CLIENT: &str = r#"
import json, sys
import requests

url = sys.argv[1]
s = requests.Session()
out = []

def record(r):
    out.append({"status": r.status_code, "type": r.headers.get("Content-Type"),
                "body": r.text})

record(s.post(url, json={"jsonrpc": "2.0", "method": "subtract", "params": [42, 23], "id": 1}, timeout=10))
record(s.post(url, json=[
    {"jsonrpc": "2.0", "method": "sum", "params": [1, 2, 4], "id": "1"},
    {"jsonrpc": "2.0", "method": "notify_hello", "params": [7]},
    {"jsonrpc": "2.0", "method": "subtract", "params": [42, 23], "id": "2"},
    {"foo": "boo"},
    {"jsonrpc": "2.0", "method": "get_data", "id": "9"},
], timeout=10))

def gen():
    yield b'{"jsonrpc": "2.0",'
    yield b' "method": "sum",'
    yield b' "params": [1, 2, 3, 4],'
    yield b' "id": "gen"}'

r = s.post(url, data=gen(), headers={"Content-Type": "application/json"}, timeout=10)
assert r.request.headers.get("Transfer-Encoding") == "chunked", r.request.headers
record(r)
record(s.post(url, json={"jsonrpc": "2.0", "method": "update", "params": [1]}, timeout=10))
record(s.get(url + "health", timeout=10))
print(json.dumps(out))
"#;

fn require_python_requests() {
    let ok = Command::new("python3")
        .args(["-c", "import requests"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "this test needs python3 with the `requests` package \
         (Debian/Ubuntu: apt-get install -y python3 python3-requests; or pip install requests)"
    );
}

#[test]
fn python_requests_session() {
    require_python_requests();
    let server = Running::start(Setup::default());
    let out = Command::new("python3")
        .args(["-c", PY_CLIENT])
        .arg(format!("http://{}/", server.http))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "python client failed: {stderr}");
    let got: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}; stderr: {stderr}", show(&out.stdout)));
    let got = got.as_array().unwrap();
    assert_eq!(got.len(), 5, "{got:?}");
    let body = |i: usize| -> Value {
        assert_eq!(got[i]["status"], 200, "{}", got[i]);
        assert_eq!(got[i]["type"], "application/json", "{}", got[i]);
        check_reply(got[i]["body"].as_str().unwrap().as_bytes()).unwrap()
    };
    check_one(&body(0), &ok(json!(1), json!(19)));
    check_batch(
        &body(1),
        &[
            ok(json!("1"), json!(7)),
            ok(json!("2"), json!(19)),
            err(Value::Null, -32600),
            ok(json!("9"), json!(["hello", 5])),
        ],
    );
    check_one(&body(2), &ok(json!("gen"), json!(10)));
    assert_eq!(got[3]["status"], 204, "{}", got[3]);
    assert_eq!(got[3]["body"], "", "{}", got[3]);
    assert_eq!(got[4]["status"], 200, "{}", got[4]);
    assert_eq!(got[4]["body"], r#"{"status":"ok"}"#, "{}", got[4]);
    server.stop();
}

// ---------------------------------------------------------------------------------------
// 7. Status codes for what is not JSON-RPC
// ---------------------------------------------------------------------------------------

/// (name, request, status, `Allow`, whether the connection stays usable)
type StatusCase = (&'static str, Vec<u8>, u16, Option<&'static str>, bool);

#[test]
fn http_error_statuses() {
    let server = Running::start(Setup::default().max_request_bytes(1024));
    let call = r#"{"jsonrpc":"2.0","method":"ping","id":1}"#;
    let big = "y".repeat(2000);
    let big_call = format!(r#"{{"jsonrpc":"2.0","method":"echo","params":["{big}"],"id":1}}"#);
    let huge_header = format!("X-Pad: {}\r\n", "z".repeat(10 * 1024));
    let many_headers: String = (0..100).map(|i| format!("X-H{i}: v\r\n")).collect();
    let cases: Vec<StatusCase> = vec![
        ("404 wrong path", replace_first_line(&post(call), "POST /nope HTTP/1.1"), 404, None, true),
        ("404 GET elsewhere", b"GET /nope HTTP/1.1\r\nHost: t\r\n\r\n".to_vec(), 404, None, true),
        ("405 GET /", b"GET / HTTP/1.1\r\nHost: t\r\n\r\n".to_vec(), 405, Some("POST"), true),
        ("405 PUT /", replace_first_line(&post(call), "PUT / HTTP/1.1"), 405, Some("POST"), true),
        ("405 POST /health", replace_first_line(&post(call), "POST /health HTTP/1.1"), 405, Some("GET, HEAD"), true),
        (
            "415 text/plain",
            format!(
                "POST / HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{call}",
                call.len()
            )
            .into_bytes(),
            415,
            None,
            true,
        ),
        ("411 no length", b"POST / HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\r\n".to_vec(), 411, None, true),
        ("413 Content-Length over the limit", post(&big_call), 413, None, false),
        ("413 chunked over the limit", post_chunked(big_call.as_bytes(), 300), 413, None, false),
        ("431 huge header", post_with(&huge_header, call), 431, None, false),
        ("431 too many headers", post_with(&many_headers, call), 431, None, false),
        ("400 garbage request line", b"this is not http at all\r\n\r\n".to_vec(), 400, None, false),
        ("400 binary garbage", b"\x00\x01\x02\xff\r\n\r\n".to_vec(), 400, None, false),
        ("400 no Host", format!("POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n{call}", call.len()).into_bytes(), 400, None, false),
        (
            "400 Content-Length and chunked",
            post_with("Transfer-Encoding: chunked\r\n", call),
            400,
            None,
            false,
        ),
        (
            "400 bad chunk size",
            b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n".to_vec(),
            400,
            None,
            false,
        ),
        (
            "501 gzip, chunked",
            b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n".to_vec(),
            501,
            None,
            false,
        ),
        ("505 HTTP/2.0", replace_first_line(&post(call), "POST / HTTP/2.0"), 505, None, false),
    ];
    for (name, req, status, allow, usable) in cases {
        let mut c = server.client();
        let r = c.call(&req);
        assert_eq!(r.status, status, "{name}: {r}");
        assert_eq!(r.header("Allow"), allow, "{name}: {r}");
        assert!(
            r.header("Content-Type")
                .is_some_and(|t| t.starts_with("text/plain")),
            "{name}: {r}"
        );
        if usable {
            // The refused request's body was skipped: the next one on the connection works.
            assert_eq!(r.header("Connection"), Some("keep-alive"), "{name}: {r}");
            check_one(&c.call(&ping(2)).rpc(), &ok(json!(2), json!("pong")));
        } else {
            assert_eq!(r.header("Connection"), Some("close"), "{name}: {r}");
            c.assert_closed();
        }
        // Another client is served normally.
        let r = server.client().call(&ping(3));
        check_one(&r.rpc(), &ok(json!(3), json!("pong")));
    }
    // Accepted variants: no Content-Type, a parameter, odd case, a query string, an
    // absolute-form target, a body at exactly the limit.
    let exact = format!(
        r#"{{"jsonrpc":"2.0","method":"echo","params":["{}"],"id":1}}"#,
        "q".repeat(1024 - 54)
    );
    assert_eq!(exact.len(), 1024);
    let accepted: Vec<Vec<u8>> = vec![
        format!("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{call}", call.len()).into_bytes(),
        format!(
            "POST / HTTP/1.1\r\nHost: t\r\ncontent-type: Application/JSON; charset=utf-8\r\ncontent-length: {}\r\n\r\n{call}",
            call.len()
        )
        .into_bytes(),
        replace_first_line(&post(call), "POST /?x=1 HTTP/1.1"),
        replace_first_line(&post(call), "POST http://test/ HTTP/1.1"),
    ];
    let mut c = server.client();
    for req in accepted {
        check_one(&c.call(&req).rpc(), &ok(json!(1), json!("pong")));
    }
    let r = c.call(&post(&exact)).rpc();
    assert_eq!(r["id"], 1, "{r}");
    assert!(r.get("result").is_some(), "{r}");
    server.stop();
}

// ---------------------------------------------------------------------------------------
// 7b. Headers real clients rely on: Date, Keep-Alive, content types and codings, CORS,
//     HTTP/1.x versions
// ---------------------------------------------------------------------------------------

/// The `Date` header of `r`, checked to be an IMF-fixdate within a few seconds of now.
fn assert_dated(r: &Resp, what: &str) {
    let date = r
        .header("Date")
        .unwrap_or_else(|| panic!("{what}: no Date header: {r}"));
    let at = httpdate::parse_http_date(date)
        .unwrap_or_else(|e| panic!("{what}: Date {date:?} is not an HTTP date: {e}"));
    assert_eq!(httpdate::fmt_http_date(at), date, "{what}: not IMF-fixdate");
    let now = std::time::SystemTime::now();
    let skew = now.duration_since(at).unwrap_or_else(|e| e.duration());
    assert!(
        skew < Duration::from_secs(5),
        "{what}: Date {date} is {skew:?} off"
    );
}

#[test]
fn every_response_has_a_date_and_keep_alive_says_the_idle_timeout() {
    let server = Running::start(Setup::default().idle_timeout(Some(Duration::from_millis(7900))));
    let mut c = server.client();
    let kinds: Vec<(&str, Vec<u8>, u16)> = vec![
        ("200 rpc", ping(1), 200),
        (
            "204 notification",
            post(r#"{"jsonrpc":"2.0","method":"update","params":[1]}"#),
            204,
        ),
        (
            "200 health",
            b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n".to_vec(),
            200,
        ),
        (
            "404",
            b"GET /nope HTTP/1.1\r\nHost: t\r\n\r\n".to_vec(),
            404,
        ),
        ("415", post_with("Content-Encoding: gzip\r\n", "{}"), 415),
        ("pool call", post(&sleep_call(1, 2)), 200),
    ];
    for (what, req, status) in kinds {
        let r = c.call(&req);
        assert_eq!(r.status, status, "{what}: {r}");
        assert_dated(&r, what);
        assert_eq!(r.header("Connection"), Some("keep-alive"), "{what}: {r}");
        // 7.9 s, rounded down.
        assert_eq!(r.header("Keep-Alive"), Some("timeout=7"), "{what}: {r}");
    }
    // A response that closes says so, with a Date and no Keep-Alive.
    let r = c.call(&post_with(
        "Connection: close\r\n",
        r#"{"jsonrpc":"2.0","method":"ping","id":3}"#,
    ));
    assert_dated(&r, "close");
    assert_eq!(r.header("Connection"), Some("close"), "{r}");
    assert_eq!(r.header("Keep-Alive"), None, "{r}");
    c.assert_closed();
    server.stop();
    // No idle timeout: no Keep-Alive line, still a Date.
    let server = Running::start(Setup::default().idle_timeout(None));
    let r = server.client().call(&ping(1));
    assert_dated(&r, "no idle timeout");
    assert_eq!(r.header("Keep-Alive"), None, "{r}");
    server.stop();
}

#[test]
fn node_stops_reusing_a_connection_the_server_is_about_to_close() {
    // Node's keep-alive agent reads `Keep-Alive: timeout=N` and keeps a socket at most
    // N - 1 s, so that it never sends on a socket the server is closing (axios got
    // ECONNRESET on reuse without it). For N = 1 it keeps none: the second call, 300 ms
    // later, opens a new connection. Without the header Node would reuse the socket.
    let Some(node) = ["node", "nodejs"].into_iter().find(|n| {
        Command::new(n)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    }) else {
        panic!("this test needs node on the PATH (Debian/Ubuntu: apt-get install -y nodejs)");
    };
    for (idle_ms, hint, reused) in [(1500, "timeout=1", false), (30_000, "timeout=30", true)] {
        let server =
            Running::start(Setup::default().idle_timeout(Some(Duration::from_millis(idle_ms))));
        let out = Command::new(node)
            .args(["-e", NODE_KEEP_ALIVE])
            .arg(format!("http://{}/", server.http))
            .arg("300")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "node failed: {stderr}");
        let got: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}; stderr: {stderr}", show(&out.stdout)));
        assert_eq!(got[0]["status"], 200, "{got}");
        assert_eq!(got[0]["keepAlive"], hint, "{got}");
        assert_eq!(got[1]["status"], 200, "{got}");
        assert_eq!(got[1]["reused"], reused, "idle timeout {idle_ms} ms: {got}");
        server.stop();
    }
}

/// Two calls through one keep-alive `http.Agent`, `argv[2]` ms apart; prints what each
/// got (status, whether the socket was reused, the Keep-Alive header) or its error.
const NODE_KEEP_ALIVE: &str = r#"
const http = require('http');
const [url, waitMs] = [process.argv[1], Number(process.argv[2])];
const agent = new http.Agent({ keepAlive: true });
const body = JSON.stringify({ jsonrpc: '2.0', method: 'ping', id: 1 });
const call = () => new Promise((resolve) => {
  const req = http.request(url, { method: 'POST', agent, headers: { 'Content-Type': 'application/json' } }, (res) => {
    res.resume();
    res.on('end', () => resolve({ status: res.statusCode, reused: req.reusedSocket, keepAlive: res.headers['keep-alive'] || null }));
  });
  req.on('error', (e) => resolve({ error: e.code || String(e) }));
  req.end(body);
});
(async () => {
  const first = await call();
  await new Promise((r) => setTimeout(r, waitMs));
  const second = await call();
  console.log(JSON.stringify([first, second]));
  agent.destroy();
})();
"#;

#[test]
fn json_rpc_content_types_and_codings() {
    let server = Running::start(Setup::default());
    let call = r#"{"jsonrpc":"2.0","method":"ping","id":1}"#;
    let with_type = |t: &str| {
        format!(
            "POST / HTTP/1.1\r\nHost: t\r\nContent-Type: {t}\r\nContent-Length: {}\r\n\r\n{call}",
            call.len()
        )
        .into_bytes()
    };
    let mut c = server.client();
    for t in [
        "application/json",
        "application/json-rpc",
        "application/jsonrequest",
        "application/json-rpc; charset=utf-8",
        "APPLICATION/JSONREQUEST",
    ] {
        check_one(&c.call(&with_type(t)).rpc(), &ok(json!(1), json!("pong")));
    }
    for t in [
        "application/x-www-form-urlencoded",
        "text/plain",
        "application/json-patch+json",
    ] {
        let r = c.call(&with_type(t));
        assert_eq!(r.status, 415, "{t}: {r}");
        assert_eq!(r.header("Connection"), Some("keep-alive"), "{t}: {r}");
        assert_eq!(
            String::from_utf8_lossy(&r.body),
            "Unsupported Media Type: Content-Type must be application/json \
             (or application/json-rpc, application/jsonrequest)\n",
            "{t}"
        );
    }
    // A gzip body (real gzip bytes of `call`) is refused with what the server accepts,
    // and the connection goes on.
    let gz = gzip(call.as_bytes());
    let mut req = format!(
        "POST / HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Length: {}\r\n\r\n",
        gz.len()
    )
    .into_bytes();
    req.extend_from_slice(&gz);
    let r = c.call(&req);
    assert_eq!(r.status, 415, "{r}");
    assert_eq!(r.header("Accept-Encoding"), Some("identity"), "{r}");
    assert_eq!(r.header("Connection"), Some("keep-alive"), "{r}");
    let r = c.call(&post_with("Content-Encoding: identity\r\n", call));
    check_one(&r.rpc(), &ok(json!(1), json!("pong")));
    server.stop();
}

/// `data` gzip-compressed by the system's `gzip`.
fn gzip(data: &[u8]) -> Vec<u8> {
    let mut child = Command::new("gzip")
        .arg("-c")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("this test needs gzip on the PATH");
    child.stdin.take().unwrap().write_all(data).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success() && out.stdout.starts_with(&[0x1f, 0x8b]));
    out.stdout
}

/// What a browser sends before a cross-origin POST with `Content-Type: application/json`.
fn preflight(origin: &str) -> Vec<u8> {
    format!(
        "OPTIONS / HTTP/1.1\r\nHost: t\r\nAccept: */*\r\nAccess-Control-Request-Method: POST\r\n\
         Access-Control-Request-Headers: content-type\r\nOrigin: {origin}\r\n\
         User-Agent: Mozilla/5.0\r\nSec-Fetch-Mode: cors\r\nSec-Fetch-Site: cross-site\r\n\r\n"
    )
    .into_bytes()
}

#[test]
fn cors_preflight_and_allowed_origins() {
    let app = "http://app.example:8080";
    let server = Running::start(
        Setup::default()
            .cors_origin(app)
            .cors_origin("https://other.example"),
    );
    let mut c = server.client();
    let r = c.call(&preflight(app));
    assert_eq!(r.status, 204, "{r}");
    assert_eq!(r.header("Access-Control-Allow-Origin"), Some(app), "{r}");
    assert_eq!(
        r.header("Access-Control-Allow-Methods"),
        Some("POST, OPTIONS"),
        "{r}"
    );
    assert_eq!(
        r.header("Access-Control-Allow-Headers"),
        Some(
            "Content-Type, Authorization, Idempotency-Key, RPC-Timeout-Ms, traceparent, tracestate"
        ),
        "{r}"
    );
    assert_eq!(r.header("Access-Control-Max-Age"), Some("7200"), "{r}");
    assert_eq!(r.header("Vary"), Some("Origin"), "{r}");
    assert_dated(&r, "preflight");
    // The POST that follows, and its errors, carry the origin too.
    let r = c.call(&post_with(
        &format!("Origin: {app}\r\n"),
        r#"{"jsonrpc":"2.0","method":"ping","id":1}"#,
    ));
    check_one(&r.rpc(), &ok(json!(1), json!("pong")));
    assert_eq!(r.header("Access-Control-Allow-Origin"), Some(app), "{r}");
    let r = c.call(&post_with(
        &format!("Origin: {app}\r\n"),
        r#"{"jsonrpc":"2.0","method":"update"}"#,
    ));
    r.no_content();
    assert_eq!(r.header("Access-Control-Allow-Origin"), Some(app), "{r}");
    let r = c.call(&post_with(
        &format!("Origin: {app}\r\nContent-Encoding: br\r\n"),
        "{}",
    ));
    assert_eq!(r.status, 415, "{r}");
    assert_eq!(r.header("Access-Control-Allow-Origin"), Some(app), "{r}");
    // The second listed origin is echoed as itself.
    let r = c.call(&preflight("https://other.example"));
    assert_eq!(
        r.header("Access-Control-Allow-Origin"),
        Some("https://other.example"),
        "{r}"
    );
    // Another origin: the preflight is refused and answers carry no CORS headers, so the
    // browser keeps the page from reading them.
    for origin in [
        "http://evil.example",
        "http://app.example:8081",
        "http://app.example:8080/",
    ] {
        let r = c.call(&preflight(origin));
        assert_eq!(r.status, 403, "{origin}: {r}");
        assert_eq!(
            r.header("Access-Control-Allow-Origin"),
            None,
            "{origin}: {r}"
        );
        let r = c.call(&post_with(
            &format!("Origin: {origin}\r\n"),
            r#"{"jsonrpc":"2.0","method":"ping","id":2}"#,
        ));
        check_one(&r.rpc(), &ok(json!(2), json!("pong")));
        assert_eq!(
            r.header("Access-Control-Allow-Origin"),
            None,
            "{origin}: {r}"
        );
    }
    // Other methods on the path now list OPTIONS.
    let r = c.call(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(
        (r.status, r.header("Allow")),
        (405, Some("POST, OPTIONS")),
        "{r}"
    );
    server.stop();

    // `*`: any origin.
    let server = Running::start(Setup::default().cors_origin("*"));
    let mut c = server.client();
    let r = c.call(&preflight("http://anywhere.example"));
    assert_eq!(r.status, 204, "{r}");
    assert_eq!(r.header("Access-Control-Allow-Origin"), Some("*"), "{r}");
    assert_eq!(r.header("Vary"), None, "{r}");
    server.stop();

    // Without the flag nothing changes: OPTIONS is 405, no CORS headers anywhere.
    let server = Running::start(Setup::default());
    let mut c = server.client();
    let r = c.call(&preflight(app));
    assert_eq!((r.status, r.header("Allow")), (405, Some("POST")), "{r}");
    let r = c.call(&post_with(
        &format!("Origin: {app}\r\n"),
        r#"{"jsonrpc":"2.0","method":"ping","id":1}"#,
    ));
    check_one(&r.rpc(), &ok(json!(1), json!("pong")));
    assert!(
        !r.headers
            .iter()
            .any(|(n, _)| n.starts_with("Access-Control")),
        "{r}"
    );
    server.stop();

    // An origin that would break a header line is refused when the server starts.
    let server = Server::with_config(
        demo::engine(Config::default()),
        ServerConfig::default().cors_origin("http://a\r\nX: 1"),
    )
    .and_then(|mut s| {
        s.listen_http("127.0.0.1:0")?;
        s.run()
    });
    let err = server.expect_err("a CORS origin with CR LF");
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
}

#[test]
fn other_http_1_minor_versions_are_served_as_1_1() {
    let server = Running::start(Setup::default());
    let mut c = server.client();
    for version in ["HTTP/1.2", "HTTP/1.9"] {
        let r = c.call(&replace_first_line(&ping(1), &format!("POST / {version}")));
        check_one(&r.rpc(), &ok(json!(1), json!("pong")));
        assert_eq!(r.header("Connection"), Some("keep-alive"), "{version}: {r}");
    }
    for version in ["HTTP/2.0", "HTTP/3.0", "HTTP/0.9"] {
        let mut c = server.client();
        let r = c.call(&replace_first_line(&ping(1), &format!("POST / {version}")));
        assert_eq!(r.status, 505, "{version}: {r}");
        c.assert_closed();
    }
    server.stop();
}

// ---------------------------------------------------------------------------------------
// 8. Response and batch limits
// ---------------------------------------------------------------------------------------

#[test]
fn oversized_response_and_long_batch() {
    let server = Running::start(Setup::default().max_response_bytes(256).max_batch_len(4));
    let big = "x".repeat(1000);
    let echo =
        |id: &str| format!(r#"{{"jsonrpc":"2.0","method":"echo","params":["{big}"],"id":{id}}}"#);
    let mut c = server.client();
    let r = c.call(&post(&echo("1"))).rpc();
    check_one(&r, &err(json!(1), -32002));
    // In a batch: that element only.
    let batch = format!(
        r#"[{},{{"jsonrpc":"2.0","method":"ping","id":2}}]"#,
        echo("1")
    );
    let r = c.call(&post(&batch)).rpc();
    check_batch(&r, &[err(json!(1), -32002), ok(json!(2), json!("pong"))]);
    // A small echo still fits.
    let r = c
        .call(&post(
            r#"{"jsonrpc":"2.0","method":"echo","params":["small"],"id":3}"#,
        ))
        .rpc();
    check_one(&r, &ok(json!(3), json!(["small"])));
    // Five elements with max_batch_len 4: one -32600 naming the limit, none run.
    let five: Vec<String> = (0..5)
        .map(|i| format!(r#"{{"jsonrpc":"2.0","method":"ping","id":{i}}}"#))
        .collect();
    let r = c.call(&post(&format!("[{}]", five.join(",")))).rpc();
    check_one(&r, &err(Value::Null, -32600));
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains('4'),
        "the message should name the limit: {msg}"
    );
    // Four is fine.
    let r = c.call(&post(&format!("[{}]", five[..4].join(",")))).rpc();
    assert_eq!(r.as_array().unwrap().len(), 4, "{r}");
    server.stop();
}

// ---------------------------------------------------------------------------------------
// 9. Slow clients do not hold others up
// ---------------------------------------------------------------------------------------

#[test]
fn slowloris_does_not_block_other_clients() {
    let server = Running::start(Setup::default());
    let started = Arc::new(AtomicUsize::new(0));
    let slow_done = Arc::new(AtomicBool::new(false));
    let fast_done = Arc::new(AtomicBool::new(false));
    let call = r#"{"jsonrpc":"2.0","method":"add","params":[1,1],"id":"slow"}"#;
    // Three slow clients: one trickles its head, one its body, one a chunked body; each
    // sends one byte every 50 ms (for at least a second, until the fast client is done,
    // or until only its last byte is left: seconds), then the rest.
    let chunked_req = post_chunked(call.as_bytes(), 4);
    let slow_inputs: Vec<(Vec<u8>, usize)> = vec![
        (post(call), 0),
        (post(call), head_len(&post(call))),
        (chunked_req.clone(), head_len(&chunked_req) + 10),
    ];
    let slow: Vec<JoinHandle<()>> = slow_inputs
        .into_iter()
        .map(|(req, from)| {
            let addr = server.http;
            let (started, slow_done, fast_done) = (
                Arc::clone(&started),
                Arc::clone(&slow_done),
                Arc::clone(&fast_done),
            );
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                c.send(&req[..from]);
                let mut at = from;
                while at + 1 < req.len() && (at < from + 20 || !fast_done.load(Ordering::SeqCst)) {
                    c.send(&req[at..=at]);
                    if at == from {
                        started.fetch_add(1, Ordering::SeqCst);
                    }
                    at += 1;
                    std::thread::sleep(Duration::from_millis(50));
                }
                if !fast_done.load(Ordering::SeqCst) {
                    slow_done.store(true, Ordering::SeqCst);
                }
                c.send(&req[at..]);
                check_one(&c.read().rpc(), &ok(json!("slow"), json!(2)));
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    while started.load(Ordering::SeqCst) < 3 {
        assert!(Instant::now() < deadline, "slow clients did not start");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Meanwhile: 100 requests, each waiting for its answer, half on one keep-alive
    // connection, half on connections of their own.
    let mut c = server.client();
    for i in 0..50 {
        check_one(&c.call(&ping(i)).rpc(), &ok(json!(i), json!("pong")));
    }
    for i in 50..100 {
        let r = server.client().call(&ping(i));
        check_one(&r.rpc(), &ok(json!(i), json!("pong")));
    }
    fast_done.store(true, Ordering::SeqCst);
    assert!(
        !slow_done.load(Ordering::SeqCst),
        "the fast client finished only after a slow client had sent its last trickled byte"
    );
    for t in slow {
        t.join().unwrap();
    }
    server.stop();
}

// ---------------------------------------------------------------------------------------
// 10. Clients that vanish
// ---------------------------------------------------------------------------------------

#[test]
fn vanishing_clients_leave_the_server_serving() {
    let server = Running::start(Setup::default().workers(2));
    let call = r#"{"jsonrpc":"2.0","method":"ping","id":1}"#;
    let full = post(call);
    let head = head_len(&full);
    let chunked_req = post_chunked(call.as_bytes(), 8);
    let sleeps: Vec<String> = (1..=4).map(|i| sleep_call(150, i)).collect();
    let blocking_batch = post(&format!(
        r#"[{},{{"jsonrpc":"2.0","method":"ping","id":5}}]"#,
        sleeps.join(",")
    ));
    let mut pipelined = post(&sleep_call(150, 1));
    pipelined.extend(ping(2));
    pipelined.extend(post(&sleep_call(100, 3)));
    let partials: Vec<(&str, Vec<u8>)> = vec![
        ("half a head", full[..head / 2].to_vec()),
        (
            "a head and half a body",
            full[..head + call.len() / 2].to_vec(),
        ),
        (
            "mid-chunked",
            chunked_req[..chunked_req.len() - 20].to_vec(),
        ),
        ("a batch with blocking elements", blocking_batch),
        ("pipelined blocking calls", pipelined),
    ];
    let mut other = server.client();
    for (i, (name, bytes)) in partials.iter().enumerate() {
        for rst in [false, true] {
            let mut s = TcpStream::connect(server.http).unwrap();
            s.write_all(bytes).unwrap();
            // Give the server time to read it, so work is in flight when the peer goes.
            std::thread::sleep(Duration::from_millis(10));
            if rst {
                reset(s);
            } else {
                drop(s);
            }
            // Another client is still served at once.
            let id = i * 2 + usize::from(rst);
            let r = other.call(&ping(id));
            assert!(
                matches(&r.rpc(), &ok(json!(id), json!("pong"))),
                "after {name} (reset: {rst}): {r}"
            );
        }
    }
    // A fresh connection (likely in a vanished one's slot) gets its own answers only,
    // while the vanished connections' blocking calls finish.
    let mut c = server.client();
    c.send(&post(&sleep_call(200, "\"mine\"")));
    c.send(&ping("\"next\""));
    check_one(&c.read().rpc(), &ok(json!("mine"), Value::Null));
    check_one(&c.read().rpc(), &ok(json!("next"), json!("pong")));
    // Everything in flight is done by now; nothing stray arrives.
    std::thread::sleep(Duration::from_millis(100));
    check_one(
        &c.call(&ping("\"last\"")).rpc(),
        &ok(json!("last"), json!("pong")),
    );
    check_one(
        &server.client().call(&ping(0)).rpc(),
        &ok(json!(0), json!("pong")),
    );
    server.stop();
}

// ---------------------------------------------------------------------------------------
// 11. Many connections, many pipelined requests
// ---------------------------------------------------------------------------------------

#[test]
fn many_connections_newline_tcp() {
    const THREADS: usize = 20;
    const CONNS: usize = 10;
    const REQS: usize = 100;
    let server = Running::start(Setup::default());
    let seen = Arc::new(Mutex::new(Vec::with_capacity(THREADS * CONNS * REQS)));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let addr = server.tcp;
            let seen = Arc::clone(&seen);
            std::thread::spawn(move || {
                let mut conns = Vec::new();
                for k in 0..CONNS {
                    let c = t * CONNS + k;
                    let s = TcpStream::connect(addr).unwrap();
                    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
                    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
                    let mut req = String::new();
                    for i in 0..REQS {
                        let id = c * REQS + i;
                        req.push_str(&format!(
                            "{{\"jsonrpc\":\"2.0\",\"method\":\"add\",\"params\":[{c},{i}],\"id\":{id}}}\n"
                        ));
                    }
                    (&s).write_all(req.as_bytes()).unwrap();
                    conns.push((c, BufReader::new(s)));
                }
                let mut ids = Vec::with_capacity(CONNS * REQS);
                for (c, r) in &mut conns {
                    for i in 0..REQS {
                        let mut line = String::new();
                        r.read_line(&mut line).unwrap();
                        let v: Value = serde_json::from_str(&line)
                            .unwrap_or_else(|e| panic!("{e}: {line:?}"));
                        assert_eq!(v["id"], *c * REQS + i, "answers out of order: {v}");
                        assert_eq!(v["result"], *c + i, "{v}");
                        ids.push(v["id"].as_u64().unwrap());
                    }
                }
                seen.lock().unwrap().extend(ids);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut seen = std::mem::take(&mut *seen.lock().unwrap());
    seen.sort_unstable();
    let want: Vec<u64> = (0..(THREADS * CONNS * REQS) as u64).collect();
    assert!(seen == want, "every id must be answered exactly once");
    server.stop();
}

#[test]
fn many_connections_http_pipelined() {
    const THREADS: usize = 10;
    const CONNS: usize = 5;
    const REQS: usize = 20;
    let server = Running::start(Setup::default().workers(2));
    let seen = Arc::new(Mutex::new(HashMap::<u64, usize>::new()));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let addr = server.http;
            let seen = Arc::clone(&seen);
            std::thread::spawn(move || {
                let mut conns = Vec::new();
                for k in 0..CONNS {
                    let c = t * CONNS + k;
                    let mut client = Client::connect(addr);
                    let mut req = Vec::new();
                    for i in 0..REQS {
                        let id = c * REQS + i;
                        if i == REQS / 2 {
                            req.extend(post(&sleep_call(5, id)));
                        } else {
                            req.extend(post(&format!(
                                r#"{{"jsonrpc":"2.0","method":"add","params":[{c},{i}],"id":{id}}}"#
                            )));
                        }
                    }
                    client.send(&req);
                    conns.push((c, client));
                }
                let mut ids = Vec::new();
                for (c, client) in &mut conns {
                    for i in 0..REQS {
                        let v = client.read().rpc();
                        assert_eq!(v["id"], *c * REQS + i, "answers out of order: {v}");
                        if i != REQS / 2 {
                            assert_eq!(v["result"], *c + i, "{v}");
                        }
                        ids.push(v["id"].as_u64().unwrap());
                    }
                }
                let mut seen = seen.lock().unwrap();
                for id in ids {
                    *seen.entry(id).or_default() += 1;
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), THREADS * CONNS * REQS);
    assert!(seen.values().all(|&n| n == 1), "an id was answered twice");
    drop(seen);
    server.stop();
}

// ---------------------------------------------------------------------------------------
// 12. Graceful shutdown
// ---------------------------------------------------------------------------------------

#[test]
fn graceful_shutdown_answers_blocking_call_in_flight() {
    let mut server = Running::start(Setup::default().workers(2));
    let mut c = server.client();
    // The server is reading this connection.
    check_one(&c.call(&ping(0)).rpc(), &ok(json!(0), json!("pong")));
    // Bystanders: an idle keep-alive connection, one halfway through a head, one
    // halfway through a chunked body. They must not hold the shutdown up.
    let mut idle = server.client();
    check_one(&idle.call(&ping(9)).rpc(), &ok(json!(9), json!("pong")));
    let mut half_head = server.client();
    half_head.send(b"POST / HTTP/1.1\r\nHost: te");
    let mut half_chunked = server.client();
    let chunked_req = post_chunked(br#"{"jsonrpc":"2.0","method":"ping","id":1}"#, 8);
    half_chunked.send(&chunked_req[..chunked_req.len() - 30]);

    let mut reqs = post(&sleep_call(800, 1));
    reqs.extend(ping(2));
    c.send(&reqs);
    // Read by then, on a loaded machine too (a request not read when the shutdown
    // begins is never read); the sleep still runs.
    std::thread::sleep(Duration::from_millis(300));
    server.handle.shutdown();
    // run() returns only after the answers were written: they are all in our socket
    // buffer once it has returned (a connection dropped unanswered would read EOF).
    server.join();
    let r = c.read();
    check_one(&r.rpc(), &ok(json!(1), Value::Null));
    assert_eq!(r.header("Connection"), Some("keep-alive"), "{r}");
    // The last answer tells the client not to send more on this connection.
    let r = c.read();
    check_one(&r.rpc(), &ok(json!(2), json!("pong")));
    assert_eq!(r.header("Connection"), Some("close"), "{r}");
    c.assert_closed();
    idle.assert_closed();
    half_head.assert_closed();
    half_chunked.assert_closed();
}

#[test]
fn request_timeout_over_http() {
    let server = Running::start(
        Setup::default()
            .workers(1)
            .request_timeout(Some(Duration::from_millis(150))),
    );
    let mut c = server.client();
    let mut reqs = post(&sleep_call(600, 1));
    reqs.extend(ping(2));
    c.send(&reqs);
    let r = c.read().rpc();
    check_one(&r, &err(json!(1), -32001));
    check_one(&c.read().rpc(), &ok(json!(2), json!("pong")));
    // The late result is dropped: nothing stray on the connection once it finishes
    // (well past it: the one worker must be free again for the call with a budget).
    std::thread::sleep(Duration::from_millis(1000));
    check_one(&c.call(&ping(3)).rpc(), &ok(json!(3), json!("pong")));
    check_one(
        &c.call(&post(&sleep_call(1, 4))).rpc(),
        &ok(json!(4), Value::Null),
    );
    server.stop();
}

#[test]
fn large_pipelined_responses_to_a_slow_reader() {
    // A small high-water mark: the server stops reading while answers pile up unsent.
    let server = Running::start(Setup::default().write_high_water(64 * 1024));
    const N: usize = 20;
    let pad = "p".repeat(200 * 1024);
    let mut c = server.client();
    let mut reqs = Vec::new();
    for i in 0..N {
        reqs.extend(post(&format!(
            r#"{{"jsonrpc":"2.0","method":"echo","params":["{pad}"],"id":{i}}}"#
        )));
    }
    // Written from another thread: the server may stop reading before it has it all.
    let mut w = c.s.try_clone().unwrap();
    let writer = std::thread::spawn(move || w.write_all(&reqs).unwrap());
    std::thread::sleep(Duration::from_millis(300));
    for i in 0..N {
        let r = c.read().rpc();
        assert_eq!(r["id"], i, "answers out of order");
        assert_eq!(r["result"][0].as_str().map(str::len), Some(pad.len()));
    }
    writer.join().unwrap();
    check_one(&c.call(&ping(1)).rpc(), &ok(json!(1), json!("pong")));
    server.stop();
}

/// RFC 9110 §9.3.2 / RFC 9112 §6.3: a response to HEAD carries no content.
#[test]
fn head_request_gets_no_body() {
    let server = Running::start(Setup::default());
    for target in ["/health", "/"] {
        let mut c = server.client();
        c.send(format!("HEAD {target} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes());
        // Read the head only; whatever follows must be the next response.
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            assert_eq!(c.s.read(&mut byte).unwrap(), 1, "closed mid-head");
            head.push(byte[0]);
        }
        let text = String::from_utf8_lossy(&head);
        assert!(
            text.starts_with("HTTP/1.1 200") || text.starts_with("HTTP/1.1 405"),
            "{text}"
        );
        let r = c.call(&ping(1));
        check_one(&r.rpc(), &ok(json!(1), json!("pong")));
    }
    server.stop();
}

// ---------------------------------------------------------------------------------------
// 13. A panicking handler
// ---------------------------------------------------------------------------------------

#[test]
fn handler_panic_is_an_internal_error() {
    let mut b = demo::builder();
    b.method("boom", |_p: Params<'_>| -> Result<(), RpcError> {
        panic!("boom (expected by the test)")
    })
    .unwrap()
    .blocking_method("boom_blocking", |_p: Params<'_>| -> Result<(), RpcError> {
        panic!("boom on the pool (expected by the test)")
    })
    .unwrap();
    let server = Running::with_engine(
        Engine::new(b.freeze(), Config::default()),
        ServerConfig::default().workers(2),
    );
    let mut c = server.client();
    let r = c
        .call(&post(r#"{"jsonrpc":"2.0","method":"boom","id":1}"#))
        .rpc();
    check_one(&r, &err(json!(1), -32603));
    check_one(&c.call(&ping(2)).rpc(), &ok(json!(2), json!("pong")));
    let r = c
        .call(&post(
            r#"{"jsonrpc":"2.0","method":"boom_blocking","id":3}"#,
        ))
        .rpc();
    check_one(&r, &err(json!(3), -32603));
    let r = c
        .call(&post(
            r#"[{"jsonrpc":"2.0","method":"boom","id":"a"},{"jsonrpc":"2.0","method":"boom_blocking","id":"b"},{"jsonrpc":"2.0","method":"ping","id":"c"}]"#,
        ))
        .rpc();
    check_batch(
        &r,
        &[
            err(json!("a"), -32603),
            err(json!("b"), -32603),
            ok(json!("c"), json!("pong")),
        ],
    );
    // A panicking notification: nothing to answer.
    c.call(&post(r#"{"jsonrpc":"2.0","method":"boom"}"#))
        .no_content();
    // The server, and the worker pool, keep serving.
    check_one(
        &c.call(&post(&sleep_call(1, 4))).rpc(),
        &ok(json!(4), Value::Null),
    );
    check_one(
        &server.client().call(&ping(5)).rpc(),
        &ok(json!(5), json!("pong")),
    );
    server.stop();
}

/// Writes `first`, then as many 64 KiB `echo` requests as the connection takes without
/// reading an answer, until a write blocks for 300 ms, `limit` bytes or 3.5 s. Returns
/// the bytes written after `first`, and resets the connection.
fn flood(addr: SocketAddr, http: bool, first: &str, limit: usize) -> usize {
    let frame = |body: &str| -> Vec<u8> {
        if http {
            post(body)
        } else {
            format!("{body}\n").into_bytes()
        }
    };
    let echo = format!(
        r#"{{"jsonrpc":"2.0","method":"echo","params":["{}"],"id":1}}"#,
        "e".repeat(64 * 1024)
    );
    let one = frame(&echo);
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_write_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    s.write_all(&frame(first)).unwrap();
    let deadline = Instant::now() + Duration::from_millis(3500);
    let mut written = 0;
    while written < limit && Instant::now() < deadline {
        match s.write(&one) {
            Ok(n) => written += n,
            // Blocked: the server stopped reading.
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
            Err(e) => panic!("write: {e}"),
        }
    }
    reset(s);
    written
}

/// Far more than the kernel's socket buffers on loopback hold (a client that stops
/// reading can write about 7 MiB of these requests into a correctly behaving server).
const FLOOD_LIMIT: usize = 24 << 20;

/// A client that sends requests and never reads its answers is stopped by TCP
/// backpressure once `write_high_water` of answers wait.
#[test]
fn high_water_mark_stops_reading_a_client_that_does_not_read() {
    let server = Running::start(Setup::default().write_high_water(64 * 1024));
    let first = r#"{"jsonrpc":"2.0","method":"ping","id":"p"}"#;
    for (http, addr) in [(true, server.http), (false, server.tcp)] {
        let written = flood(addr, http, first, FLOOD_LIMIT);
        assert!(
            written < FLOOD_LIMIT,
            "http {http}: wrote {} MiB without reading an answer",
            written >> 20
        );
    }
    check_one(
        &server.client().call(&ping(1)).rpc(),
        &ok(json!(1), json!("pong")),
    );
    server.stop();
}

/// docs/OPERATIONS.md: "No queue in the server is unbounded: per connection, reading
/// stops at the high-water mark". That must hold as well when the answers wait behind a
/// call on the worker pool.
#[test]
fn answers_behind_a_blocking_call_respect_the_high_water_mark() {
    let server = Running::start(Setup::default().write_high_water(64 * 1024));
    let sleep = sleep_call(4500, "\"s\"");
    for (http, addr) in [(true, server.http), (false, server.tcp)] {
        let written = flood(addr, http, &sleep, FLOOD_LIMIT);
        assert!(
            written < FLOOD_LIMIT,
            "http {http}: wrote {} MiB of requests behind a pending call without reading an answer",
            written >> 20
        );
    }
    server.stop();
}

/// A request whose answer is still being computed at shutdown is answered with
/// `Connection: close`.
#[test]
fn shutdown_closes_http_with_the_answer_in_flight() {
    let mut server = Running::start(Setup::default().workers(1));
    let mut c = server.client();
    c.send(&post(&sleep_call(800, 7)));
    // Read by then, on a loaded machine too; the sleep still runs.
    std::thread::sleep(Duration::from_millis(300));
    server.handle.shutdown();
    server.join();
    let r = c.read();
    check_one(&r.rpc(), &ok(json!(7), Value::Null));
    assert_eq!(r.header("Connection"), Some("close"), "{r}");
    c.assert_closed();
}

/// Small requests with large answers: one read holds many of them, and answering them
/// all at once would pile up output far past `write_high_water`. The server answers
/// until the mark, holds the rest in its read buffer, and goes on as the client reads.
#[test]
fn small_requests_with_large_answers_stop_at_the_high_water_mark() {
    const BLOB: usize = 1 << 20;
    const N: usize = 60;
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let mut b = demo::builder();
    b.method("blob", move |_p: Params<'_>| -> Result<String, RpcError> {
        counted.fetch_add(1, Ordering::SeqCst);
        Ok("b".repeat(BLOB))
    })
    .unwrap();
    let settings = ServerConfig::default().write_high_water(256 * 1024);
    let server = Running::with_engine(Engine::new(b.freeze(), Config::default()), settings);
    for http in [true, false] {
        calls.store(0, Ordering::SeqCst);
        let mut c = Client::connect(if http { server.http } else { server.tcp });
        let mut reqs = Vec::new();
        for i in 0..N {
            let body = format!(r#"{{"jsonrpc":"2.0","method":"blob","id":{i}}}"#);
            if http {
                reqs.extend(post(&body));
            } else {
                reqs.extend(body.bytes());
                reqs.push(b'\n');
            }
        }
        assert!(reqs.len() < 16 * 1024, "all requests fit in one read");
        c.send(&reqs);
        // Until the server stops answering (a debug build takes tens of ms per answer).
        let mut answered = 0;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            std::thread::sleep(Duration::from_millis(300));
            let now = calls.load(Ordering::SeqCst);
            if now == answered || now == N || Instant::now() > deadline {
                answered = now;
                break;
            }
            answered = now;
        }
        // What the mark allows, plus what the two sockets' kernel buffers took (a few
        // MiB): far from all N MiB.
        eprintln!("http {http}: {answered} answers computed before the client read");
        assert!(
            answered < N / 2,
            "http {http}: {answered} answers of 1 MiB computed for a client reading none"
        );
        // Reading, the client gets every answer, in order.
        let mut lines = BufReader::new(c.s.try_clone().unwrap());
        for i in 0..N {
            let v = if http {
                c.read().rpc()
            } else {
                let mut line = String::new();
                lines.read_line(&mut line).unwrap();
                check_reply(line.trim_end().as_bytes()).unwrap()
            };
            assert_eq!(v["id"], i, "http {http}");
            assert_eq!(
                v["result"].as_str().map(str::len),
                Some(BLOB),
                "http {http}"
            );
        }
        assert_eq!(calls.load(Ordering::SeqCst), N);
    }
    server.stop();
}

/// `max_response_bytes` bounds a batch's whole array also when its elements ran on the
/// worker pool: the element that would pass it is answered -32002, the others stand.
#[test]
fn pool_answers_in_a_batch_respect_max_response_bytes() {
    let mut b = demo::builder();
    b.blocking_method("big", |_p: Params<'_>| -> Result<String, RpcError> {
        Ok("x".repeat(1000))
    })
    .unwrap();
    let max = 2500;
    let config = Config::default().max_response_bytes(max);
    let server = Running::with_engine(
        Engine::new(b.freeze(), config),
        ServerConfig::default().workers(2),
    );
    let calls: Vec<String> = (1..=4)
        .map(|i| format!(r#"{{"jsonrpc":"2.0","method":"big","id":{i}}}"#))
        .collect();
    let r = server
        .client()
        .call(&post(&format!("[{}]", calls.join(","))));
    let v = r.rpc();
    let elems = v.as_array().unwrap_or_else(|| panic!("{r}"));
    let mut ids: Vec<i64> = elems.iter().filter_map(|e| e["id"].as_i64()).collect();
    ids.sort_unstable();
    assert_eq!(ids, [1, 2, 3, 4], "{r}");
    // Two results of ~1 KB fit in 2,500 bytes, a third does not.
    let results = elems.iter().filter(|e| e.get("result").is_some()).count();
    let too_large = elems
        .iter()
        .filter(|e| e["error"]["code"] == -32002)
        .count();
    assert_eq!((results, too_large), (2, 2), "{r}");
    assert!(r.body.len() <= max, "{} bytes: {r}", r.body.len());
    server.stop();
}

/// Calls that timed out while queued for the worker pool do not hold up shutdown:
/// 100 one-second calls on one worker are answered -32001 at their deadline, and the
/// server stops without running the queue out.
#[test]
fn shutdown_is_prompt_with_timed_out_calls_still_queued() {
    let mut server = Running::start(
        Setup::default()
            .workers(1)
            .queue_capacity(256)
            .request_timeout(Some(Duration::from_millis(100))),
    );
    let mut s = TcpStream::connect(server.tcp).unwrap();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let lines: String = (0..100)
        .map(|i| {
            format!(r#"{{"jsonrpc":"2.0","method":"sleep","params":{{"ms":1000}},"id":{i}}}"#)
                + "\n"
        })
        .collect();
    s.write_all(lines.as_bytes()).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    for i in 0..100 {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let v = check_reply(line.trim_end().as_bytes()).unwrap();
        assert_eq!(v["id"], i);
        assert_eq!(v["error"]["code"], -32001, "{v}");
    }
    server.handle.shutdown();
    // At most the one call a worker is inside (1 s) delays it; `join` allows 10 s, and
    // running the queue out would take 100 s.
    server.join();
}
