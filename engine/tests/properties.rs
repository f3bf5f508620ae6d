//! Property tests of the engine's answer to arbitrary input (demo methods, default
//! `Config` unless said otherwise).
//!
//! - Robustness: arbitrary bytes never panic `Engine::handle`, and the reply is nothing
//!   or a well-formed JSON-RPC response object / non-empty array of them.
//! - Acceptance agrees with serde_json: `serde_json::from_slice::<Value>` fails ⇔ the
//!   engine answers `-32700`, up to the divergences documented at [`justify`], each of
//!   which is checked to be exactly what it claims to be.
//! - Numbers: accepted literals are read exactly (64-bit integers) or correctly rounded
//!   (everything else, big integers included), as Rust's `str::parse::<f64>` does.
//! - Framing: a stream fed to `handle_lines` split at arbitrary points gives
//!   byte-identical output to the stream fed whole.
//! - Id echo: a call's id comes back with the same JSON type and value, and `echo`
//!   returns its params unchanged.
//!
//! Case counts are proptest's default (256, or `PROPTEST_CASES`).

mod util;

use std::cell::RefCell;

use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::sample::{select, Index};
use ringrpc::{Config, Outcome};
use serde_json::Value;
use util::{check_reply, error_code, is_parse_error, show, Harness, INVALID_REQUEST};

thread_local! {
    /// One engine and scratch per test thread, reused across cases: reuse of the parse
    /// state is part of what is tested.
    static HARNESS: RefCell<Harness> = RefCell::new(Harness::new(Config::default()));
    /// Same methods, `max_depth` raised above serde_json's recursion limit (128).
    static DEEP: RefCell<Harness> = RefCell::new(Harness::new(Config::default().max_depth(1024)));
    /// The demo methods plus `first_f64`, which reads its first param as an `f64`.
    static FLOATS: RefCell<Harness> = RefCell::new(Harness::with_engine({
        let mut b = ringrpc::demo::builder();
        b.method("first_f64", |p: ringrpc::Params<'_>| {
            let (x,): (f64,) = p.parse()?;
            Ok(x)
        })
        .expect("a new name");
        ringrpc::Engine::new(b.freeze(), Config::default())
    }));
}

fn handle(input: &[u8]) -> (Outcome, Vec<u8>) {
    HARNESS.with(|h| h.borrow_mut().handle(input))
}

/// Runs `input` and checks the reply's shape; returns it parsed (`None`: no reply).
fn answer(input: &[u8]) -> Result<Option<Value>, TestCaseError> {
    let (outcome, out) = handle(input);
    match outcome {
        Outcome::Nothing => {
            prop_assert!(out.is_empty(), "Outcome::Nothing but wrote {}", show(&out));
            Ok(None)
        }
        Outcome::Reply => {
            let v = check_reply(&out)
                .map_err(|e| TestCaseError::fail(format!("input {}: {e}", show(input))))?;
            Ok(Some(v))
        }
    }
}

// ---------------------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------------------

/// Pieces of JSON and JSON-RPC text, plus the awkward cases: escapes, surrogates,
/// non-ASCII, NUL and form feed, and numbers at and beyond the parsers' ranges.
const FRAGMENTS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    "\"",
    ":",
    ",",
    " ",
    "\\",
    "0",
    "1",
    "9",
    "-",
    "+",
    ".",
    "e",
    "E",
    "a",
    "z",
    "n",
    "u",
    "l",
    "t",
    "f",
    "/",
    "null",
    "true",
    "false",
    "\"2.0\"",
    r#""jsonrpc":"2.0""#,
    r#""method":"echo""#,
    r#""method":"ping""#,
    r#""method":"update""#,
    r#""method":"#,
    r#""params":"#,
    r#""params":[1,2]"#,
    r#""params":{}"#,
    r#""id":"#,
    r#""id":1"#,
    r#""id":null"#,
    r#""id":"x""#,
    r#"{"jsonrpc":"2.0","method":"echo","id":1}"#,
    "\\u",
    "\\u00e9",
    "\\ud83d\\ude00",
    "\\ud800",
    "\\udc00",
    "\\u0000",
    "\\n",
    "\\\"",
    "\\/",
    "é",
    "😀",
    "\u{7f}",
    "\u{2028}",
    "\t",
    "\r",
    "\n",
    "\u{c}",
    "\0",
    "\u{feff}",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775808",
    "-9223372036854775809",
    "99999999999999999999999",
    "1e400",
    "-1e400",
    "1e-400",
    "1.7976931348623157e308",
    "1.7976931348623158e308",
    "1.7976931348623159e308",
    "0.5",
    "-0",
    "00",
    "01",
    "1.",
    ".5",
    "1e",
    "0x1",
    "NaN",
    "Infinity",
];

/// Random bytes, 0..512 of them, half uniformly random and half assembled from
/// [`FRAGMENTS`] (with a few random bytes mixed in).
fn random_bytes() -> impl Strategy<Value = Vec<u8>> {
    let fragment = prop_oneof![
        5 => select(FRAGMENTS).prop_map(|s| s.as_bytes().to_vec()),
        1 => any::<u8>().prop_map(|b| vec![b]),
    ];
    let jsonish = vec(fragment, 0..120).prop_map(|parts| {
        let mut bytes = parts.concat();
        bytes.truncate(512);
        bytes
    });
    prop_oneof![vec(any::<u8>(), 0..512), jsonish]
}

/// Strings heavy in characters that need escaping or are multi-byte in UTF-8.
fn json_string() -> impl Strategy<Value = String> {
    let special = vec![
        '"',
        '\\',
        '/',
        '\u{0}',
        '\u{1}',
        '\u{1f}',
        '\n',
        '\r',
        '\t',
        '\u{8}',
        '\u{c}',
        '\u{7f}',
        '\u{80}',
        'é',
        '€',
        '\u{2028}',
        '\u{fffd}',
        '\u{ffff}',
        '😀',
        '\u{10ffff}',
    ];
    let ch = prop_oneof![
        3 => proptest::char::range('a', 'z'),
        2 => select(special),
        1 => any::<char>(),
    ];
    vec(ch, 0..12).prop_map(|chars| chars.into_iter().collect())
}

/// Finite floats: random ones of every class, and the edges.
fn finite_f64() -> impl Strategy<Value = f64> {
    let edges = vec![
        0.0,
        -0.0,
        f64::MAX,
        f64::MIN,
        f64::MIN_POSITIVE,
        5e-324,
        -5e-324,
        0.1,
        1e20,
        1e21,
        9007199254740993.0,
        18446744073709551616.0,
        -9223372036854775809.0,
    ];
    prop_oneof![
        4 => any::<f64>().prop_filter("finite", |f| f.is_finite()),
        1 => select(edges),
    ]
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        finite_f64().prop_map(Value::from),
        json_string().prop_map(Value::String),
    ]
}

/// A JSON value at most 10 levels deep.
fn json_value() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(10, 96, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Value::Array),
            btree_map(json_string(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Params: an array or an object.
fn json_params() -> impl Strategy<Value = Value> {
    prop_oneof![
        vec(json_value(), 0..6).prop_map(Value::Array),
        btree_map(json_string(), json_value(), 0..6)
            .prop_map(|m| Value::Object(m.into_iter().collect())),
    ]
}

/// How a value is written out.
#[derive(Clone, Copy, Debug)]
enum Style {
    Compact,
    Pretty,
    /// Compact, with every non-ASCII character `\u`-escaped (surrogate pairs above the
    /// BMP), so the parser's escape decoding is exercised.
    AsciiEscaped,
}

fn style() -> impl Strategy<Value = Style> {
    prop_oneof![
        Just(Style::Compact),
        Just(Style::Pretty),
        Just(Style::AsciiEscaped)
    ]
}

fn serialize(v: &Value, style: Style) -> Vec<u8> {
    match style {
        Style::Compact => serde_json::to_vec(v).expect("serializes"),
        Style::Pretty => serde_json::to_vec_pretty(v).expect("serializes"),
        Style::AsciiEscaped => {
            // serde_json writes non-ASCII characters only inside strings, raw.
            let mut s = String::new();
            for c in serde_json::to_string(v).expect("serializes").chars() {
                if c.is_ascii() {
                    s.push(c);
                } else {
                    for unit in c.encode_utf16(&mut [0; 2]) {
                        s.push_str(&format!("\\u{unit:04x}"));
                    }
                }
            }
            s.into_bytes()
        }
    }
}

/// Serialized value trees, sometimes with a few bytes inserted, replaced or removed.
fn mutated_json() -> impl Strategy<Value = Vec<u8>> {
    let edit = (
        any::<Index>(),
        0u8..3,
        select(b"{}[]\":,\\ 0-.eu\"x\0\n".to_vec()),
    );
    (json_value(), style(), vec(edit, 0..4)).prop_map(|(v, style, edits)| {
        let mut bytes = serialize(&v, style);
        for (at, op, byte) in edits {
            let i = at.index(bytes.len() + 1);
            match op {
                0 => bytes.insert(i, byte),
                1 if i < bytes.len() => bytes[i] = byte,
                _ if i < bytes.len() => {
                    bytes.remove(i);
                }
                _ => {}
            }
        }
        bytes
    })
}

// ---------------------------------------------------------------------------------------
// Acceptance vs serde_json, and the documented divergences
// ---------------------------------------------------------------------------------------

/// Nesting depth of a value: scalars 0, `[]` 1, `[[]]` 2, …
fn depth(v: &Value) -> usize {
    match v {
        Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        Value::Object(m) => 1 + m.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

fn has_float(v: &Value) -> bool {
    match v {
        Value::Number(n) => n.is_f64(),
        Value::Array(a) => a.iter().any(has_float),
        Value::Object(m) => m.values().any(has_float),
        _ => false,
    }
}

fn message(v: &Value) -> &str {
    v.pointer("/error/message")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The known, precisely delimited disagreements between serde_json and ringrpc (that is,
/// simd-json 0.19 with `big-int-as-float`) on whether bytes are JSON. Returns why the
/// disagreement on `input` is one of them, or `Err` if it is not.
///
/// 1. **Nesting beyond `max_depth`.** ringrpc rejects documents nested deeper than
///    `Config::max_depth` (default 64: `[[…]]` with 64 levels passes, 65 does not) with
///    `-32700 "Parse error: nesting deeper than max_depth (64 levels)"`; serde_json's own
///    recursion limit is 128, which lets through at most 127 levels. Checked: serde_json's
///    value is deeper than 64 and the same input passes an engine with `max_depth(1024)`.
/// 2. **Literals at the edge of `f64`'s range** (serde_json's side). serde_json without
///    its `float_roundtrip` feature does not round correctly there, both ways: it
///    rejects ("number out of range") some literals that round to `f64::MAX` under IEEE
///    round-to-nearest, e.g. `1.7976931348623158e308` or the 309-digit integer
///    `17976931348623158` followed by 292 zeros, and it accepts (as `f64::MAX`) some that
///    round to infinity, e.g. `1.79769313486231581e308`. simd-json agrees with correct
///    rounding (Rust's `str::parse::<f64>`, Python's `float`). Checked: the input has a
///    number token on which serde_json alone errs (accepts it ⇔ `str::parse::<f64>` is
///    infinite), and ringrpc's verdict is the correctly rounded one: it rejects with
///    "invalid or out-of-range number" only if some token is infinite under `str::parse::<f64>`, and
///    accepts only if every token is finite.
///
/// Not a divergence any more: integers beyond `i64`/`u64` (`18446744073709551616`,
/// `-9223372036854775809`, …). Without simd-json's `big-int-as-float` they were
/// `InvalidNumber` (`-32700`) while serde_json reads them as `f64`; with it (commit
/// e5d32a7) both read them as `f64`. [`integers_beyond_64_bits_agree`] pins this.
fn justify(
    input: &[u8],
    serde: &Result<Value, serde_json::Error>,
    reply: &Option<Value>,
) -> Result<&'static str, String> {
    let tokens: Vec<&str> = ringrpc::fuzzing::number_tokens(input)
        .into_iter()
        .map(|r| std::str::from_utf8(&input[r]).unwrap_or(""))
        .collect();
    let finite = |t: &&str| t.parse::<f64>().is_ok_and(f64::is_finite);
    // A token on which serde_json's verdict differs from correct rounding.
    let serde_errs = tokens
        .iter()
        .any(|t| serde_json::from_str::<Value>(t).is_ok() != finite(t));
    match (serde, reply) {
        (Ok(v), Some(r)) => {
            let msg = message(r);
            if msg.contains("out-of-range number") {
                if serde_errs && !tokens.iter().all(finite) {
                    return Ok("serde_json accepts a literal that rounds to infinity");
                }
                return Err(format!("serde_json accepts, ringrpc says {msg:?}"));
            }
            if !msg.contains("max_depth") {
                return Err(format!("serde_json accepts, ringrpc says {msg:?}"));
            }
            if depth(v) <= 64 {
                return Err(format!("depth error for a value only {} deep", depth(v)));
            }
            let (_, out) = DEEP.with(|h| h.borrow_mut().handle(input));
            let deep = check_reply(&out)?;
            if error_code(&deep) == Some(util::PARSE_ERROR) {
                return Err(format!("rejected even with max_depth 1024: {}", show(&out)));
            }
            Ok("depth limit")
        }
        (Err(e), _) => {
            if e.to_string().contains("number out of range")
                && serde_errs
                && tokens.iter().all(finite)
            {
                return Ok("serde_json rejects a literal that rounds to f64::MAX");
            }
            Err(format!("serde_json rejects ({e}), ringrpc accepts"))
        }
        (Ok(_), None) => Err("unreachable: no reply is never a disagreement".into()),
    }
}

/// serde_json rejects ⇔ ringrpc answers exactly one `-32700` object with id null.
fn check_acceptance(input: &[u8]) -> Result<Option<Value>, TestCaseError> {
    let serde = serde_json::from_slice::<Value>(input);
    let reply = answer(input)?;
    if let Some(Value::Array(items)) = &reply {
        // A parse error is never inside a batch reply.
        prop_assert!(
            !items
                .iter()
                .any(|r| error_code(r) == Some(util::PARSE_ERROR)),
            "-32700 inside a batch for {}",
            show(input)
        );
    }
    let rejected = reply.as_ref().is_some_and(is_parse_error);
    if serde.is_err() != rejected {
        if let Err(why) = justify(input, &serde, &reply) {
            return Err(TestCaseError::fail(format!(
                "acceptance differs from serde_json for {}: serde_json {:?}, ringrpc {}: {why}",
                show(input),
                serde.as_ref().map(|_| "accepts").map_err(|e| e.to_string()),
                reply.as_ref().map_or("nothing".into(), Value::to_string),
            )));
        }
    }
    Ok(reply)
}

/// A request object the engine must not answer: `"jsonrpc":"2.0"`, a string method, no
/// id, params absent or structured.
fn is_notification(v: &Value) -> bool {
    let Value::Object(m) = v else { return false };
    m.get("jsonrpc") == Some(&Value::String("2.0".into()))
        && m.get("method").is_some_and(Value::is_string)
        && !m.contains_key("id")
        && m.get("params")
            .is_none_or(|p| p.is_array() || p.is_object())
}

// ---------------------------------------------------------------------------------------
// Stream generators
// ---------------------------------------------------------------------------------------

fn request_line() -> impl Strategy<Value = Value> {
    let method = select(vec![
        "echo",
        "ping",
        "subtract",
        "sum",
        "add",
        "get_data",
        "update",
        "notify_hello",
        "foobar",
        "rpc.x",
    ]);
    let params = prop_oneof![
        Just(None),
        json_params().prop_map(Some),
        vec(-5i64..5, 0..4).prop_map(|v| Some(Value::from(v))),
        Just(Some(Value::from("bad"))),
    ];
    let id = prop_oneof![
        Just(None),
        any::<i64>().prop_map(|i| Some(Value::from(i))),
        json_string().prop_map(|s| Some(Value::from(s))),
        Just(Some(Value::Null)),
    ];
    (method, params, id).prop_map(|(method, params, id)| {
        let mut m = serde_json::Map::new();
        m.insert("jsonrpc".into(), "2.0".into());
        m.insert("method".into(), method.into());
        if let Some(p) = params {
            m.insert("params".into(), p);
        }
        if let Some(id) = id {
            m.insert("id".into(), id);
        }
        Value::Object(m)
    })
}

/// Number-like text: valid and invalid JSON numbers, long mantissas, 64-bit edges,
/// integers beyond 64 bits and beyond `f64`, and literals around `f64::MAX` and the
/// smallest subnormal.
fn number_literal() -> impl Strategy<Value = String> {
    prop_oneof![
        "-?[0-9]{0,25}(\\.[0-9]{0,20})?([eE][+-]?[0-9]{0,4})?",
        "-?[1-9][0-9]{0,18}",
        "-?(1844674407370955161[0-9]|922337203685477580[0-9])",
        "-?[1-9][0-9]{19,40}",
        "-?[1-9][0-9]{295,320}(\\.[0-9]{0,5})?",
        "-?1\\.797693134862315[0-9]{0,8}[eE]\\+?308",
        "-?(2\\.47032822920623|4\\.94065645841246)[0-9]{0,6}e-324",
        "-?[0-9]\\.[0-9]{0,17}e-3[0-4][0-9]",
        "-?[0-9]{1,3}\\.[0-9]{15,40}",
    ]
}

/// One line's content (never containing `\n`).
fn stream_line() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => request_line().prop_map(|v| serialize(&v, Style::Compact)),
        2 => vec(request_line(), 0..4).prop_map(|v| serialize(&Value::Array(v), Style::Compact)),
        2 => random_bytes().prop_map(|mut b| {
            b.truncate(120);
            b.retain(|&c| c != b'\n');
            b
        }),
        1 => select(vec!["", " ", "\t \r", "[]", "{}", "\r"]).prop_map(|s| s.as_bytes().to_vec()),
        1 => (30usize..100).prop_map(|n| vec![b'x'; n]),
    ]
}

/// A newline-delimited stream (`\n` or `\r\n`), possibly ending in a partial line.
fn stream() -> impl Strategy<Value = Vec<u8>> {
    let line = (stream_line(), any::<bool>());
    (vec(line, 0..10), proptest::option::of(stream_line())).prop_map(|(lines, tail)| {
        let mut s = Vec::new();
        for (line, crlf) in lines {
            s.extend_from_slice(&line);
            s.extend_from_slice(if crlf { b"\r\n" } else { b"\n" });
        }
        if let Some(t) = tail {
            s.extend_from_slice(&t);
        }
        s
    })
}

// ---------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------

proptest! {
    /// Any bytes: no panic; no reply, or a well-formed response / non-empty batch reply.
    #[test]
    fn random_bytes_never_panic_and_replies_are_responses(input in random_bytes()) {
        answer(&input)?;
    }

    /// Acceptance agrees with serde_json on random and JSON-ish bytes.
    #[test]
    fn acceptance_agrees_with_serde_json_on_bytes(input in random_bytes()) {
        check_acceptance(&input)?;
    }

    /// Acceptance agrees with serde_json on slightly damaged JSON texts.
    #[test]
    fn acceptance_agrees_with_serde_json_on_mutated_json(input in mutated_json()) {
        check_acceptance(&input)?;
    }

    /// Every serialized JSON value is accepted, and answered like a (non-)request: a
    /// non-empty array gets one answer per element that is not a notification (or
    /// nothing), anything else one answer unless it is a notification.
    #[test]
    fn serialized_values_are_accepted(v in json_value(), style in style()) {
        let input = serialize(&v, style);
        let reply = check_acceptance(&input)?;
        prop_assert!(
            serde_json::from_slice::<Value>(&input).is_ok(),
            "serde_json rejects its own output {}", show(&input)
        );
        let reply = match (&v, reply) {
            (Value::Array(items), reply) if !items.is_empty() => {
                let want = items.iter().filter(|e| !is_notification(e)).count();
                match reply {
                    None => {
                        prop_assert_eq!(want, 0);
                        None
                    }
                    Some(Value::Array(answers)) => {
                        prop_assert_eq!(answers.len(), want, "{}", show(&input));
                        Some(answers)
                    }
                    Some(other) => {
                        return Err(TestCaseError::fail(format!(
                            "batch {} answered with a non-array {other}", show(&input)
                        )))
                    }
                }
            }
            (v, reply) => {
                prop_assert_eq!(reply.is_none(), is_notification(v), "{}", show(&input));
                reply.map(|r| vec![r])
            }
        };
        // Random values are never valid calls: every answer is -32600.
        for r in reply.iter().flatten() {
            prop_assert_eq!(error_code(r), Some(INVALID_REQUEST), "{}", show(&input));
        }
    }

    /// Number literals: acceptance agrees with serde_json (up to the documented
    /// divergences), and an accepted number is echoed as the same value: integers in
    /// `i64`/`u64` exactly, everything else as the correctly rounded `f64` (Rust's
    /// `str::parse::<f64>`), sign of zero included.
    #[test]
    fn number_literals_agree_and_round_correctly(lit in number_literal()) {
        // Acceptance through `ping`, whose reply does not repeat the literal (serde_json
        // could not re-read some correctly rounded ones; see divergence 2).
        let ping = format!(r#"{{"jsonrpc":"2.0","method":"ping","params":[{lit}],"id":1}}"#);
        let Some(reply) = check_acceptance(ping.as_bytes())? else {
            return Err(TestCaseError::fail("no reply to a call"));
        };
        if reply.get("result").is_none() {
            // Rejected (as serde_json does, or a documented divergence).
            prop_assert!(is_parse_error(&reply), "{lit}: {reply}");
            return Ok(());
        }
        let req = format!(r#"{{"jsonrpc":"2.0","method":"echo","params":[{lit}],"id":1}}"#);
        let (_, out) = handle(req.as_bytes());
        let out = String::from_utf8(out).expect("UTF-8 reply");
        let echoed = out
            .strip_prefix(r#"{"jsonrpc":"2.0","id":1,"result":["#)
            .and_then(|r| r.strip_suffix("]}"))
            .unwrap_or_else(|| panic!("unexpected reply {out}"));
        // `echo` returns the params verbatim.
        prop_assert_eq!(echoed, lit.as_str());
        if lit.is_empty() {
            return Ok(());
        }
        // What the parser read: through serde as an f64, written back by serde_json
        // (shortest round-trip form), must be the correctly rounded value.
        let req = format!(r#"{{"jsonrpc":"2.0","method":"first_f64","params":[{lit}],"id":1}}"#);
        let (_, out) = FLOATS.with(|h| h.borrow_mut().handle(req.as_bytes()));
        // Read the result text with Rust's parser: serde_json's own rounding is off at
        // the extremes (see divergence 2).
        let out = String::from_utf8(out).expect("UTF-8 reply");
        let got: f64 = out
            .strip_prefix(r#"{"jsonrpc":"2.0","id":1,"result":"#)
            .and_then(|r| r.strip_suffix('}'))
            .and_then(|r| r.parse().ok())
            .unwrap_or_else(|| panic!("{lit}: {out}"));
        let want: f64 = lit.parse().expect("a JSON number is a Rust float");
        prop_assert!(
            // `-0` is an integer literal and is read as the integer 0 (docs/PROTOCOL.md).
            got.to_bits() == want.to_bits() || (got == 0.0 && want == 0.0),
            "{} read as {}, correctly rounded it is {}", lit, got, want
        );
    }

    /// Nesting: ringrpc accepts exactly up to `max_depth` (64), serde_json up to 127.
    #[test]
    fn nesting_depth_limit(levels in 1usize..200, objects in vec(any::<bool>(), 200), leaf in scalar()) {
        let mut doc = serde_json::to_string(&leaf).expect("serializes");
        for &object in objects.iter().take(levels) {
            doc = if object { format!(r#"{{"k":{doc}}}"#) } else { format!("[{doc}]") };
        }
        let serde_ok = serde_json::from_str::<Value>(&doc).is_ok();
        prop_assert_eq!(serde_ok, levels <= 127);
        let reply = answer(doc.as_bytes())?.expect("a reply");
        if levels <= 64 {
            prop_assert!(!is_parse_error(&reply), "{levels} levels rejected: {reply}");
        } else {
            prop_assert!(is_parse_error(&reply), "{levels} levels accepted: {reply}");
            prop_assert!(message(&reply).contains("max_depth"), "{reply}");
        }
    }

    /// A stream split at arbitrary points gives the same output and leftover as the
    /// stream fed whole, with the default limits and with a small `max_request_bytes`.
    #[test]
    fn split_stream_gives_identical_output(input in stream(), cuts in vec(any::<Index>(), 0..8)) {
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(input.len() + 1)).collect();
        cuts.push(0);
        cuts.push(input.len());
        cuts.sort_unstable();
        cuts.dedup();
        let pieces: Vec<&[u8]> = cuts.windows(2).map(|w| &input[w[0]..w[1]]).collect();
        for config in [Config::default(), Config::default().max_request_bytes(48)] {
            let mut h = Harness::new(config.clone());
            let whole = h.handle_lines_pieces([&input[..]]);
            let split = h.handle_lines_pieces(pieces.iter().copied());
            prop_assert!(
                whole == split,
                "{config:?}, input {}, cuts {cuts:?}:\nwhole  {}\nsplit  {}\nleft whole {} / split {}",
                show(&input), show(&whole.0), show(&split.0), show(&whole.1), show(&split.1)
            );
            for line in whole.0.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
                check_reply(line).map_err(TestCaseError::fail)?;
            }
        }
        // Byte at a time, too.
        let mut h = Harness::new(Config::default());
        let whole = h.handle_lines_pieces([&input[..]]);
        let bytes = h.handle_lines_pieces(input.chunks(1));
        prop_assert!(whole == bytes, "byte at a time differs for {}", show(&input));
    }

    /// The reply's id is the request's id (same type, same value) and `echo` returns
    /// its params.
    #[test]
    fn id_and_params_are_echoed(
        id in prop_oneof![
            json_string().prop_map(Value::String),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            Just(Value::Null),
        ],
        params in json_params(),
        style in style(),
    ) {
        let mut req = serde_json::Map::new();
        req.insert("jsonrpc".into(), "2.0".into());
        req.insert("method".into(), "echo".into());
        req.insert("params".into(), params.clone());
        req.insert("id".into(), id.clone());
        let input = serialize(&Value::Object(req), style);
        let (outcome, out) = handle(&input);
        prop_assert_eq!(outcome, Outcome::Reply);
        let reply = check_reply(&out).map_err(TestCaseError::fail)?;
        let got_id = &reply["id"];
        prop_assert_eq!(got_id, &id, "{}", show(&out));
        prop_assert_eq!(
            (got_id.is_string(), got_id.is_i64(), got_id.is_u64(), got_id.is_f64(), got_id.is_null()),
            (id.is_string(), id.is_i64(), id.is_u64(), id.is_f64(), id.is_null())
        );
        // Compare with serde_json's own reading of the request, so that serde_json's
        // float parsing (not correctly rounded without `float_roundtrip`) is the same
        // on both sides.
        let sent: Value = serde_json::from_slice(&input).expect("valid request");
        prop_assert_eq!(reply.get("result"), sent.get("params"), "{}", show(&out));
        // Written compactly without floats, the reply is exactly the expected bytes
        // (serde_json writes `1e+20` where ringrpc writes `1e20`).
        if matches!(style, Style::Compact) && !has_float(&params) {
            let want = format!(
                r#"{{"jsonrpc":"2.0","id":{},"result":{}}}"#,
                serde_json::to_string(&id).expect("serializes"),
                serde_json::to_string(&params).expect("serializes"),
            );
            prop_assert_eq!(String::from_utf8_lossy(&out), want);
        }
    }
}

// ---------------------------------------------------------------------------------------
// The divergences, pinned with exact inputs
// ---------------------------------------------------------------------------------------

#[test]
fn divergence_depth_limit() {
    let doc = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    for (n, ours) in [(64, true), (65, false), (127, false)] {
        let reply = answer(doc(n).as_bytes()).unwrap().unwrap();
        assert_eq!(!is_parse_error(&reply), ours, "{n} levels: {reply}");
        assert!(serde_json::from_str::<Value>(&doc(n)).is_ok());
    }
    let reply = answer(doc(65).as_bytes()).unwrap().unwrap();
    assert_eq!(
        message(&reply),
        "Parse error: nesting deeper than max_depth (64 levels)"
    );
    // serde_json's recursion limit of 128 admits 127 levels.
    assert!(serde_json::from_str::<Value>(&doc(128)).is_err());
}

/// Integer literals beyond 64 bits are read as `f64` by both (simd-json's
/// `big-int-as-float`), and rejected by both once beyond `f64`'s range.
#[test]
fn integers_beyond_64_bits_agree() {
    let huge = format!("1{}", "0".repeat(309));
    for (text, accepted) in [
        ("18446744073709551615", true),
        ("-9223372036854775808", true),
        ("18446744073709551616", true),
        ("-9223372036854775809", true),
        ("-18446744073709551615", true),
        ("123456789012345678901234567890", true),
        ("[1,99999999999999999999]", true),
        (huge.as_str(), false),
        (&format!("-{huge}"), false),
    ] {
        assert_eq!(
            serde_json::from_str::<Value>(text).is_ok(),
            accepted,
            "{text}"
        );
        let reply = answer(text.as_bytes()).unwrap().unwrap();
        assert_eq!(!is_parse_error(&reply), accepted, "{text}: {reply}");
    }
}

#[test]
fn divergence_serde_json_float_range() {
    // f64::MAX is 1.7976931348623157081…e308; the midpoint to the next (overflowing)
    // value is 1.7976931348623158079…e308, so this literal rounds to f64::MAX.
    let long = format!("17976931348623158{}", "0".repeat(292));
    for text in ["1.7976931348623158e308", &long] {
        assert_eq!(text.parse::<f64>(), Ok(f64::MAX));
        let serde = serde_json::from_str::<Value>(text);
        assert!(
            serde
                .as_ref()
                .is_err_and(|e| e.to_string().contains("out of range")),
            "serde_json now accepts {text} ({serde:?}): drop divergence 2 in `justify`"
        );
        let reply = answer(text.as_bytes()).unwrap().unwrap();
        assert_eq!(error_code(&reply), Some(INVALID_REQUEST), "{reply}");
    }
    // serde_json accepts this one as f64::MAX, but it is above the midpoint between
    // f64::MAX and 2^1024, so it rounds to infinity: ringrpc rejects it.
    let text = "1.79769313486231581e308";
    assert_eq!(text.parse::<f64>(), Ok(f64::INFINITY));
    assert_eq!(
        serde_json::from_str::<f64>(text).ok(),
        Some(f64::MAX),
        "serde_json now rejects {text}: update divergence 2 in `justify`"
    );
    let reply = answer(text.as_bytes()).unwrap().unwrap();
    assert!(is_parse_error(&reply), "{reply}");
    assert!(message(&reply).contains("out-of-range number"), "{reply}");
    // Both reject what clearly overflows.
    let over = format!("17976931348623159{}", "0".repeat(292));
    for text in ["1.7976931348623159e308", "1e400", "-1e400", &over] {
        assert!(serde_json::from_str::<Value>(text).is_err());
        assert!(is_parse_error(&answer(text.as_bytes()).unwrap().unwrap()));
    }
}

/// `id` and `params` echo for the integer edges, escapes and non-BMP characters.
#[test]
fn echo_edge_cases() {
    for (req, want) in [
        (
            r#"{"jsonrpc":"2.0","method":"echo","params":[18446744073709551615,-9223372036854775808],"id":18446744073709551615}"#,
            r#"{"jsonrpc":"2.0","id":18446744073709551615,"result":[18446744073709551615,-9223372036854775808]}"#,
        ),
        (
            r#"{"jsonrpc":"2.0","method":"echo","params":{"a\u0000\ud83d\ude00":"\/\b"},"id":"\u00e9\"\\"}"#,
            // Params verbatim; the id re-encoded from its decoded value.
            r#"{"jsonrpc":"2.0","id":"é\"\\","result":{"a\u0000\ud83d\ude00":"\/\b"}}"#,
        ),
        (
            r#"{"jsonrpc":"2.0","method":"echo","params":[],"id":-1}"#,
            r#"{"jsonrpc":"2.0","id":-1,"result":[]}"#,
        ),
    ] {
        let (outcome, out) = handle(req.as_bytes());
        assert_eq!(outcome, Outcome::Reply);
        assert_eq!(String::from_utf8_lossy(&out), want);
    }
}
