//! The access log over real sockets: one JSON line per call, each batch element its own
//! (answered inline, on the pool and by a responder), with transport, peer, identity,
//! method, id, code, duration, bytes and trace id; and the text format.

mod util;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ringrpc::access_log::{AccessLog, Format};
use ringrpc::guard::Guard;
use ringrpc::{demo, Config, ServerConfig};
use serde_json::{json, Value};
use util::http::post;
use util::line::Line;
use util::server::Served;

/// Where the log writes: a buffer the test reads.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    /// The lines written so far, once there are `n` (the log writes on its own thread).
    fn wait_for(&self, n: usize) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
            let lines: Vec<String> = text.lines().map(str::to_owned).collect();
            if lines.len() >= n {
                return lines;
            }
            assert!(
                Instant::now() < deadline,
                "{} lines of {n}: {text}",
                lines.len()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

const KEYS: &str = r#"
[[key]]
name = "ops"
token = "s3cret"
allow = ["*"]
"#;

/// A call refused because its budget had run out before it ran (-32001) gets its line
/// too, as every call does.
#[test]
fn a_call_whose_budget_ran_out_is_logged() {
    let lines = Lines::default();
    let engine = demo::engine(Config::default()).with_access_log(AccessLog::to_writer(
        Format::Json,
        lines.clone(),
        1024,
    ));
    let mut out = Vec::new();
    let _ = engine.handle(
        br#"{"jsonrpc":"2.0","method":"echo","params":{"_meta":{"timeoutMs":0}},"id":7}"#,
        &mut engine.scratch(),
        &mut out,
    );
    let answer: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(answer["error"]["code"], json!(-32001), "{answer}");
    let line: Value = serde_json::from_str(&lines.wait_for(1)[0]).unwrap();
    assert_eq!(line["method"], "echo");
    assert_eq!(line["id"], 7);
    assert_eq!(line["code"], -32001);
    assert_eq!(line["bytes_out"], json!(out.len()));
}

/// A call answered later (on the pool, by a responder) with a trace of its own in
/// `params._meta.traceparent` is logged with that trace, as an inline call is.
#[test]
fn calls_answered_later_are_logged_with_their_own_trace() {
    use std::io::{BufRead, BufReader};
    let lines = Lines::default();
    let mut b = ringrpc::Registry::builder();
    b.blocking_method("on_pool", |_: ringrpc::Params<'_>| Ok(1))
        .unwrap()
        .deferred_method("later", |_ctx, _p, responder| {
            responder.respond(Ok::<_, ringrpc::RpcError>(2))
        })
        .unwrap();
    let engine = ringrpc::Engine::new(b.freeze(), Config::default())
        .with_access_log(AccessLog::to_writer(Format::Json, lines.clone(), 1024));
    let served = Served::start(engine, ServerConfig::default());
    let mut tcp = std::net::TcpStream::connect(served.tcp).unwrap();
    let meta = json!({"_meta": {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}});
    for (i, m) in ["on_pool", "later"].iter().enumerate() {
        let call = json!({"jsonrpc": "2.0", "method": m, "params": meta, "id": i});
        writeln!(tcp, "{call}").unwrap();
    }
    let mut r = BufReader::new(tcp);
    for _ in 0..2 {
        let mut answer = String::new();
        r.read_line(&mut answer).unwrap();
        assert!(answer.contains("result"), "{answer}");
    }
    for l in lines.wait_for(2) {
        let l: Value = serde_json::from_str(&l).unwrap();
        assert_eq!(
            l["trace_id"],
            json!("0af7651916cd43dd8448eb211c80319c"),
            "{l}"
        );
    }
    served.stop();
}

/// A call answered later is timed from when its frame was taken up, as its deadline
/// is, not from the end of the frame's inline work: here a pool call ahead of a slow
/// inline one in the same batch takes at least the inline one's 300 ms.
#[test]
fn a_call_answered_later_is_timed_from_its_frame() {
    use std::io::{BufRead, BufReader};
    let lines = Lines::default();
    let mut b = ringrpc::Registry::builder();
    b.blocking_method("on_pool", |_: ringrpc::Params<'_>| Ok(1))
        .unwrap()
        .method("slow_inline", |_: ringrpc::Params<'_>| {
            std::thread::sleep(Duration::from_millis(300));
            Ok(2)
        })
        .unwrap();
    let engine = ringrpc::Engine::new(b.freeze(), Config::default())
        .with_access_log(AccessLog::to_writer(Format::Json, lines.clone(), 1024));
    let served = Served::start(engine, ServerConfig::default());
    let mut tcp = std::net::TcpStream::connect(served.tcp).unwrap();
    let batch = json!([
        {"jsonrpc": "2.0", "method": "on_pool", "id": 1},
        {"jsonrpc": "2.0", "method": "slow_inline", "id": 2},
    ]);
    writeln!(tcp, "{batch}").unwrap();
    let mut answer = String::new();
    BufReader::new(tcp).read_line(&mut answer).unwrap();
    let logged: Vec<Value> = lines
        .wait_for(2)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let pool = logged.iter().find(|l| l["method"] == "on_pool").unwrap();
    assert!(pool["duration_us"].as_u64() >= Some(290_000), "{pool}");
    served.stop();
}

#[test]
fn a_batch_logs_each_element() {
    let lines = Lines::default();
    let engine = demo::engine(Config::default())
        .with_guard(Guard::new().with_keys_toml(KEYS).unwrap())
        .with_access_log(AccessLog::to_writer(Format::Json, lines.clone(), 1024));
    let served = Served::start(engine, ServerConfig::default());
    let batch = json!([
        {"jsonrpc": "2.0", "method": "add", "params": [1, 2], "id": 1},
        {"jsonrpc": "2.0", "method": "nope", "id": "two"},
        {"jsonrpc": "2.0", "method": "notify_hello", "params": []},
        {"jsonrpc": "2.0", "method": "sleep", "params": {"ms": 1}, "id": 4},
        {"jsonrpc": "2.0", "method": "delay", "params": [1], "id": 5},
    ]);
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let a = post(
        served.http,
        &[
            ("Authorization", "Bearer s3cret"),
            ("traceparent", traceparent),
        ],
        &batch,
    );
    assert_eq!(a.status, 200);
    assert_eq!(a.body.as_array().map(Vec::len), Some(4), "{}", a.body);

    let logged: Vec<Value> = lines
        .wait_for(5)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(logged.len(), 5, "{logged:#?}");
    let by = |method: &str| {
        logged
            .iter()
            .find(|l| l["method"] == json!(method))
            .unwrap_or_else(|| panic!("no line for {method}: {logged:#?}"))
    };
    for l in &logged {
        assert_eq!(l["transport"], json!("http"));
        assert!(l["peer"].as_str().unwrap().starts_with("127.0.0.1:"), "{l}");
        assert_eq!(l["identity"], json!("ops"));
        assert_eq!(l["trace_id"], json!("4bf92f3577b34da6a3ce929d0e0e4736"));
        assert!(
            l["duration_us"].is_u64() && l["bytes_in"].as_u64() > Some(10),
            "{l}"
        );
        let time = l["time"].as_str().unwrap();
        assert!(
            time.len() == 27 && time.ends_with('Z') && time.contains('T'),
            "{time}"
        );
    }
    let add = by("add");
    assert_eq!(
        (add["id"].clone(), add["code"].clone()),
        (json!(1), json!(0))
    );
    assert_eq!(
        add["bytes_out"],
        json!(r#"{"jsonrpc":"2.0","id":1,"result":3}"#.len())
    );
    let nope = by("nope");
    assert_eq!(
        (nope["id"].clone(), nope["code"].clone()),
        (json!("two"), json!(-32601))
    );
    let note = by("notify_hello");
    assert_eq!(
        (note["id"].clone(), note["bytes_out"].clone()),
        (Value::Null, json!(0))
    );
    // Answered later: by the pool, and by a responder.
    let sleep = by("sleep");
    assert_eq!(
        (sleep["id"].clone(), sleep["code"].clone()),
        (json!(4), json!(0))
    );
    assert!(sleep["duration_us"].as_u64() >= Some(1000), "{sleep}");
    assert_eq!(by("delay")["id"], json!(5));
    served.stop();
}

#[test]
fn the_text_format_names_the_same_fields() {
    let lines = Lines::default();
    let engine = demo::engine(Config::default()).with_access_log(AccessLog::to_writer(
        Format::Text,
        lines.clone(),
        1024,
    ));
    let served = Served::start(engine, ServerConfig::default());
    let mut tcp = Line::tcp(served.tcp);
    tcp.call(&json!({"jsonrpc": "2.0", "method": "add", "params": [1, 2], "id": 9}));
    let logged = lines.wait_for(1);
    let line = &logged[0];
    let fields: Vec<&str> = line.split(' ').collect();
    assert_eq!(fields[1], "tcp", "{line}");
    assert!(fields[2].starts_with("127.0.0.1:"), "{line}");
    assert_eq!(&fields[3..6], ["-", "\"add\"", "id=9"], "{line}");
    assert_eq!(fields[6], "code=0");
    assert!(fields[7].ends_with("us"));
    assert!(fields[8].starts_with("in=") && fields[9].starts_with("out="));
    assert_eq!(fields[10], "trace=-");
    served.stop();
}
