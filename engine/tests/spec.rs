//! The JSON-RPC 2.0 specification's section 7 examples, the eight common mistakes, and
//! the engine's limits, checked as JSON semantics through the no-I/O API.

use ringrpc::{demo, AppCode, Config, Engine, Outcome, Params, Registry, RpcError};
use serde_json::{json, Value};

/// Handles `input` as one frame; `None` when nothing is to be sent.
fn answer(engine: &Engine, input: &str) -> Option<Value> {
    let frame = input.as_bytes();
    let mut scratch = engine.scratch();
    let mut out = b"prefix".to_vec(); // replies are appended, never overwrite
    let outcome = engine.handle(frame, &mut scratch, &mut out);
    assert!(out.starts_with(b"prefix"));
    let reply = &out[6..];
    match outcome {
        Outcome::Nothing => {
            assert!(
                reply.is_empty(),
                "Nothing but wrote {:?}",
                String::from_utf8_lossy(reply)
            );
            None
        }
        Outcome::Reply => Some(serde_json::from_slice(reply).unwrap_or_else(|e| {
            panic!(
                "reply is not JSON ({e}): {}",
                String::from_utf8_lossy(reply)
            )
        })),
    }
}

fn demo_answer(input: &str) -> Option<Value> {
    answer(&demo::engine(Config::default()), input)
}

/// Checks a response's shape (jsonrpc, id, exactly one of result/error) and returns it.
fn response(v: &Value) -> &serde_json::Map<String, Value> {
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"));
    assert_eq!(o.get("jsonrpc"), Some(&json!("2.0")), "{v}");
    assert!(o.contains_key("id"), "{v}");
    assert!(o.contains_key("result") ^ o.contains_key("error"), "{v}");
    assert_eq!(o.len(), 3, "{v}");
    if let Some(e) = o.get("error") {
        assert!(e["code"].is_i64() && e["message"].is_string(), "{v}");
    }
    o
}

fn result_of(v: &Value) -> (&Value, &Value) {
    let o = response(v);
    (
        &o["id"],
        o.get("result").unwrap_or_else(|| panic!("no result: {v}")),
    )
}

fn error_of(v: &Value) -> (&Value, i64) {
    let o = response(v);
    let e = o.get("error").unwrap_or_else(|| panic!("no error: {v}"));
    (&o["id"], e["code"].as_i64().unwrap())
}

/// Indexes a batch reply by id (order is free); errors with id null are counted apart.
fn by_id(v: &Value) -> (std::collections::HashMap<String, Value>, Vec<Value>) {
    let arr = v
        .as_array()
        .unwrap_or_else(|| panic!("not a batch reply: {v}"));
    assert!(!arr.is_empty());
    let mut map = std::collections::HashMap::new();
    let mut null = Vec::new();
    for r in arr {
        let o = response(r);
        if o["id"].is_null() {
            null.push(r.clone());
        } else {
            assert!(
                map.insert(o["id"].to_string(), r.clone()).is_none(),
                "duplicate id"
            );
        }
    }
    (map, null)
}

#[test]
fn section_7_positional_params() {
    let r = demo_answer(r#"{"jsonrpc": "2.0", "method": "subtract", "params": [42, 23], "id": 1}"#);
    assert_eq!(result_of(&r.unwrap()), (&json!(1), &json!(19)));
    let r = demo_answer(r#"{"jsonrpc": "2.0", "method": "subtract", "params": [23, 42], "id": 2}"#);
    assert_eq!(result_of(&r.unwrap()), (&json!(2), &json!(-19)));
}

#[test]
fn section_7_named_params() {
    let r = demo_answer(
        r#"{"jsonrpc": "2.0", "method": "subtract", "params": {"subtrahend": 23, "minuend": 42}, "id": 3}"#,
    );
    assert_eq!(result_of(&r.unwrap()), (&json!(3), &json!(19)));
    let r = demo_answer(
        r#"{"jsonrpc": "2.0", "method": "subtract", "params": {"minuend": 42, "subtrahend": 23}, "id": 4}"#,
    );
    assert_eq!(result_of(&r.unwrap()), (&json!(4), &json!(19)));
}

#[test]
fn section_7_notifications() {
    assert_eq!(
        demo_answer(r#"{"jsonrpc": "2.0", "method": "update", "params": [1,2,3,4,5]}"#),
        None
    );
    assert_eq!(
        demo_answer(r#"{"jsonrpc": "2.0", "method": "foobar"}"#),
        None
    );
}

#[test]
fn section_7_non_existent_method() {
    let r = demo_answer(r#"{"jsonrpc": "2.0", "method": "foobar", "id": "1"}"#).unwrap();
    assert_eq!(error_of(&r), (&json!("1"), -32601));
}

#[test]
fn section_7_invalid_json() {
    let r = demo_answer(r#"{"jsonrpc": "2.0", "method": "foobar, "params": "bar", "baz]"#).unwrap();
    assert_eq!(error_of(&r), (&Value::Null, -32700));
}

#[test]
fn section_7_invalid_request_object() {
    let r = demo_answer(r#"{"jsonrpc": "2.0", "method": 1, "params": "bar"}"#).unwrap();
    assert_eq!(error_of(&r), (&Value::Null, -32600));
}

#[test]
fn section_7_batch_invalid_json() {
    let r = demo_answer(
        r#"[
  {"jsonrpc": "2.0", "method": "sum", "params": [1,2,4], "id": "1"},
  {"jsonrpc": "2.0", "method"
]"#,
    )
    .unwrap();
    assert!(r.is_object(), "a single error, not an array: {r}");
    assert_eq!(error_of(&r), (&Value::Null, -32700));
}

#[test]
fn section_7_empty_array() {
    let r = demo_answer("[]").unwrap();
    assert!(r.is_object(), "a single error, not an array: {r}");
    assert_eq!(error_of(&r), (&Value::Null, -32600));
}

#[test]
fn section_7_invalid_batch_not_empty() {
    let r = demo_answer("[1]").unwrap();
    let arr = r.as_array().unwrap();
    assert_eq!(arr.len(), 1);
    assert_eq!(error_of(&arr[0]), (&Value::Null, -32600));
}

#[test]
fn section_7_invalid_batch() {
    let r = demo_answer("[1,2,3]").unwrap();
    let arr = r.as_array().unwrap();
    assert_eq!(arr.len(), 3);
    for e in arr {
        assert_eq!(error_of(e), (&Value::Null, -32600));
    }
}

#[test]
fn section_7_mixed_batch() {
    let r = demo_answer(
        r#"[
        {"jsonrpc": "2.0", "method": "sum", "params": [1,2,4], "id": "1"},
        {"jsonrpc": "2.0", "method": "notify_hello", "params": [7]},
        {"jsonrpc": "2.0", "method": "subtract", "params": [42,23], "id": "2"},
        {"foo": "boo"},
        {"jsonrpc": "2.0", "method": "foo.get", "params": {"name": "myself"}, "id": "5"},
        {"jsonrpc": "2.0", "method": "get_data", "id": "9"}
    ]"#,
    )
    .unwrap();
    let (map, null) = by_id(&r);
    assert_eq!(map.len() + null.len(), 5);
    assert_eq!(result_of(&map["\"1\""]).1, &json!(7));
    assert_eq!(result_of(&map["\"2\""]).1, &json!(19));
    assert_eq!(error_of(&map["\"5\""]).1, -32601);
    assert_eq!(result_of(&map["\"9\""]).1, &json!(["hello", 5]));
    assert_eq!(null.len(), 1);
    assert_eq!(error_of(&null[0]).1, -32600);
}

#[test]
fn section_7_all_notifications_batch() {
    let r = demo_answer(
        r#"[
        {"jsonrpc": "2.0", "method": "notify_sum", "params": [1,2,4]},
        {"jsonrpc": "2.0", "method": "notify_hello", "params": [7]}
    ]"#,
    );
    assert_eq!(r, None);
}

// ---- The eight common mistakes, each impossible ----

#[test]
fn mistake_1_missing_jsonrpc_is_invalid() {
    for req in [
        r#"{"method": "ping", "id": 1}"#,
        r#"{"jsonrpc": "1.0", "method": "ping", "id": 1}"#,
        r#"{"jsonrpc": 2.0, "method": "ping", "id": 1}"#,
        r#"{"jsonrpc": "2.0 ", "method": "ping", "id": 1}"#,
    ] {
        let r = demo_answer(req).unwrap();
        assert_eq!(error_of(&r), (&json!(1), -32600), "{req}");
    }
    // Without an id it is still answered: an invalid request is not a notification.
    let r = demo_answer(r#"{"method": "update"}"#).unwrap();
    assert_eq!(error_of(&r), (&Value::Null, -32600));
}

#[test]
fn mistake_2_notifications_never_answered() {
    for req in [
        r#"{"jsonrpc":"2.0","method":"update"}"#,
        r#"{"jsonrpc":"2.0","method":"nope","params":[1]}"#,
        r#"{"jsonrpc":"2.0","method":"subtract","params":["x"]}"#,
        r#"{"jsonrpc":"2.0","method":"subtract","params":[1,2]}"#,
        r#"{"jsonrpc":"2.0","method":"panics"}"#,
    ] {
        assert_eq!(answer(&test_engine(Config::default()), req), None, "{req}");
    }
    // `"id": null` is a request, not a notification.
    let r = demo_answer(r#"{"jsonrpc":"2.0","method":"ping","id":null}"#).unwrap();
    assert_eq!(result_of(&r), (&Value::Null, &json!("pong")));
}

#[test]
fn mistake_3_never_result_and_error() {
    // Every reply path goes through `response`, which asserts exactly one of the two;
    // here the paths where a result was already being written when it failed.
    let e = test_engine(Config::default().max_response_bytes(64));
    for req in [
        r#"{"jsonrpc":"2.0","method":"half_then_fail","id":1}"#,
        r#"{"jsonrpc":"2.0","method":"panics","id":1}"#,
        r#"{"jsonrpc":"2.0","method":"big","id":1}"#,
        r#"{"jsonrpc":"2.0","method":"echo","params":["a very long string that will not fit in sixty-four bytes"],"id":1}"#,
    ] {
        let r = answer(&e, req).unwrap();
        response(&r);
        assert!(r.get("error").is_some(), "{req}: {r}");
    }
}

#[test]
fn mistake_4_non_string_method_is_invalid() {
    for m in ["1", "null", "true", "[]", "{}"] {
        let r = demo_answer(&format!(r#"{{"jsonrpc":"2.0","method":{m},"id":1}}"#)).unwrap();
        assert_eq!(error_of(&r), (&json!(1), -32600), "{m}");
    }
}

#[test]
fn mistake_5_params_must_be_array_or_object() {
    for p in [r#""bar""#, "1", "true", "null", "1.5"] {
        let r = demo_answer(&format!(
            r#"{{"jsonrpc":"2.0","method":"echo","params":{p},"id":1}}"#
        ))
        .unwrap();
        assert_eq!(error_of(&r), (&json!(1), -32600), "{p}");
    }
    for p in ["[]", "{}", "[1]", r#"{"a":1}"#] {
        let r = demo_answer(&format!(
            r#"{{"jsonrpc":"2.0","method":"echo","params":{p},"id":1}}"#
        ))
        .unwrap();
        assert_eq!(result_of(&r).1, &serde_json::from_str::<Value>(p).unwrap());
    }
}

#[test]
fn mistake_6_named_params_are_case_sensitive() {
    let r = demo_answer(
        r#"{"jsonrpc":"2.0","method":"subtract","params":{"Minuend":42,"subtrahend":23},"id":1}"#,
    )
    .unwrap();
    assert_eq!(error_of(&r), (&json!(1), -32602));
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("minuend"),
        "the message names the missing field: {msg}"
    );
}

#[test]
fn mistake_7_all_notification_batch_is_not_answered_with_empty_array() {
    let r =
        demo_answer(r#"[{"jsonrpc":"2.0","method":"update"},{"jsonrpc":"2.0","method":"nope"}]"#);
    assert_eq!(r, None);
}

#[test]
fn mistake_8_business_errors_keep_their_own_codes() {
    let r = answer(
        &test_engine(Config::default()),
        r#"{"jsonrpc":"2.0","method":"find_user","id":7}"#,
    )
    .unwrap();
    assert_eq!(error_of(&r), (&json!(7), 1001));
    assert_eq!(r["error"]["message"], "User not found");
    assert_eq!(r["error"]["data"], json!({"user": "bob"}));
    // Protocol codes cannot be made into application codes at all.
    assert!(AppCode::try_new(-32603).is_none());
    assert!(AppCode::try_new(-32000).is_none());
}

// ---- Ids ----

#[test]
fn ids_echo_with_same_type_and_value() {
    for id in [
        r#""1""#,
        "1",
        "0",
        "-1",
        r#""esc\"aped\\ \u00e9 \n""#,
        "18446744073709551615",
        "-9223372036854775808",
        "9223372036854775807",
        "1.5",
        "-0.25",
        "null",
        r#""""#,
        // Beyond u64: a float, as serde_json reads it too.
        "18446744073709551616",
        "-92233720368547758080",
    ] {
        let r = demo_answer(&format!(r#"{{"jsonrpc":"2.0","method":"ping","id":{id}}}"#)).unwrap();
        let want: Value = serde_json::from_str(id).unwrap();
        assert_eq!(result_of(&r).0, &want, "{id}");
    }
    let r = demo_answer(r#"{"jsonrpc":"2.0","method":"ping","id":"1"}"#).unwrap();
    assert!(r["id"].is_string(), "\"1\" is not 1");
}

#[test]
fn invalid_ids_are_invalid_requests() {
    for id in ["true", "[1]", r#"{"a":1}"#] {
        let r = demo_answer(&format!(r#"{{"jsonrpc":"2.0","method":"ping","id":{id}}}"#)).unwrap();
        assert_eq!(error_of(&r), (&Value::Null, -32600), "{id}");
    }
}

// ---- Methods, params and errors ----

#[test]
fn reserved_rpc_names_are_not_found() {
    let r = demo_answer(r#"{"jsonrpc":"2.0","method":"rpc.discover","id":1}"#).unwrap();
    assert_eq!(error_of(&r), (&json!(1), -32601));
}

#[test]
fn bad_params_name_the_problem() {
    for (params, needle) in [
        (r#"["a", 1]"#, "invalid type: string \"a\""),
        ("[1]", "invalid length 1"),
        (
            "[1, 2, 3]",
            "invalid length 3, expected fewer elements in array",
        ),
        (r#"{"minuend": 1}"#, "missing field `subtrahend`"),
        ("[9223372036854775807, -1]", "overflows"),
    ] {
        let r = demo_answer(&format!(
            r#"{{"jsonrpc":"2.0","method":"subtract","params":{params},"id":1}}"#
        ))
        .unwrap();
        assert_eq!(error_of(&r).1, -32602, "{params}");
        let msg = r["error"]["message"].as_str().unwrap();
        assert!(
            msg.starts_with("Invalid params") && msg.contains(needle),
            "{params}: {msg}"
        );
    }
    let r = demo_answer(r#"{"jsonrpc":"2.0","method":"subtract","id":1}"#).unwrap();
    assert_eq!(error_of(&r).1, -32602);
}

#[test]
fn demo_methods() {
    let cases = [
        (r#""method":"sum","params":[1,2,4]"#, json!(7)),
        (r#""method":"add","params":[2,3]"#, json!(5)),
        (r#""method":"get_data""#, json!(["hello", 5])),
        (r#""method":"ping""#, json!("pong")),
        (
            r#""method":"echo","params":{"a":[1,2.5,"x\"y",null,true,{}]}"#,
            json!({"a":[1,2.5,"x\"y",null,true,{}]}),
        ),
        (r#""method":"sleep","params":{"ms":1}"#, Value::Null),
        (r#""method":"update","params":[1]"#, Value::Null),
    ];
    for (body, want) in cases {
        let r = demo_answer(&format!(r#"{{"jsonrpc":"2.0",{body},"id":1}}"#)).unwrap();
        assert_eq!(result_of(&r).1, &want, "{body}");
    }
    let r =
        demo_answer(r#"{"jsonrpc":"2.0","method":"sleep","params":{"ms":60001},"id":1}"#).unwrap();
    assert_eq!(error_of(&r).1, -32602);
}

#[test]
fn borrowed_params_point_into_the_frame() {
    let mut b = Registry::builder();
    b.method("greet", |p: Params<'_>| -> Result<String, RpcError> {
        let (name,): (&str,) = p.parse()?;
        Ok(format!("hello {name}"))
    })
    .unwrap();
    let e = Engine::new(b.freeze(), Config::default());
    let r = answer(
        &e,
        r#"{"jsonrpc":"2.0","method":"greet","params":["w\u00f6rld"],"id":1}"#,
    )
    .unwrap();
    assert_eq!(result_of(&r).1, "hello wörld");
}

#[test]
fn handler_panic_is_internal_error_for_that_call_only() {
    let e = test_engine(Config::default());
    let r = answer(
        &e,
        r#"[{"jsonrpc":"2.0","method":"panics","id":1},{"jsonrpc":"2.0","method":"ok","id":2}]"#,
    )
    .unwrap();
    let (map, _) = by_id(&r);
    assert_eq!(error_of(&map["1"]).1, -32603);
    assert_eq!(result_of(&map["2"]).1, &json!("ok"));
    // The engine is fine afterwards.
    let r = answer(&e, r#"{"jsonrpc":"2.0","method":"ok","id":3}"#).unwrap();
    assert_eq!(result_of(&r).1, &json!("ok"));
}

// ---- Limits ----

#[test]
fn oversized_request_is_invalid_request_naming_the_limit() {
    let e = demo::engine(Config::default().max_request_bytes(64));
    let big = format!(
        r#"{{"jsonrpc":"2.0","method":"echo","params":["{}"],"id":1}}"#,
        "x".repeat(64)
    );
    let r = answer(&e, &big).unwrap();
    assert_eq!(error_of(&r), (&Value::Null, -32600));
    assert!(r["error"]["message"].as_str().unwrap().contains("64"));
}

#[test]
fn depth_limit_is_enforced_and_named() {
    let e = demo::engine(Config::default().max_depth(8));
    let nest = |d: usize| {
        format!(
            r#"{{"jsonrpc":"2.0","method":"echo","params":{}{},"id":1}}"#,
            "[".repeat(d),
            "]".repeat(d)
        )
    };
    // The request object is one level; params nesting adds the rest.
    let r = answer(&e, &nest(7)).unwrap();
    assert!(r.get("result").is_some(), "{r}");
    let r = answer(&e, &nest(8)).unwrap();
    assert_eq!(error_of(&r), (&Value::Null, -32700));
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_depth (8"),
        "{r}"
    );
    // Far past it: no stack exhaustion.
    let r = answer(&e, &"[".repeat(100_000)).unwrap();
    assert_eq!(error_of(&r).1, -32700);
}

#[test]
fn batch_length_limit_is_enforced_and_named() {
    let e = demo::engine(Config::default().max_batch_len(3));
    let call = r#"{"jsonrpc":"2.0","method":"ping","id":1}"#;
    let r = answer(&e, &format!("[{call},{call},{call}]")).unwrap();
    assert_eq!(r.as_array().map(Vec::len), Some(3));
    let r = answer(&e, &format!("[{call},{call},{call},{call}]")).unwrap();
    assert_eq!(error_of(&r), (&Value::Null, -32600));
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_batch_len (3)"),
        "{r}"
    );
}

#[test]
fn oversized_response_is_a_server_error() {
    let e = demo::engine(Config::default().max_response_bytes(100));
    let big = format!(
        r#"{{"jsonrpc":"2.0","method":"echo","params":["{}"],"id":1}}"#,
        "x".repeat(200)
    );
    let r = answer(&e, &big).unwrap();
    let (id, code) = error_of(&r);
    assert_eq!((id, code), (&json!(1), -32002));
    assert!(r["error"]["message"].as_str().unwrap().contains("100"));
    // In a batch, the element that does not fit is replaced; the others stand.
    let e = demo::engine(Config::default().max_response_bytes(200));
    let batch = format!(
        r#"[{{"jsonrpc":"2.0","method":"ping","id":1}},{{"jsonrpc":"2.0","method":"echo","params":["{}"],"id":2}}]"#,
        "y".repeat(300)
    );
    let r = answer(&e, &batch).unwrap();
    let (map, _) = by_id(&r);
    assert_eq!(result_of(&map["1"]).1, &json!("pong"));
    assert_eq!(error_of(&map["2"]).1, -32002);
}

#[test]
fn line_stream_answers_in_order_and_skips_blank_lines() {
    let e = demo::engine(Config::default().max_request_bytes(100));
    let (mut dec, mut scratch, mut out) = (e.decoder(), e.scratch(), Vec::new());
    let input = format!(
        "{}\r\n\r\n  \n{}\n{}\n{{\"jsonrpc\":\"2.0\",\"method\":\"update\"}}\nnot json\n",
        r#"{"jsonrpc":"2.0","method":"ping","id":1}"#,
        format_args!(
            r#"{{"jsonrpc":"2.0","method":"echo","params":["{}"],"id":2}}"#,
            "z".repeat(200)
        ),
        r#"{"jsonrpc":"2.0","method":"ping","id":3}"#,
    );
    let mut buf = bytes::BytesMut::from(input.as_bytes());
    let n = e.handle_lines(&mut buf, &mut dec, &mut scratch, &mut out);
    assert_eq!(n, 4);
    let lines: Vec<Value> = out
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    assert_eq!(result_of(&lines[0]), (&json!(1), &json!("pong")));
    assert_eq!(error_of(&lines[1]), (&Value::Null, -32600));
    assert_eq!(result_of(&lines[2]), (&json!(3), &json!("pong")));
    assert_eq!(error_of(&lines[3]), (&Value::Null, -32700));
}

/// The demo methods plus handlers that misbehave on purpose.
fn test_engine(config: Config) -> Engine {
    const USER_NOT_FOUND: AppCode = AppCode::new(1001);
    let mut b = demo::builder();
    b.method("panics", |_p: Params<'_>| -> Result<(), RpcError> {
        panic!("boom")
    })
    .unwrap()
    .method("ok", |_p: Params<'_>| Ok("ok"))
    .unwrap()
    .method("find_user", |_p: Params<'_>| -> Result<(), RpcError> {
        Err(RpcError::application(USER_NOT_FOUND, "User not found")
            .with_data(&json!({"user": "bob"})))
    })
    .unwrap()
    .method("big", |_p: Params<'_>| Ok(vec![7u8; 1000]))
    .unwrap()
    .raw_method("half_then_fail", |_p, out| {
        out.write_str("partial")?;
        Err(RpcError::invalid_params("failed after writing"))
    })
    .unwrap();
    Engine::new(b.freeze(), config)
}
