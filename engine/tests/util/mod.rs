//! Helpers shared by the integration tests: running frames through an engine and
//! checking that replies are well-formed JSON-RPC 2.0 responses.
//!
//! Include with `mod util;` from a test file. Not every test uses every helper.
#![allow(dead_code)]

pub mod http;
pub mod line;
pub mod python;
pub mod redis;
pub mod server;
pub mod ws;

use std::path::PathBuf;

use bytes::BytesMut;
use ringrpc::{Config, Engine, LineDecoder, Outcome, Scratch, ServerConfig};
use serde_json::Value;
use std::time::Duration;

/// The `-32700` Parse error code.
pub const PARSE_ERROR: i64 = ringrpc::codes::PARSE_ERROR as i64;
/// The `-32600` Invalid Request code.
pub const INVALID_REQUEST: i64 = ringrpc::codes::INVALID_REQUEST as i64;

/// `engine/tests/data/<rel>`, the test data vendored into the repository, which must exist:
/// a missing directory must fail the test loudly instead of silently testing nothing.
pub fn data_dir(rel: &str) -> PathBuf {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data")).join(rel);
    assert!(
        dir.is_dir(),
        "required test data directory {} does not exist",
        dir.display()
    );
    dir
}

/// Every file in `dir` with its bytes, sorted by file name (lossily decoded); panics
/// naming the path on any I/O error, since a test that silently reads nothing proves
/// nothing.
pub fn read_dir_sorted(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.expect("directory entry").path();
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let bytes = std::fs::read(&path)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            (name, bytes)
        })
        .collect();
    files.sort();
    files
}

/// An engine serving the demo methods, with its per-thread state.
pub struct Harness {
    pub engine: Engine,
    pub scratch: Scratch,
}

impl Harness {
    pub fn new(config: Config) -> Self {
        Self::with_engine(ringrpc::demo::engine(config))
    }

    /// A harness around any engine.
    #[allow(dead_code)] // not every test binary uses it
    pub fn with_engine(engine: Engine) -> Self {
        let scratch = engine.scratch();
        Self { engine, scratch }
    }

    /// Runs `input` as one frame; returns the outcome and the reply bytes. Also checks
    /// that the frame is left untouched.
    pub fn handle(&mut self, input: &[u8]) -> (Outcome, Vec<u8>) {
        let frame = input.to_vec();
        let mut out = Vec::new();
        let outcome = self.engine.handle(&frame, &mut self.scratch, &mut out);
        assert_eq!(frame, input, "handle modified the frame");
        (outcome, out)
    }

    /// Feeds `pieces` one after another through `handle_lines` with one decoder; returns
    /// everything written and the bytes left pending in the read buffer.
    pub fn handle_lines_pieces<'p>(
        &mut self,
        pieces: impl IntoIterator<Item = &'p [u8]>,
    ) -> (Vec<u8>, Vec<u8>) {
        let mut decoder: LineDecoder = self.engine.decoder();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for piece in pieces {
            buf.extend_from_slice(piece);
            self.engine
                .handle_lines(&mut buf, &mut decoder, &mut self.scratch, &mut out);
        }
        (out, buf.to_vec())
    }
}

/// Parses a reply and checks it is one JSON-RPC response object or a non-empty array
/// of them. Returns the parsed reply.
pub fn check_reply(reply: &[u8]) -> Result<Value, String> {
    let v: Value = serde_json::from_slice(reply)
        .map_err(|e| format!("reply is not valid JSON ({e}): {}", show(reply)))?;
    match &v {
        Value::Object(_) => check_response(&v)?,
        Value::Array(items) => {
            if items.is_empty() {
                return Err("reply is an empty array `[]`".into());
            }
            for item in items {
                check_response(item)?;
            }
        }
        _ => return Err(format!("reply is neither an object nor an array: {v}")),
    }
    Ok(v)
}

/// Checks one response object: `"jsonrpc": "2.0"`, an `id` (string, number or null),
/// exactly one of `result`/`error`, and an error with an integer `code` and a string
/// `message`.
pub fn check_response(v: &Value) -> Result<(), String> {
    let Value::Object(m) = v else {
        return Err(format!("response is not an object: {v}"));
    };
    if m.get("jsonrpc") != Some(&Value::String("2.0".into())) {
        return Err(format!("response lacks \"jsonrpc\":\"2.0\": {v}"));
    }
    match m.get("id") {
        Some(Value::String(_) | Value::Number(_) | Value::Null) => {}
        _ => {
            return Err(format!(
                "response id missing or not string/number/null: {v}"
            ))
        }
    }
    let allowed = ["jsonrpc", "id", "result", "error"];
    if let Some(k) = m.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(format!("response has an unexpected member {k:?}: {v}"));
    }
    match (m.get("result"), m.get("error")) {
        (Some(_), None) => Ok(()),
        (None, Some(Value::Object(e))) => {
            if !e.get("code").is_some_and(|c| c.is_i64()) {
                return Err(format!("error code missing or not an integer: {v}"));
            }
            if !e.get("message").is_some_and(Value::is_string) {
                return Err(format!("error message missing or not a string: {v}"));
            }
            if let Some(k) = e
                .keys()
                .find(|k| !["code", "message", "data"].contains(&k.as_str()))
            {
                return Err(format!("error has an unexpected member {k:?}: {v}"));
            }
            Ok(())
        }
        (None, Some(_)) => Err(format!("error is not an object: {v}")),
        (Some(_), Some(_)) => Err(format!("both result and error: {v}")),
        (None, None) => Err(format!("neither result nor error: {v}")),
    }
}

/// The error code of a single (non-batch) error response.
pub fn error_code(v: &Value) -> Option<i64> {
    v.get("error")?.get("code")?.as_i64()
}

/// Whether `reply` is exactly one `-32700` error object with id `null`.
pub fn is_parse_error(v: &Value) -> bool {
    v.is_object() && error_code(v) == Some(PARSE_ERROR) && v.get("id") == Some(&Value::Null)
}

/// Bytes for a failure message: the text if UTF-8 and short, else escaped and cut.
pub fn show(bytes: &[u8]) -> String {
    const MAX: usize = 300;
    let s = String::from_utf8_lossy(&bytes[..bytes.len().min(MAX)]);
    let more = if bytes.len() > MAX {
        format!("… ({} bytes)", bytes.len())
    } else {
        String::new()
    };
    format!("{s:?}{more}")
}

/// The engine's limits and the server's settings, set in one chain (the tests mix them).
#[derive(Clone, Default)]
pub struct Setup(pub Config, pub ServerConfig);

macro_rules! setters {
    ($($part:tt: $($name:ident($t:ty)),*;)*) => {
        impl Setup {
            $($(
                pub fn $name(mut self, v: $t) -> Self {
                    self.$part = self.$part.$name(v);
                    self
                }
            )*)*
        }
    };
}

setters! {
    0: max_request_bytes(usize), max_response_bytes(usize), max_batch_len(usize),
       request_timeout(Option<Duration>);
    1: workers(usize), idle_timeout(Option<Duration>), request_read_timeout(Option<Duration>),
       write_high_water(usize), batch_concurrency(usize), queue_capacity(usize),
       cors_origin(&str), max_connections(usize), reactors(usize);
}
