//! Calls answered later (`deferred_method` and its `Responder`), call contexts, the
//! fallback route and relayed errors, over real sockets.
//!
//! Every socket and client has a timeout and every server is stopped with a bounded
//! wait, so a hang fails the test instead of stalling it.

mod util;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ringrpc::client::{Client, Options};
use ringrpc::server::Server;
use ringrpc::{
    demo, Config, Engine, Params, Registry, RegistryBuilder, Responder, RpcError, ServerConfig,
};
use serde_json::{json, Value};
use util::check_reply;
use util::server::Served;

const IO_TIMEOUT: Duration = Duration::from_secs(20);

/// A server of `builder`'s methods under `config` and `settings`.
fn start_with(builder: RegistryBuilder, config: Config, settings: ServerConfig) -> Served {
    Served::start(Engine::new(builder.freeze(), config), settings)
}

/// As [`start_with`], with the default server settings.
fn start(builder: RegistryBuilder, config: Config) -> Served {
    start_with(builder, config, ServerConfig::default())
}

/// A client of `server` over `scheme` (`tcp`, `http` or `unix`).
fn client(server: &Served, scheme: &str) -> Client {
    let url = match scheme {
        "tcp" => format!("tcp://{}", server.tcp),
        "http" => format!("http://{}/", server.http),
        _ => format!("unix://{}", server.unix.display()),
    };
    Client::connect_with(&url, Options::default().timeout(IO_TIMEOUT)).unwrap()
}

/// A line-transport connection speaking raw JSON lines.
struct Lines {
    w: TcpStream,
    r: BufReader<TcpStream>,
}

impl Lines {
    fn connect(addr: SocketAddr) -> Self {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        Self {
            w: s.try_clone().unwrap(),
            r: BufReader::new(s),
        }
    }

    fn send(&mut self, line: &str) {
        self.w.write_all(line.as_bytes()).unwrap();
        self.w.write_all(b"\n").unwrap();
    }

    fn recv(&mut self) -> Value {
        let mut line = String::new();
        self.r.read_line(&mut line).unwrap();
        assert!(line.ends_with('\n'), "connection closed; got {line:?}");
        check_reply(line.trim_end().as_bytes()).unwrap_or_else(|e| panic!("{e}"))
    }
}

fn code(v: &Value) -> i64 {
    v["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("not an error: {v}"))
}

#[test]
fn a_thousand_delays_on_one_worker_take_one_delay_not_a_thousand() {
    // With `sleep` (a blocking method) on one worker these would take 100 s; `delay`
    // holds no thread while it waits.
    let server = start_with(
        demo::builder(),
        Config::default(),
        ServerConfig::default().workers(1),
    );
    for scheme in ["tcp", "http"] {
        let clients: Vec<Client> = (0..10).map(|_| client(&server, scheme)).collect();
        let started = Instant::now();
        let mut pending = Vec::new();
        for c in &clients {
            for _ in 0..100 {
                pending.push(c.start("delay", [100]).unwrap());
            }
        }
        for p in pending {
            let v: Value = p.wait().unwrap();
            assert_eq!(v, Value::Null);
        }
        let took = started.elapsed();
        eprintln!("{scheme}: 1000 x delay [100] answered in {took:?}");
        // Loose on purpose (a shared machine); serially they would take 100 s.
        assert!(took < Duration::from_secs(10), "{scheme}: {took:?}");
    }
    server.stop();
}

/// A registry with methods that keep their responders for the test to answer.
fn parking(parked: Arc<Mutex<Vec<(u64, Responder)>>>) -> RegistryBuilder {
    let mut b = demo::builder();
    let p = Arc::clone(&parked);
    b.deferred_method("park", move |_ctx, params, responder| {
        let [n]: [u64; 1] = match params.parse() {
            Ok(n) => n,
            Err(e) => return responder.error(e),
        };
        p.lock().unwrap().push((n, responder));
    })
    .unwrap()
    .deferred_method("drop_it", |_ctx, _params, responder| drop(responder))
    .unwrap()
    .deferred_method("panics", |_ctx, _params, _responder| panic!("boom"))
    .unwrap()
    .deferred_method("at_once", |_ctx, params, responder| {
        responder.respond_raw(params.raw_json().unwrap_or(b"null"))
    })
    .unwrap()
    .deferred_method("late", |_ctx, _params, responder| {
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(400));
            responder.respond(Ok("too late"));
        });
    })
    .unwrap();
    b
}

#[test]
fn responder_rules() {
    let parked = Arc::new(Mutex::new(Vec::new()));
    let config = Config::default().request_timeout(Some(Duration::from_millis(150)));
    let server = start(parking(Arc::clone(&parked)), config);
    let mut c = Lines::connect(server.tcp);

    // Dropped unanswered, or dropped by a panic: -32603 saying so; the server lives on.
    for method in ["drop_it", "panics"] {
        c.send(&format!(
            r#"{{"jsonrpc":"2.0","method":"{method}","id":"{method}"}}"#
        ));
        let v = c.recv();
        assert_eq!((code(&v), &v["id"]), (-32603, &json!(method)), "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("no answer"),
            "{v}"
        );
    }
    // Answered inside the handler itself.
    c.send(r#"{"jsonrpc":"2.0","method":"at_once","params":{"a":[1, 2]},"id":1}"#);
    assert_eq!(
        c.recv(),
        json!({"jsonrpc":"2.0","id":1,"result":{"a":[1,2]}})
    );
    // Past its deadline: -32001 at the deadline; the late answer is dropped and the
    // connection goes on.
    c.send(r#"{"jsonrpc":"2.0","method":"late","id":2}"#);
    let v = c.recv();
    assert_eq!((code(&v), &v["id"]), (-32001, &json!(2)), "{v}");
    std::thread::sleep(Duration::from_millis(400));
    c.send(r#"{"jsonrpc":"2.0","method":"ping","id":3}"#);
    assert_eq!(c.recv(), json!({"jsonrpc":"2.0","id":3,"result":"pong"}));
    // Bad params: answered by the handler through its responder.
    c.send(r#"{"jsonrpc":"2.0","method":"delay","params":[60001],"id":4}"#);
    assert_eq!(code(&c.recv()), -32602);
    c.send(r#"{"jsonrpc":"2.0","method":"delay","params":["x"],"id":5}"#);
    assert_eq!(code(&c.recv()), -32602);

    // A notification's responder: its answer goes nowhere.
    c.send(r#"{"jsonrpc":"2.0","method":"park","params":[7]}"#);
    c.send(r#"{"jsonrpc":"2.0","method":"ping","id":6}"#);
    assert_eq!(c.recv()["id"], 6);
    let (n, r) = parked
        .lock()
        .unwrap()
        .pop()
        .expect("the notification's responder");
    assert!(n == 7 && r.is_notification());
    r.respond(Ok(7));

    // Later answers keep request order: a parked call holds back the ping after it.
    c.send(r#"{"jsonrpc":"2.0","method":"park","params":[8],"id":8}"#);
    c.send(r#"{"jsonrpc":"2.0","method":"ping","id":9}"#);
    let deadline = Instant::now() + Duration::from_secs(10);
    let r = loop {
        if let Some(p) = parked.lock().unwrap().pop() {
            break p.1;
        }
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    };
    r.respond(Ok(json!({"n": 8})));
    assert_eq!(c.recv(), json!({"jsonrpc":"2.0","id":8,"result":{"n":8}}));
    assert_eq!(c.recv()["id"], 9);
    server.stop();
}

#[test]
fn a_batch_mixes_inline_pool_and_deferred_elements_in_one_array() {
    let server = start_with(
        demo::builder(),
        Config::default(),
        ServerConfig::default().workers(1),
    );
    let batch = r#"[
        {"jsonrpc":"2.0","method":"delay","params":[50],"id":"d1"},
        {"jsonrpc":"2.0","method":"ping","id":"p"},
        {"jsonrpc":"2.0","method":"sleep","params":{"ms":20},"id":"s"},
        {"jsonrpc":"2.0","method":"delay","params":[10]},
        {"jsonrpc":"2.0","method":"delay","params":[5],"id":"d2"},
        {"jsonrpc":"2.0","method":"nope","id":"n"},
        {"jsonrpc":"2.0","method":"update","params":[1]}
    ]"#
    .replace('\n', "");
    for scheme in ["tcp", "http"] {
        let answer = match scheme {
            "tcp" => {
                let mut c = Lines::connect(server.tcp);
                c.send(&batch);
                c.send(r#"{"jsonrpc":"2.0","method":"ping","id":"after"}"#);
                let a = c.recv();
                assert_eq!(c.recv()["id"], "after", "answers stay in request order");
                a
            }
            _ => {
                let out = std::process::Command::new("curl")
                    .args([
                        "-sS",
                        "--max-time",
                        "10",
                        "-H",
                        "Content-Type: application/json",
                    ])
                    .args(["--data-binary", &batch])
                    .arg(format!("http://{}/", server.http))
                    .output()
                    .expect("curl");
                assert!(out.status.success(), "{out:?}");
                check_reply(&out.stdout).unwrap()
            }
        };
        let arr = answer.as_array().unwrap_or_else(|| panic!("{answer}"));
        let mut ids: Vec<&str> = arr.iter().map(|v| v["id"].as_str().unwrap()).collect();
        ids.sort_unstable();
        assert_eq!(ids, ["d1", "d2", "n", "p", "s"], "{scheme}: {answer}");
        for v in arr {
            match v["id"].as_str().unwrap() {
                "n" => assert_eq!(code(v), -32601),
                "p" => assert_eq!(v["result"], "pong"),
                _ => assert_eq!(v["result"], Value::Null, "{v}"),
            }
        }
    }
    // Only deferred notifications: nothing at all (HTTP: 204).
    let mut c = Lines::connect(server.tcp);
    c.send(r#"[{"jsonrpc":"2.0","method":"delay","params":[1]},{"jsonrpc":"2.0","method":"delay","params":[1]}]"#);
    c.send(r#"{"jsonrpc":"2.0","method":"ping","id":1}"#);
    assert_eq!(c.recv()["id"], 1);
    server.stop();
}

#[test]
fn shutdown_waits_for_open_responders() {
    let server = start(demo::builder(), Config::default());
    let mut c = Lines::connect(server.tcp);
    c.send(r#"{"jsonrpc":"2.0","method":"delay","params":[300],"id":1}"#);
    c.send(r#"{"jsonrpc":"2.0","method":"delay","params":[200],"id":2}"#);
    // Give the server time to read them (it does at once; 200 ms is slack for a loaded
    // machine): calls received before shutdown must be answered.
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let handle = &server.handle;
    // Both were received before shutdown: both are answered before run() returns.
    handle.shutdown();
    assert_eq!(c.recv(), json!({"jsonrpc":"2.0","id":1,"result":null}));
    assert_eq!(c.recv(), json!({"jsonrpc":"2.0","id":2,"result":null}));
    server.stop();
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn responders_completed_from_many_threads_at_once() {
    let parked = Arc::new(Mutex::new(Vec::new()));
    let server = start(parking(Arc::clone(&parked)), Config::default());
    const CALLS: u64 = 2000;
    let clients: Vec<Client> = (0..4).map(|_| client(&server, "tcp")).collect();
    let answered = Arc::new(AtomicUsize::new(0));
    // Eight threads answer whatever is parked, as soon as it is.
    let completers: Vec<_> = (0..8)
        .map(|_| {
            let (parked, answered) = (Arc::clone(&parked), Arc::clone(&answered));
            std::thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(30);
                while answered.load(Ordering::SeqCst) < CALLS as usize {
                    assert!(Instant::now() < deadline, "not every call was parked");
                    let next = parked.lock().unwrap().pop();
                    match next {
                        Some((n, r)) => {
                            r.respond(Ok(n * 3));
                            answered.fetch_add(1, Ordering::SeqCst);
                        }
                        None => std::thread::yield_now(),
                    }
                }
            })
        })
        .collect();
    let mut pending = Vec::new();
    for i in 0..CALLS {
        pending.push((i, clients[i as usize % 4].start("park", [i]).unwrap()));
    }
    for (i, p) in pending {
        assert_eq!(p.wait::<u64>().unwrap(), i * 3);
    }
    for t in completers {
        t.join().unwrap();
    }
    server.stop();
}

#[test]
fn whoami_reports_the_peer_the_client_socket_has() {
    let server = start(demo::builder(), Config::default());
    // TCP: the client's own address.
    let mut c = Lines::connect(server.tcp);
    let local = c.w.local_addr().unwrap();
    c.send(r#"{"jsonrpc":"2.0","method":"whoami","id":1}"#);
    assert_eq!(
        c.recv()["result"],
        json!({"transport": "tcp", "peer": local.to_string()})
    );
    // HTTP: the same, and the User-Agent.
    let mut s = TcpStream::connect(server.http).unwrap();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let local = s.local_addr().unwrap();
    let body = r#"{"jsonrpc":"2.0","method":"whoami","id":2}"#;
    write!(
        s,
        "POST / HTTP/1.1\r\nHost: t\r\nUser-Agent: deferred-test/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    std::io::Read::read_to_string(&mut s, &mut response).unwrap();
    let json = &response[response.find("\r\n\r\n").unwrap() + 4..];
    assert_eq!(
        check_reply(json.as_bytes()).unwrap()["result"],
        json!({"transport": "http", "peer": local.to_string(), "user_agent": "deferred-test/1.0"})
    );
    // Unix: the client's credentials (this process).
    let u = UnixStream::connect(&server.unix).unwrap();
    u.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    (&u).write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"whoami\",\"id\":3}\n")
        .unwrap();
    let mut line = String::new();
    BufReader::new(&u).read_line(&mut line).unwrap();
    let v = check_reply(line.trim_end().as_bytes()).unwrap();
    let peer = v["result"]["peer"].as_str().unwrap();
    assert_eq!(v["result"]["transport"], "unix", "{v}");
    assert!(
        peer.starts_with(&format!("pid={} uid=", std::process::id())),
        "{v}"
    );
    server.stop();
}

#[test]
fn fallback_routes_and_relayed_errors() {
    let mut b = Registry::builder();
    b.method("known", |_p: Params<'_>| Ok(1)).unwrap();
    b.deferred_fallback(|ctx, params, responder| {
        // What a proxy does: forward, then relay the upstream's answer as it came.
        match ctx.method() {
            "relay_error" => responder.error(RpcError::relay(
                -32601,
                "Method not found upstream",
                Some(r#"{ "upstream" : "a", "n": [1, 2.50] }"#),
            )),
            "relay_reserved" => responder.error(RpcError::relay(-32050, "Upstream busy", None)),
            other => {
                let name = other.to_owned();
                let raw = params.raw_json().map(<[u8]>::to_vec);
                std::thread::spawn(move || {
                    responder.respond(Ok(json!({"method": name, "params": raw.map(|r| String::from_utf8(r).unwrap())})))
                });
            }
        }
    });
    let server = start(b, Config::default());
    let mut c = Lines::connect(server.tcp);
    c.send(r#"{"jsonrpc":"2.0","method":"known","id":1}"#);
    assert_eq!(c.recv()["result"], 1);
    c.send(r#"{"jsonrpc":"2.0","method":"anything.else","params":[1,"x"],"id":2}"#);
    assert_eq!(
        c.recv()["result"],
        json!({"method": "anything.else", "params": "[1,\"x\"]"})
    );
    // The relayed error's data passes through byte for byte.
    c.w.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"relay_error\",\"id\":3}\n")
        .unwrap();
    let mut line = String::new();
    c.r.read_line(&mut line).unwrap();
    assert_eq!(
        line,
        "{\"jsonrpc\":\"2.0\",\"id\":3,\"error\":{\"code\":-32601,\"message\":\"Method not found upstream\",\"data\":{ \"upstream\" : \"a\", \"n\": [1, 2.50] }}}\n"
    );
    c.send(r#"{"jsonrpc":"2.0","method":"relay_reserved","id":4}"#);
    assert_eq!(code(&c.recv()), -32050);
    server.stop();

    // An inline fallback.
    let mut b = Registry::builder();
    b.fallback(|ctx, _params, out| out.write_str(ctx.method()));
    let engine = Engine::new(b.freeze(), Config::default());
    let mut out = Vec::new();
    let _ = engine.handle(
        br#"{"jsonrpc":"2.0","method":"rpc.discover","id":1}"#,
        &mut engine.scratch(),
        &mut out,
    );
    assert_eq!(out, br#"{"jsonrpc":"2.0","id":1,"result":"rpc.discover"}"#);
}

/// Through the no-I/O API, deferred answers in a batch keep to the batch's
/// `max_response_bytes` as inline and pool answers do: a result past it is answered
/// -32002 instead.
#[test]
fn the_no_io_api_keeps_deferred_answers_within_the_batch_budget() {
    let mut b = Registry::builder();
    b.deferred_method("bigd", |_ctx, _params, responder| {
        responder.respond(Ok::<_, RpcError>("x".repeat(150)))
    })
    .unwrap();
    let engine = Engine::new(b.freeze(), Config::default().max_response_bytes(400));
    let mut out = Vec::new();
    let frame = br#"[{"jsonrpc":"2.0","method":"bigd","id":1},{"jsonrpc":"2.0","method":"bigd","id":2},{"jsonrpc":"2.0","method":"bigd","id":3}]"#;
    let _ = engine.handle(frame, &mut engine.scratch(), &mut out);
    let answers: Vec<Value> = serde_json::from_slice(&out).unwrap();
    assert_eq!(answers.len(), 3);
    // Two results fit 400 bytes, the third is answered -32002 in its place.
    assert_eq!(answers[0]["result"].as_str().map(str::len), Some(150));
    assert_eq!(answers[1]["result"].as_str().map(str::len), Some(150));
    assert_eq!(answers[2]["error"]["code"], json!(-32002), "{answers:?}");
}

#[test]
fn the_no_io_api_waits_for_deferred_answers() {
    let engine = demo::engine(Config::default().request_timeout(Some(Duration::from_millis(200))));
    let mut scratch = engine.scratch();
    let mut out = Vec::new();
    let frame = br#"[{"jsonrpc":"2.0","method":"delay","params":[20],"id":1},{"jsonrpc":"2.0","method":"ping","id":2}]"#;
    let _ = engine.handle(frame, &mut scratch, &mut out);
    assert_eq!(
        out,
        br#"[{"jsonrpc":"2.0","id":1,"result":null},{"jsonrpc":"2.0","id":2,"result":"pong"}]"#
    );
    // Past request_timeout: -32001, and the late answer does not leak into the next
    // call's.
    out.clear();
    let _ = engine.handle(
        br#"{"jsonrpc":"2.0","method":"delay","params":[250],"id":3}"#,
        &mut scratch,
        &mut out,
    );
    assert!(
        String::from_utf8_lossy(&out).contains("-32001"),
        "{}",
        String::from_utf8_lossy(&out)
    );
    out.clear();
    let _ = engine.handle(
        br#"{"jsonrpc":"2.0","method":"delay","params":[150],"id":4}"#,
        &mut scratch,
        &mut out,
    );
    assert_eq!(out, br#"{"jsonrpc":"2.0","id":4,"result":null}"#);
    // whoami without a server: the embedded default.
    out.clear();
    let _ = engine.handle(
        br#"{"jsonrpc":"2.0","method":"whoami","id":5}"#,
        &mut scratch,
        &mut out,
    );
    assert_eq!(
        out,
        br#"{"jsonrpc":"2.0","id":5,"result":{"transport":"embedded","peer":"unknown"}}"#
    );
}

/// Records every hook call (cheap to clone: one record shared).
#[derive(Clone, Default)]
struct Recorder(Arc<Records>);

#[derive(Default)]
struct Records {
    before: Mutex<Vec<String>>,
    after: Mutex<Vec<(String, Option<i32>, bool)>>,
}

impl std::ops::Deref for Recorder {
    type Target = Records;
    fn deref(&self) -> &Records {
        &self.0
    }
}

impl ringrpc::Hooks for Recorder {
    fn before(&self, ctx: &ringrpc::Context<'_>, _params: &Params<'_>) -> Result<(), RpcError> {
        self.before.lock().unwrap().push(ctx.method().to_owned());
        if ctx.method() == "whoami" {
            ctx.set_identity("alice");
        }
        if ctx.method().starts_with("forbidden") {
            return Err(RpcError::invalid_params("refused by a hook"));
        }
        Ok(())
    }

    fn after(&self, answered: &ringrpc::Answered<'_>) {
        self.after.lock().unwrap().push((
            answered.method().to_owned(),
            answered.error_code(),
            answered.is_notification(),
        ));
    }
}

/// `n` batch elements cycling through inline, pool and deferred methods, results and
/// errors, calls and notifications, with the after-hook record each must leave.
fn mixed_batch(n: usize) -> (String, Vec<(String, Option<i32>, bool)>) {
    let kinds: [(&str, &str, Option<i32>); 8] = [
        ("ping", "", None),
        ("sleep", r#","params":{"ms":1}"#, None),
        ("delay", r#","params":[1]"#, None),
        ("delay", r#","params":[70000]"#, Some(-32602)),
        ("subtract", r#","params":["x"]"#, Some(-32602)),
        ("nope", "", Some(-32601)),
        ("forbidden_thing", "", Some(-32602)),
        ("sleep", r#","params":{"ms":-1}"#, Some(-32602)),
    ];
    let mut elems = Vec::new();
    let mut want = Vec::new();
    for i in 0..n {
        let (method, params, code) = kinds[i % kinds.len()];
        let notification = i % 5 == 4;
        let id = if notification {
            String::new()
        } else {
            format!(r#","id":{i}"#)
        };
        elems.push(format!(
            r#"{{"jsonrpc":"2.0","method":"{method}"{params}{id}}}"#
        ));
        want.push((method.to_owned(), code, notification));
    }
    (format!("[{}]", elems.join(",")), want)
}

fn sorted<T: Ord + Clone>(v: &[T]) -> Vec<T> {
    let mut v = v.to_vec();
    v.sort();
    v
}

#[test]
fn hooks_run_once_per_call_and_batch_element_on_every_path() {
    let recorder = Recorder::default();
    let engine =
        Engine::new(demo::builder().freeze(), Config::default()).with_hooks(recorder.clone());
    let (batch, want) = mixed_batch(100);

    // Over the server (inline, pool and deferred elements).
    let mut server = Server::with_config(engine, ServerConfig::default().workers(2)).unwrap();
    let tcp = server.listen_tcp("127.0.0.1:0").unwrap();
    let handle = server.handle();
    let thread = std::thread::spawn(move || server.run());
    let mut c = Lines::connect(tcp);
    c.send(&batch);
    let answer = c.recv();
    assert_eq!(answer.as_array().unwrap().len(), 80, "{answer}");
    // whoami sees the identity the before hook set.
    c.send(r#"{"jsonrpc":"2.0","method":"forbidden","id":"f"}"#);
    let v = c.recv();
    assert_eq!(code(&v), -32602);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("refused by a hook"),
        "{v}"
    );
    handle.shutdown();
    thread.join().unwrap().unwrap();

    let before = recorder.before.lock().unwrap().clone();
    let after = recorder.after.lock().unwrap().clone();
    assert_eq!(before.len(), 101, "{before:?}");
    assert_eq!(after.len(), 101, "{after:?}");
    let mut want_all = want.clone();
    want_all.push(("forbidden".to_owned(), Some(-32602), false));
    assert_eq!(sorted(&after), sorted(&want_all));
    let methods: Vec<String> = want_all.iter().map(|w| w.0.clone()).collect();
    assert_eq!(sorted(&before), sorted(&methods));

    // The no-I/O API: the same batch, the same records.
    recorder.before.lock().unwrap().clear();
    recorder.after.lock().unwrap().clear();
    let engine =
        Engine::new(demo::builder().freeze(), Config::default()).with_hooks(recorder.clone());
    let mut out = Vec::new();
    let _ = engine.handle(batch.as_bytes(), &mut engine.scratch(), &mut out);
    assert_eq!(check_reply(&out).unwrap().as_array().unwrap().len(), 80);
    assert_eq!(recorder.before.lock().unwrap().len(), 100);
    assert_eq!(sorted(&recorder.after.lock().unwrap()), sorted(&want));
}

#[test]
fn a_before_hook_sets_the_identity_handlers_see() {
    let recorder = Recorder::default();
    let mut b = Registry::builder();
    b.method_with_ctx("whoami", |ctx: &ringrpc::Context<'_>, _p: Params<'_>| {
        Ok(ctx.identity().map(str::to_owned))
    })
    .unwrap()
    .deferred_method("whoami_later", |ctx, _p, responder| {
        responder.respond(Ok(ctx.identity().map(str::to_owned)))
    })
    .unwrap();
    let engine = Engine::new(b.freeze(), Config::default()).with_hooks(recorder);
    let mut out = Vec::new();
    let _ = engine.handle(
        br#"[{"jsonrpc":"2.0","method":"whoami","id":1},{"jsonrpc":"2.0","method":"whoami_later","id":2}]"#,
        &mut engine.scratch(),
        &mut out,
    );
    assert_eq!(
        check_reply(&out).unwrap(),
        json!([{"jsonrpc":"2.0","id":1,"result":"alice"},{"jsonrpc":"2.0","id":2,"result":null}])
    );
}
