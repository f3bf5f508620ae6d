//! W3C Trace Context over real sockets: a `traceparent` sent over HTTP comes back with
//! the same trace id and the server's span (also for calls answered later), handlers see
//! the trace, sampling starts traces for calls without one, and sampled calls (only
//! those) run in a `tracing` span carrying the call's fields.

mod util;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ringrpc::trace::Trace;
use ringrpc::{demo, Config, Engine, ServerConfig};
use serde_json::{json, Value};
use util::http::post;
use util::line::Line;
use util::server::Served;

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

fn whoami(id: i64) -> Value {
    json!({"jsonrpc": "2.0", "method": "whoami", "id": id})
}

#[test]
fn an_http_traceparent_comes_back_with_the_server_span() {
    let served = Served::start(demo::engine(Config::default()), ServerConfig::default());
    let a = post(served.http, &[("traceparent", TRACEPARENT)], &whoami(1));
    assert_eq!(a.status, 200);
    assert_eq!(a.body["result"]["trace_id"], json!(TRACE_ID), "{}", a.body);
    let back = a
        .header("traceparent")
        .expect("a traceparent in the answer");
    let back = Trace::from_traceparent(back.as_bytes()).expect("a valid one");
    assert_eq!(back.trace_id().to_string(), TRACE_ID);
    let caller = Trace::from_traceparent(TRACEPARENT.as_bytes()).unwrap();
    assert_ne!(
        back.parent_id(),
        caller.parent_id(),
        "the server's own span"
    );
    assert!(back.is_sampled(), "the caller's decision is kept");

    // Calls answered later (a responder on a timer thread) carry it too, in a batch.
    let unsampled = TRACEPARENT.replace("-01", "-00");
    let batch = json!([
        {"jsonrpc": "2.0", "method": "delay", "params": [5], "id": 1},
        {"jsonrpc": "2.0", "method": "ping", "id": 2},
    ]);
    let a = post(served.http, &[("traceparent", &unsampled)], &batch);
    assert_eq!(a.body.as_array().map(Vec::len), Some(2), "{}", a.body);
    let back = a
        .header("traceparent")
        .expect("a traceparent in the answer");
    assert!(
        back.starts_with(&format!("00-{TRACE_ID}-")) && back.ends_with("-00"),
        "{back}"
    );

    // No traceparent, no sampling: no trace, no header.
    let a = post(served.http, &[], &whoami(2));
    assert_eq!(a.header("traceparent"), None);
    assert_eq!(a.body["result"].get("trace_id"), None, "{}", a.body);
    // A broken one is ignored (the call is not part of any trace).
    let a = post(served.http, &[("traceparent", "00-xyz")], &whoami(3));
    assert_eq!(a.header("traceparent"), None);
    served.stop();
}

#[test]
fn sampling_starts_traces_on_every_transport() {
    let engine = demo::engine(Config::default()).with_trace_sampling(1.0);
    let served = Served::start(engine, ServerConfig::default());
    let a = post(served.http, &[], &whoami(1));
    let header = a
        .header("traceparent")
        .expect("sampled: a traceparent")
        .to_owned();
    let t = Trace::from_traceparent(header.as_bytes()).expect("valid");
    assert!(t.is_sampled());
    assert_eq!(
        a.body["result"]["trace_id"],
        json!(t.trace_id().to_string())
    );
    let mut tcp = Line::tcp(served.tcp);
    let first = tcp.call(&whoami(2));
    let second = tcp.call(&whoami(3));
    let (a, b) = (&first["result"]["trace_id"], &second["result"]["trace_id"]);
    assert!(a.is_string() && b.is_string() && a != b, "{first} {second}");
    served.stop();
}

#[test]
fn a_meta_traceparent_traces_the_call_on_any_transport() {
    let served = Served::start(demo::engine(Config::default()), ServerConfig::default());
    let call = |id: i64| json!({"jsonrpc": "2.0", "method": "whoami", "params": {"_meta": {"traceparent": TRACEPARENT}}, "id": id});
    let mut tcp = Line::tcp(served.tcp);
    let a = tcp.call(&call(1));
    assert_eq!(a["result"]["trace_id"], json!(TRACE_ID), "{a}");
    let mut unix = Line::unix(&served.unix);
    let a = unix.call(&call(2));
    assert_eq!(a["result"]["trace_id"], json!(TRACE_ID), "{a}");
    // In a batch, only the element that carries it.
    let batch = json!([call(3), whoami(4)]);
    let a = post(served.http, &[], &batch);
    let answers = a.body.as_array().expect("a batch answer").clone();
    let by_id = |id: i64| {
        answers
            .iter()
            .find(|x| x["id"] == json!(id))
            .cloned()
            .unwrap()
    };
    assert_eq!(by_id(3)["result"]["trace_id"], json!(TRACE_ID));
    assert_eq!(by_id(4)["result"].get("trace_id"), None);
    // An invalid one is ignored; the call runs untraced.
    let bad = json!({"jsonrpc": "2.0", "method": "whoami", "params": {"_meta": {"traceparent": "00-nope"}}, "id": 5});
    let a = tcp.call(&bad);
    assert_eq!(a["result"].get("trace_id"), None, "{a}");
    // A plain method with `_meta` still answers (its params are its own business).
    let echo = json!({"jsonrpc": "2.0", "method": "echo", "params": {"_meta": {"traceparent": TRACEPARENT}, "x": 1}, "id": 6});
    let a = tcp.call(&echo);
    assert_eq!(a["result"]["x"], json!(1), "{a}");
    served.stop();
}

/// The spans opened, with their fields (a minimal `tracing` subscriber).
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<BTreeMap<String, String>>>>, Arc<AtomicU64>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl tracing::Subscriber for Spans {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let mut fields = BTreeMap::new();
        fields.insert("name".to_owned(), span.metadata().name().to_owned());
        span.record(&mut Fields(&mut fields));
        self.0.lock().unwrap().push(fields);
        tracing::span::Id::from_u64(self.1.fetch_add(1, Ordering::Relaxed) + 1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {}
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn sampled_calls_and_only_they_run_in_a_span() {
    let spans = Spans::default();
    let engine = Engine::new(demo::registry(), Config::default());
    let frame = br#"[{"jsonrpc":"2.0","method":"ping","id":"p"},{"jsonrpc":"2.0","method":"add","params":[1,2],"id":7}]"#;
    tracing::subscriber::with_default(spans.clone(), || {
        let (mut scratch, mut out) = (engine.scratch(), Vec::new());
        // Not traced: no span.
        let _ = engine.handle(frame, &mut scratch, &mut out);
        assert!(spans.0.lock().unwrap().is_empty());
        // Traced but not sampled: no span either.
        let unsampled =
            Trace::from_traceparent(TRACEPARENT.replace("-01", "-00").as_bytes()).unwrap();
        let conn = ringrpc::Connection::EMBEDDED;
        let source = ringrpc::Source::new(&conn).with_trace(&unsampled);
        out.clear();
        let _ = engine.handle_from(frame, &source, &mut scratch, &mut out);
        assert!(spans.0.lock().unwrap().is_empty());
        // Sampled: one span per call, with its fields.
        let sampled = Trace::from_traceparent(TRACEPARENT.as_bytes()).unwrap();
        let source = ringrpc::Source::new(&conn).with_trace(&sampled);
        out.clear();
        let _ = engine.handle_from(frame, &source, &mut scratch, &mut out);
        assert!(String::from_utf8_lossy(&out).contains(r#""result":3"#));
    });
    let got = spans.0.lock().unwrap().clone();
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0]["name"], "rpc.call");
    assert_eq!(got[0]["method"], "ping");
    assert_eq!(got[1]["method"], "add");
    assert!(got[1]["id"].contains('7'), "{got:?}");
    assert_eq!(got[1]["transport"], "embedded");
    assert_eq!(got[1]["trace_id"], TRACE_ID);
    let sampled = Trace::from_traceparent(TRACEPARENT.as_bytes()).unwrap();
    assert_eq!(got[1]["span_id"].len(), 16);
    assert_ne!(got[1]["span_id"], sampled.parent_id().unwrap().to_string());
}
