//! The baselines answer exactly what ringrpc answers, so the benches compare like with
//! like.
//!
//! Replies are compared as `serde_json::Value` (member order and number spelling aside),
//! batch answers matched by id. Error objects are compared by `code` (and the reply's
//! `id`) only: the `message` is free text and `data` optional in JSON-RPC 2.0, and each
//! implementation words its own.

use benches::{inputs, jsonrpsee_baseline, serde_json_baseline};
use ringrpc::{demo, Config, Outcome};
use serde_json::Value;

fn ringrpc_reply(input: &str) -> Option<Vec<u8>> {
    let engine = demo::engine(Config::default());
    let mut scratch = engine.scratch();
    let frame = input.as_bytes().to_vec();
    let mut out = Vec::new();
    match engine.handle(&frame, &mut scratch, &mut out) {
        Outcome::Reply => Some(out),
        Outcome::Nothing => {
            assert!(out.is_empty(), "ringrpc wrote output for no reply");
            None
        }
    }
}

fn baseline_reply(handle: fn(&[u8], &mut Vec<u8>) -> bool, input: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    if handle(input.as_bytes(), &mut out) {
        Some(out)
    } else {
        assert!(out.is_empty(), "baseline wrote output for no reply");
        None
    }
}

/// Drops error messages and data; sorts batch answers by id.
fn normalize(reply: &[u8]) -> Value {
    fn one(mut v: Value) -> Value {
        if let Some(err) = v.get_mut("error").and_then(Value::as_object_mut) {
            err.remove("message");
            err.remove("data");
        }
        v
    }
    let v: Value = serde_json::from_slice(reply)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(reply)));
    match v {
        Value::Array(items) => {
            let mut items: Vec<Value> = items.into_iter().map(one).collect();
            items.sort_by_key(|v| v.get("id").map(Value::to_string).unwrap_or_default());
            Value::Array(items)
        }
        v => one(v),
    }
}

fn agree(input: &str) -> Option<Value> {
    let expected = ringrpc_reply(input).map(|r| normalize(&r));
    for (name, handle) in [
        (
            "serde_json",
            serde_json_baseline::handle as fn(&[u8], &mut Vec<u8>) -> bool,
        ),
        ("jsonrpsee_types", jsonrpsee_baseline::handle),
    ] {
        let got = baseline_reply(handle, input).map(|r| normalize(&r));
        assert_eq!(
            got, expected,
            "{name} disagrees with ringrpc on input {input}"
        );
    }
    expected
}

#[test]
fn spec_subtract() {
    assert_eq!(inputs::SUBTRACT.len(), 61);
    let v = agree(inputs::SUBTRACT).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "result": 19})
    );
}

#[test]
fn named_subtract() {
    let v = agree(
        r#"{"jsonrpc":"2.0","method":"subtract","params":{"subtrahend":23,"minuend":42},"id":"a"}"#,
    )
    .unwrap();
    assert_eq!(v["result"], 19);
}

#[test]
fn echo_1k() {
    assert!(
        (900..=1200).contains(&inputs::ECHO_1K.len()),
        "{}",
        inputs::ECHO_1K.len()
    );
    let v = agree(inputs::ECHO_1K).unwrap();
    let sent: Value = serde_json::from_str(inputs::ECHO_1K).unwrap();
    assert_eq!(v["result"], sent["params"]);
    assert_eq!(
        v["result"]["user"]["bio"].as_str().unwrap().lines().count(),
        3
    );
}

#[test]
fn batch16() {
    let v = agree(&inputs::batch16()).unwrap();
    let items = v.as_array().unwrap();
    assert_eq!(items.len(), 16);
    for item in items {
        let id = item["id"].as_i64().unwrap();
        assert_eq!(item["result"].as_i64().unwrap(), 3 * id);
    }
}

#[test]
fn notifications() {
    assert_eq!(
        agree(r#"{"jsonrpc":"2.0","method":"subtract","params":[42,23]}"#),
        None
    );
    assert_eq!(agree(r#"{"jsonrpc":"2.0","method":"foobar"}"#), None);
    assert_eq!(
        agree(
            r#"[{"jsonrpc":"2.0","method":"add","params":[1,2]},{"jsonrpc":"2.0","method":"echo"}]"#
        ),
        None
    );
}

#[test]
fn unknown_method() {
    let v = agree(r#"{"jsonrpc":"2.0","method":"foobar","id":"1"}"#).unwrap();
    assert_eq!(v["error"]["code"], -32601);
    assert_eq!(v["id"], "1");
}

#[test]
fn bad_json() {
    let v = agree(r#"{"jsonrpc":"2.0","method":"foobar,"params":"bar","baz]"#).unwrap();
    assert_eq!(v["error"]["code"], -32700);
    assert_eq!(v["id"], Value::Null);
    let v = agree(
        r#"[{"jsonrpc":"2.0","method":"sum","params":[1,2,4],"id":"1"},{"jsonrpc":"2.0","method""#,
    )
    .unwrap();
    assert_eq!(v["error"]["code"], -32700);
}

#[test]
fn empty_batch() {
    let v = agree("[]").unwrap();
    assert_eq!(v["error"]["code"], -32600);
    assert_eq!(v["id"], Value::Null);
}

#[test]
fn invalid_requests() {
    let v = agree("[1,2,3]").unwrap();
    assert_eq!(v.as_array().unwrap().len(), 3);
    assert_eq!(v[0]["error"]["code"], -32600);
    let v = agree(r#"{"jsonrpc":"2.0","method":1,"params":"bar"}"#).unwrap();
    assert_eq!(v["error"]["code"], -32600);
    let v = agree(r#"{"method":"add","params":[1,2],"id":9}"#).unwrap();
    assert_eq!(
        (v["error"]["code"].clone(), v["id"].clone()),
        (Value::from(-32600), Value::from(9))
    );
}

#[test]
fn invalid_params() {
    for input in [
        r#"{"jsonrpc":"2.0","method":"add","params":[1],"id":1}"#,
        r#"{"jsonrpc":"2.0","method":"add","params":["a","b"],"id":1}"#,
        r#"{"jsonrpc":"2.0","method":"subtract","params":{"minuend":1},"id":1}"#,
        r#"{"jsonrpc":"2.0","method":"subtract","id":1}"#,
        r#"{"jsonrpc":"2.0","method":"add","params":[9223372036854775807,1],"id":1}"#,
    ] {
        assert_eq!(agree(input).unwrap()["error"]["code"], -32602, "{input}");
    }
}

#[test]
fn mixed_batch() {
    let v = agree(concat!(
        r#"[{"jsonrpc":"2.0","method":"add","params":[1,2],"id":"1"},"#,
        r#"{"jsonrpc":"2.0","method":"subtract","params":[7,4]},"#,
        r#"{"jsonrpc":"2.0","method":"subtract","params":[42,23],"id":"2"},"#,
        r#"{"foo":"boo"},"#,
        r#"{"jsonrpc":"2.0","method":"foo.get","params":{"name":"myself"},"id":"5"},"#,
        r#"{"jsonrpc":"2.0","method":"echo","params":["x\u00e9",-1.5,null],"id":"9"}]"#
    ))
    .unwrap();
    assert_eq!(v.as_array().unwrap().len(), 5);
}
