//! The conformance cases: the specification's section 7 examples, the protocol rules
//! (ids, notifications, batches, invalid requests, params, parse errors, response
//! shape), the JSONTestSuite parsing corpus and robustness. docs/CONFORMANCE.md lists
//! them with the rule each one enforces.
//!
//! Calls use the specification's own method names (`subtract`, `sum`, `update`,
//! `notify_hello`, `get_data`); a server answering -32601 to one a case needs skips the
//! case.

use std::path::Path;

use serde_json::{json, Value};

use crate::check::{Expect, IdWant, Is, Want};
use crate::wire::Kind;

/// A robustness case: how the request is sent, not what it holds.
#[derive(Clone, Copy, Debug)]
pub enum Robust {
    /// One request written one byte at a time, 1 ms apart.
    ByteByByte,
    /// Many requests in one write (streams), or several HTTP requests in one write
    /// (HTTP/1.1 pipelining).
    Pipelined,
    /// A 2 MiB request.
    Oversized,
    /// One request trickled in ten pieces over about a second.
    SlowSender,
    /// Two HTTP requests one after the other on one connection.
    KeepAlive,
    /// A line ended by `\r\n` (NDJSON allows a carriage return before the newline).
    CrLf,
}

/// What a case sends.
#[derive(Clone, Debug)]
pub enum Body {
    /// One frame, answered as `Expect` says.
    Exchange { frame: Vec<u8>, expect: Expect },
    /// A JSONTestSuite file (its category is the name's first letter after `corpus.`).
    Corpus(Vec<u8>),
    /// A robustness case.
    Robust(Robust),
}

/// One case.
#[derive(Clone, Debug)]
pub struct Case {
    /// `family.name`.
    pub name: String,
    /// What it checks.
    pub what: String,
    /// The rule it enforces: a sentence of the specification (§ its section), or
    /// docs/PROTOCOL.md's.
    pub rule: &'static str,
    /// What it sends.
    pub body: Body,
}

impl Case {
    /// The family: the name up to its first dot.
    pub fn family(&self) -> &str {
        self.name.split('.').next().unwrap_or("")
    }

    /// Whether the case applies to a transport.
    pub fn applies(&self, kind: Kind) -> bool {
        match self.body {
            Body::Robust(Robust::KeepAlive) => kind == Kind::Http,
            Body::Robust(Robust::CrLf) => kind.ndjson(),
            _ => true,
        }
    }
}

// The specification's sentences the cases cite.
const ID_SAME: &str = "§5 id: \"It MUST be the same as the value of the id member in the Request Object.\" §4: \"The Server MUST reply with the same value in the Response object if included.\"";
const ID_TYPES: &str = "§4 id: \"MUST contain a String, Number, or NULL value if included\"";
const ID_NULL_ERR: &str = "§5 id: \"If there was an error in detecting the id in the Request object (e.g. Parse error/Invalid Request), it MUST be Null.\"";
const NOTIFY: &str = "§4.1: \"The Server MUST NOT reply to a Notification, including those that are within a batch request.\"";
const BATCH: &str = "§6: \"The Server should respond with an Array containing the corresponding Response objects […] A Response object SHOULD exist for each Request object, except that there SHOULD NOT be any Response objects for notifications.\"";
const BATCH_SINGLE: &str = "§6: \"If the batch rpc call itself fails to be recognized as an valid JSON or as an Array with at least one value, the response from the Server MUST be a single Response object.\"";
const BATCH_NOTHING: &str = "§6: \"If there are no Response objects contained within the response array as it is to be sent to the client, the server MUST NOT return an empty Array and should return nothing at all.\"";
const BATCH_ORDER: &str = "§6: \"The Response objects being returned from a batch call MAY be returned in any order within the Array.\"";
const JSONRPC: &str = "§4 jsonrpc: \"A String specifying the version of the JSON-RPC protocol. MUST be exactly \\\"2.0\\\".\"; §5.1 -32600: \"The JSON sent is not a valid Request object.\"";
const METHOD: &str =
    "§4 method: \"A String containing the name of the method to be invoked.\"; §5.1 -32600";
const PARAMS: &str = "§4.2: \"If present, parameters for the rpc call MUST be provided as a Structured value.\"; §5.1 -32600";
const NOT_FOUND: &str =
    "§5.1 -32601 Method not found: \"The method does not exist / is not available.\"";
const INVALID_PARAMS: &str = "§5.1 -32602 Invalid params: \"Invalid method parameter(s).\"";
const PARSE: &str =
    "§5.1 -32700 Parse error: \"Invalid JSON was received by the server.\"; §5 id MUST be Null";
const SHAPE: &str = "§5: \"Either the result member or error member MUST be included, but both members MUST NOT be included.\"; jsonrpc \"MUST be exactly \\\"2.0\\\"\"; id \"is REQUIRED\"; §5.1 code \"MUST be an integer\", message \"A String\"";
const SEC7: &str = "§7 Examples";
const CORPUS: &str = "RFC 8259 via JSONTestSuite: n_ files are not JSON (§5.1 -32700, id Null); y_ files are JSON but not Request objects (-32600); i_ files either; the server survives every file";
const ROBUST: &str = "docs/PROTOCOL.md Framing: one JSON text per line; a request is whole when its line (or HTTP body, WebSocket message) is";

fn call(method: &str, params: &str, id: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","method":"{method}","params":{params},"id":{id}}}"#)
}

fn result(id: &str, v: Value, needs: &'static str) -> Want {
    Want {
        id: IdWant::Is(id.into()),
        is: Is::Result(v),
        needs: Some(needs),
    }
}

fn error(id: IdWant, code: i64) -> Want {
    Want {
        id,
        is: Is::Error(code),
        needs: None,
    }
}

fn exchange(name: &str, what: &str, rule: &'static str, frame: &str, expect: Expect) -> Case {
    exchange_bytes(name, what, rule, frame.as_bytes().to_vec(), expect)
}

fn exchange_bytes(
    name: &str,
    what: &str,
    rule: &'static str,
    frame: Vec<u8>,
    expect: Expect,
) -> Case {
    Case {
        name: name.into(),
        what: what.into(),
        rule,
        body: Body::Exchange { frame, expect },
    }
}

/// Every case but the corpus's.
pub fn all() -> Vec<Case> {
    let mut v = Vec::new();
    spec(&mut v);
    ids(&mut v);
    notifications(&mut v);
    batches(&mut v);
    requests(&mut v);
    shape(&mut v);
    robust(&mut v);
    v
}

/// Section 7, every example, with the specification's own bytes.
fn spec(v: &mut Vec<Case>) {
    let one = |w| Expect::One(w);
    v.push(exchange(
        "spec.positional-1",
        "subtract [42, 23] → 19, id 1",
        SEC7,
        r#"{"jsonrpc": "2.0", "method": "subtract", "params": [42, 23], "id": 1}"#,
        one(result("1", json!(19), "subtract")),
    ));
    v.push(exchange(
        "spec.positional-2",
        "subtract [23, 42] → -19, id 2",
        SEC7,
        r#"{"jsonrpc": "2.0", "method": "subtract", "params": [23, 42], "id": 2}"#,
        one(result("2", json!(-19), "subtract")),
    ));
    v.push(exchange(
        "spec.named-1",
        "subtract {subtrahend: 23, minuend: 42} → 19, id 3",
        SEC7,
        r#"{"jsonrpc": "2.0", "method": "subtract", "params": {"subtrahend": 23, "minuend": 42}, "id": 3}"#,
        one(result("3", json!(19), "subtract")),
    ));
    v.push(exchange(
        "spec.named-2",
        "subtract {minuend: 42, subtrahend: 23} → 19, id 4",
        SEC7,
        r#"{"jsonrpc": "2.0", "method": "subtract", "params": {"minuend": 42, "subtrahend": 23}, "id": 4}"#,
        one(result("4", json!(19), "subtract")),
    ));
    v.push(exchange(
        "spec.notification-update",
        "the notification update [1,2,3,4,5] is not answered",
        SEC7,
        r#"{"jsonrpc": "2.0", "method": "update", "params": [1,2,3,4,5]}"#,
        Expect::Nothing,
    ));
    v.push(exchange(
        "spec.notification-foobar",
        "the notification foobar (no such method) is not answered",
        SEC7,
        r#"{"jsonrpc": "2.0", "method": "foobar"}"#,
        Expect::Nothing,
    ));
    v.push(exchange(
        "spec.method-not-found",
        "foobar with id \"1\" → -32601, id \"1\"",
        SEC7,
        r#"{"jsonrpc": "2.0", "method": "foobar", "id": "1"}"#,
        one(error(IdWant::Is(r#""1""#.into()), -32601)),
    ));
    v.push(exchange(
        "spec.invalid-json",
        "invalid JSON → -32700, id null",
        SEC7,
        r#"{"jsonrpc": "2.0", "method": "foobar, "params": "bar", "baz]"#,
        one(error(IdWant::Null, -32700)),
    ));
    v.push(exchange(
        "spec.invalid-request",
        "a request whose method is 1 and params \"bar\" → -32600, id null",
        SEC7,
        r#"{"jsonrpc": "2.0", "method": 1, "params": "bar"}"#,
        one(error(IdWant::Null, -32600)),
    ));
    v.push(exchange(
        "spec.batch-invalid-json",
        "a batch that is not valid JSON → one -32700 object (not an array), id null",
        SEC7,
        "[\n  {\"jsonrpc\": \"2.0\", \"method\": \"sum\", \"params\": [1,2,4], \"id\": \"1\"},\n  {\"jsonrpc\": \"2.0\", \"method\"\n]",
        one(error(IdWant::Null, -32700)),
    ));
    v.push(exchange(
        "spec.empty-array",
        "[] → one -32600 object (not an array), id null",
        BATCH_SINGLE,
        "[]",
        one(error(IdWant::Null, -32600)),
    ));
    v.push(exchange(
        "spec.invalid-batch-one",
        "[1] → an array of one -32600, id null",
        SEC7,
        "[1]",
        Expect::Batch(vec![error(IdWant::Null, -32600)]),
    ));
    v.push(exchange(
        "spec.invalid-batch",
        "[1,2,3] → an array of three -32600, id null",
        SEC7,
        "[1,2,3]",
        Expect::Batch(vec![error(IdWant::Null, -32600); 3]),
    ));
    v.push(exchange(
        "spec.batch",
        "the mixed batch: sum → 7, subtract → 19, {\"foo\": \"boo\"} → -32600, foo.get → -32601, get_data → [\"hello\", 5]; the notification not answered",
        SEC7,
        r#"[
        {"jsonrpc": "2.0", "method": "sum", "params": [1,2,4], "id": "1"},
        {"jsonrpc": "2.0", "method": "notify_hello", "params": [7]},
        {"jsonrpc": "2.0", "method": "subtract", "params": [42,23], "id": "2"},
        {"foo": "boo"},
        {"jsonrpc": "2.0", "method": "foo.get", "params": {"name": "myself"}, "id": "5"},
        {"jsonrpc": "2.0", "method": "get_data",  "id": "9"}
    ]"#,
        Expect::Batch(vec![
            result(r#""1""#, json!(7), "sum"),
            result(r#""2""#, json!(19), "subtract"),
            error(IdWant::Null, -32600),
            error(IdWant::Is(r#""5""#.into()), -32601),
            result(r#""9""#, json!(["hello", 5]), "get_data"),
        ]),
    ));
    v.push(exchange(
        "spec.batch-all-notifications",
        "a batch of notifications (notify_sum, notify_hello) → nothing at all",
        SEC7,
        r#"[
        {"jsonrpc": "2.0", "method": "notify_sum", "params": [1,2,4]},
        {"jsonrpc": "2.0", "method": "notify_hello", "params": [7]}
    ]"#,
        Expect::Nothing,
    ));
}

/// Ids of every kind, echoed as the same JSON value (see `check::same_id`).
fn ids(v: &mut Vec<Case>) {
    let kinds: &[(&str, &str, &str)] = &[
        ("string", r#""abc""#, "a plain string"),
        (
            "string-numeric",
            r#""1""#,
            "the string \"1\" stays a string",
        ),
        ("string-empty", r#""""#, "the empty string"),
        (
            "string-escapes",
            r#""q\" b\\ s\/ \b\f\n\r\t""#,
            "a string with every short escape",
        ),
        (
            "string-control",
            r#""nul\u0000 unit\u001f del""#,
            "a string holding U+0000 and U+001F (escaped)",
        ),
        (
            "string-unicode",
            "\"é 日本 😀\"",
            "a string of raw UTF-8 (2, 3 and 4-byte sequences)",
        ),
        (
            "string-unicode-escaped",
            r#""\u00e9 \u65e5\u672c \ud83d\ude00""#,
            "the same string with \\u escapes and a surrogate pair (the same value)",
        ),
        ("zero", "0", "0"),
        ("negative", "-1", "-1"),
        (
            "int-2p53-plus-1",
            "9007199254740993",
            "2^53 + 1: exactly (a double cannot hold it)",
        ),
        (
            "int-neg-2p53-minus-1",
            "-9007199254740993",
            "-(2^53 + 1), exactly",
        ),
        ("int-i64-min", "-9223372036854775808", "i64::MIN, exactly"),
        ("int-u64-max", "18446744073709551615", "u64::MAX, exactly"),
        (
            "int-beyond-u64",
            "18446744073709551617",
            "2^64 + 1: exactly, or as the nearest double (beyond 64 bits)",
        ),
        ("fraction", "1.5", "1.5 (§4: SHOULD NOT, but a Number)"),
        ("fraction-negative", "-0.25", "-0.25"),
        ("exponent", "1e3", "1e3, the same value as 1000"),
        ("exponent-signed", "2.5E+2", "2.5E+2, the same value as 250"),
        (
            "exponent-negative",
            "125e-3",
            "125e-3, the same value as 0.125",
        ),
        ("negative-zero", "-0", "-0, the same value as 0"),
    ];
    for (name, id, what) in kinds {
        v.push(exchange(
            &format!("id.{name}"),
            &format!("id {what}: echoed as the same JSON value"),
            ID_SAME,
            &call("subtract", "[42,23]", id),
            Expect::One(Want {
                id: IdWant::Is((*id).into()),
                is: Is::Answered,
                needs: None,
            }),
        ));
    }
    v.push(exchange(
        "id.null",
        "\"id\": null is a request, not a notification: answered, id null",
        "§4 id: \"MUST contain a String, Number, or NULL value if included. If it is not included it is assumed to be a notification.\"",
        &call("subtract", "[42,23]", "null"),
        Expect::One(Want {
            id: IdWant::Null,
            is: Is::Answered,
            needs: None,
        }),
    ));
    for (name, id) in [("bool", "true"), ("array", "[1]"), ("object", r#"{"a":1}"#)] {
        v.push(exchange(
            &format!("id.invalid-{name}"),
            &format!("id {id} (not a string, number or null) → -32600, id null"),
            ID_TYPES,
            &call("subtract", "[42,23]", id),
            Expect::One(error(IdWant::Null, -32600)),
        ));
    }
}

fn notifications(v: &mut Vec<Case>) {
    v.push(exchange(
        "notify.call-method",
        "subtract [42,23] sent as a notification (no id) runs unanswered",
        NOTIFY,
        r#"{"jsonrpc":"2.0","method":"subtract","params":[42,23]}"#,
        Expect::Nothing,
    ));
    v.push(exchange(
        "notify.invalid-params",
        "subtract [\"a\"] as a notification: its -32602 is not sent",
        NOTIFY,
        r#"{"jsonrpc":"2.0","method":"subtract","params":["a"]}"#,
        Expect::Nothing,
    ));
    v.push(exchange(
        "notify.no-params",
        "notify_hello without params, as a notification",
        NOTIFY,
        r#"{"jsonrpc":"2.0","method":"notify_hello"}"#,
        Expect::Nothing,
    ));
    v.push(exchange(
        "notify.in-batch",
        "[notify_hello, subtract id 1] → an array holding subtract's answer only",
        NOTIFY,
        r#"[{"jsonrpc":"2.0","method":"notify_hello","params":[7]},{"jsonrpc":"2.0","method":"subtract","params":[42,23],"id":1}]"#,
        Expect::Batch(vec![result("1", json!(19), "subtract")]),
    ));
    v.push(exchange(
        "notify.batch-unknown-methods",
        "a batch of notifications of unknown methods → nothing at all (not [])",
        BATCH_NOTHING,
        r#"[{"jsonrpc":"2.0","method":"foobar"},{"jsonrpc":"2.0","method":"foobaz","params":[1]}]"#,
        Expect::Nothing,
    ));
}

fn batches(v: &mut Vec<Case>) {
    v.push(exchange(
        "batch.one-call",
        "[subtract id 1] → an array of one response, not a bare object",
        BATCH,
        &format!("[{}]", call("subtract", "[42,23]", "1")),
        Expect::Batch(vec![result("1", json!(19), "subtract")]),
    ));
    v.push(exchange(
        "batch.bad-element-others-stand",
        "[subtract id 1, {method: 1, id: 2}, subtract id 3] → 19, -32600 (id 2 or null), 19: one invalid element does not fail the others",
        BATCH,
        &format!(
            r#"[{},{{"jsonrpc":"2.0","method":1,"id":2}},{}]"#,
            call("subtract", "[42,23]", "1"),
            call("subtract", "[23,42]", "3")
        ),
        Expect::Batch(vec![
            result("1", json!(19), "subtract"),
            error(IdWant::IsOrNull("2".into()), -32600),
            result("3", json!(-19), "subtract"),
        ]),
    ));
    v.push(exchange(
        "batch.bad-version-element",
        "[subtract id 1, {jsonrpc: \"1.0\", id: 2}] → 19 and -32600 (id 2 or null)",
        BATCH,
        &format!(
            r#"[{},{{"jsonrpc":"1.0","method":"subtract","params":[42,23],"id":2}}]"#,
            call("subtract", "[42,23]", "1")
        ),
        Expect::Batch(vec![
            result("1", json!(19), "subtract"),
            error(IdWant::IsOrNull("2".into()), -32600),
        ]),
    ));
    v.push(exchange(
        "batch.nested",
        "[[subtract]] → an array of one -32600, id null (an array is not a Request object)",
        BATCH,
        &format!("[[{}]]", call("subtract", "[42,23]", "1")),
        Expect::Batch(vec![error(IdWant::Null, -32600)]),
    ));
    let calls: Vec<String> = (0..100)
        .map(|i| call("subtract", &format!("[{},{i}]", 100 + i), &i.to_string()))
        .collect();
    v.push(exchange(
        "batch.hundred",
        "100 subtract calls (ids 0…99) → 100 responses, each 100 for its id",
        BATCH_ORDER,
        &format!("[{}]", calls.join(",")),
        Expect::Batch(
            (0..100)
                .map(|i| result(&i.to_string(), json!(100), "subtract"))
                .collect(),
        ),
    ));
}

fn requests(v: &mut Vec<Case>) {
    let invalid = |v: &mut Vec<Case>, name: &str, what: &str, rule, frame: &str, id: IdWant| {
        v.push(exchange(
            &format!("request.{name}"),
            &format!("{what} → -32600, {id}"),
            rule,
            frame,
            Expect::One(error(id, -32600)),
        ));
    };
    let id1 = || IdWant::IsOrNull("1".into());
    invalid(
        v,
        "jsonrpc-missing",
        "no \"jsonrpc\" member",
        JSONRPC,
        r#"{"method":"subtract","params":[42,23],"id":1}"#,
        id1(),
    );
    invalid(
        v,
        "jsonrpc-1.0",
        "\"jsonrpc\": \"1.0\"",
        JSONRPC,
        r#"{"jsonrpc":"1.0","method":"subtract","params":[42,23],"id":1}"#,
        id1(),
    );
    invalid(
        v,
        "jsonrpc-number",
        "\"jsonrpc\": 2.0 (a number)",
        JSONRPC,
        r#"{"jsonrpc":2.0,"method":"subtract","params":[42,23],"id":1}"#,
        id1(),
    );
    invalid(
        v,
        "jsonrpc-missing-no-id",
        "no \"jsonrpc\" and no id (invalid, so answered: it cannot be known to be a notification)",
        JSONRPC,
        r#"{"method":"update","params":[1]}"#,
        IdWant::Null,
    );
    invalid(
        v,
        "method-missing",
        "no \"method\" member",
        METHOD,
        r#"{"jsonrpc":"2.0","params":[42,23],"id":1}"#,
        id1(),
    );
    for (name, m) in [
        ("number", "1"),
        ("null", "null"),
        ("array", "[\"subtract\"]"),
        ("object", "{}"),
    ] {
        invalid(
            v,
            &format!("method-{name}"),
            &format!("\"method\": {m}"),
            METHOD,
            &format!(r#"{{"jsonrpc":"2.0","method":{m},"params":[42,23],"id":1}}"#),
            id1(),
        );
    }
    for (name, p) in [
        ("string", r#""bar""#),
        ("number", "42"),
        ("bool", "true"),
        ("null", "null"),
    ] {
        invalid(
            v,
            &format!("params-{name}"),
            &format!("\"params\": {p} (neither array nor object)"),
            PARAMS,
            &call("subtract", p, "1"),
            id1(),
        );
    }
    for (name, frame) in [
        ("not-object-number", "1"),
        ("not-object-string", r#""subtract""#),
        ("not-object-null", "null"),
        ("not-object-bool", "true"),
    ] {
        invalid(
            v,
            name,
            &format!("the JSON text {frame} (not a Request object)"),
            "§5.1 -32600: \"The JSON sent is not a valid Request object.\"",
            frame,
            IdWant::Null,
        );
    }
    v.push(exchange(
        "method.not-found",
        "foobar with numeric id 7 → -32601, id 7",
        NOT_FOUND,
        &call("foobar", "[]", "7"),
        Expect::One(error(IdWant::Is("7".into()), -32601)),
    ));
    for (name, params) in [
        ("wrong-type", r#"["a", 1]"#),
        ("too-few", "[42]"),
        ("named-missing", r#"{"minuend": 42}"#),
    ] {
        v.push(exchange(
            &format!("params.{name}"),
            &format!("subtract {params} → -32602, id 1"),
            INVALID_PARAMS,
            &call("subtract", params, "1"),
            Expect::One(Want {
                id: IdWant::Is("1".into()),
                is: Is::Error(-32602),
                needs: Some("subtract"),
            }),
        ));
    }
    let parse = |v: &mut Vec<Case>, name: &str, what: &str, frame: Vec<u8>| {
        v.push(exchange_bytes(
            &format!("parse.{name}"),
            &format!("{what} → -32700, id null"),
            PARSE,
            frame,
            Expect::One(error(IdWant::Null, -32700)),
        ));
    };
    parse(
        v,
        "truncated",
        "a request cut short",
        br#"{"jsonrpc":"2.0","method":"subtract","params":[42,23],"id":1"#.to_vec(),
    );
    parse(
        v,
        "trailing-garbage",
        "a valid request followed by garbage",
        br#"{"jsonrpc":"2.0","method":"subtract","params":[42,23],"id":1} x"#.to_vec(),
    );
    parse(
        v,
        "two-texts",
        "two JSON texts in one frame",
        br#"{"jsonrpc":"2.0","method":"subtract","params":[42,23],"id":1} {"jsonrpc":"2.0","method":"subtract","params":[42,23],"id":2}"#.to_vec(),
    );
    parse(
        v,
        "invalid-utf8",
        "a request with an invalid UTF-8 byte in a string",
        b"{\"jsonrpc\":\"2.0\",\"method\":\"subtract\xff\",\"params\":[42,23],\"id\":1}".to_vec(),
    );
    parse(
        v,
        "single-quotes",
        "single-quoted strings",
        br#"{'jsonrpc':'2.0','method':'subtract','params':[42,23],'id':1}"#.to_vec(),
    );
    parse(
        v,
        "trailing-comma",
        "a trailing comma",
        br#"{"jsonrpc":"2.0","method":"subtract","params":[42,23],"id":1,}"#.to_vec(),
    );
}

fn shape(v: &mut Vec<Case>) {
    v.push(exchange(
        "response.result-shape",
        "a success response: jsonrpc \"2.0\", the id, result and no error",
        SHAPE,
        &call("subtract", "[42,23]", "1"),
        Expect::One(Want {
            id: IdWant::Is("1".into()),
            is: Is::Answered,
            needs: None,
        }),
    ));
    v.push(exchange(
        "response.error-shape",
        "an error response: jsonrpc \"2.0\", the id, error {code: integer, message: string} and no result",
        SHAPE,
        &call("foobar", "[]", "1"),
        Expect::One(error(IdWant::Is("1".into()), -32601)),
    ));
    v.push(exchange(
        "response.error-null-id",
        "a parse error's response has an id member, null (not a missing id)",
        ID_NULL_ERR,
        "{",
        Expect::One(error(IdWant::Null, -32700)),
    ));
}

fn robust(v: &mut Vec<Case>) {
    let r = |name: &str, what: &str, rule, kind| Case {
        name: format!("robust.{name}"),
        what: what.into(),
        rule,
        body: Body::Robust(kind),
    };
    v.push(r(
        "byte-by-byte",
        "a request written one byte per write, 1 ms apart (HTTP: head and body; WebSocket: the frame), answered",
        ROBUST,
        Robust::ByteByByte,
    ));
    v.push(r(
        "pipelined",
        "streams and WebSocket: 20 requests in one write, 20 answers (matched by id); HTTP: 10 POSTs in one write on one keep-alive connection, 10 responses in order (RFC 9112 §9.3.2)",
        ROBUST,
        Robust::Pipelined,
    ));
    v.push(r(
        "oversized",
        "a 2 MiB sum call: answered (0), or refused with an error (JSON-RPC, or HTTP 413), or the connection closed — never a hang or a crash; a stream left open must answer the next line",
        "docs/PROTOCOL.md Limits: larger frames → -32600, discarded unbuffered (no rule in the specification: any bounded, answered refusal passes)",
        Robust::Oversized,
    ));
    v.push(r(
        "slow-sender",
        "a request trickled in 10 pieces 100 ms apart (about 1 s), answered",
        ROBUST,
        Robust::SlowSender,
    ));
    v.push(r(
        "keep-alive",
        "HTTP only: two requests one after the other on one connection, both answered",
        "RFC 9112 §9.3: HTTP/1.1 connections are persistent by default",
        Robust::KeepAlive,
    ));
    v.push(r(
        "crlf",
        "streams only: a request line ended by \\r\\n, answered",
        "NDJSON: a line may end with \\r\\n; docs/PROTOCOL.md Framing: \"\\n or \\r\\n ends a line\"",
        Robust::CrLf,
    ));
}

/// The JSONTestSuite corpus in `dir` as cases, sorted by name.
pub fn corpus(dir: &Path) -> Result<Vec<Case>, String> {
    let mut files = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(stem) = name.strip_suffix(".json") else {
            continue;
        };
        if !matches!(stem.as_bytes().first(), Some(b'n' | b'y' | b'i'))
            || stem.as_bytes().get(1) != Some(&b'_')
        {
            continue;
        }
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        files.push((stem.to_string(), bytes));
    }
    files.sort();
    Ok(files
        .into_iter()
        .map(|(stem, bytes)| {
            let what = match stem.as_bytes()[0] {
                b'n' => "not JSON: one -32700 object, id null; the server answers the next request",
                b'y' => "JSON but no Request: -32600 (one per element for a non-empty array), never -32700; the server answers the next request",
                _ => "either: an error answer (any code); the server answers the next request",
            };
            Case {
                name: format!("corpus.{stem}"),
                what: what.into(),
                rule: CORPUS,
                body: Body::Corpus(bytes),
            }
        })
        .collect())
}
